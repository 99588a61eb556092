"""The README's ``~/markers`` picture: what RViz or Foxglove would draw, from markers received over DDS.

Starts the node on the bundled toy policy with ``publish_markers`` on, publishes rendered held-out toy scenes (the
camera), sends one 8-candidate goal per scene, and draws every received ``MarkerArray`` over its scene: candidate
strips in their mode cluster's colour (dropped ones red), the served trajectory thick and white. Nothing is taken
from the result: only the markers' own points, colours and widths are drawn.

    python -m trajectory_ensemble_lab.toy.markers_figure --out docs/images/markers_toy.png
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.toy import HELDOUT_SEED_BASE, make_scene, render

SCENES = (3, 5, 8)
NODE = "/trajectory_ensemble"


def collect(scene_offsets: tuple[int, ...], log_dir: Path) -> list[tuple[np.ndarray, Any]]:
    """``(image, MarkerArray)`` per scene, from a toy node with markers on."""
    from rclpy.action import ActionClient
    from sensor_msgs.msg import Image
    from trajectory_ensemble_msgs.action import GenerateTrajectory
    from visualization_msgs.msg import MarkerArray

    from trajectory_ensemble_node.cli.launcher import NodeProcess, pick_domain_id, ros_env
    from trajectory_ensemble_node.cli.ros_client import DISCOVERY_SETTLE_S, ClientSession

    domain_id = pick_domain_id()
    env = ros_env(domain_id)
    os.environ.update({"ROS_DOMAIN_ID": str(domain_id), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"})
    node = NodeProcess({"model": "toy", "device": "cpu", "publish_markers": True, "marker_frame_id": "world"},
                       env, log_path=log_dir / "markers_figure.node.log")
    node.start(ready_timeout_s=600)
    session = ClientSession("markers_figure")
    received: list[Any] = []
    try:
        camera = session.node.create_publisher(Image, f"{NODE}/observation/image", 10)
        session.node.create_subscription(MarkerArray, f"{NODE}/markers", received.append, 10)
        action = ActionClient(session.node, GenerateTrajectory, f"{NODE}/generate_trajectory")
        assert session.wait_until(action.server_is_ready, 60.0), "no action server"
        assert session.wait_until(lambda: camera.get_subscription_count() > 0, 60.0), "no camera subscriber"
        session.spin_for(DISCOVERY_SETTLE_S)
        out = []
        for i, offset in enumerate(scene_offsets):
            image = render(make_scene(HELDOUT_SEED_BASE + offset))
            stamp = 1000 + i
            msg = Image(height=image.shape[0], width=image.shape[1], encoding="rgb8", step=image.shape[1] * 3,
                        data=image.tobytes())
            msg.header.stamp.sec = stamp
            for _ in range(3):
                camera.publish(msg)
            session.spin_for(0.2)
            goal = GenerateTrajectory.Goal(candidate_count=8, use_seed=True, seed=77 + i)
            goal.min_observation_stamp.sec = stamp
            sent = action.send_goal_async(goal)
            assert session.wait_future(sent, 120.0) and sent.result().accepted
            done = sent.result().get_result_async()
            assert session.wait_future(done, 300.0), "no result"
            count = len(received)
            assert session.wait_until(lambda c=count: any(m.markers[0].header.stamp.sec == stamp
                                                           for m in received[c - 1:] if m.markers), 30.0)
            array = next(m for m in reversed(received) if m.markers and m.markers[0].header.stamp.sec == stamp)
            out.append((image, array))
        return out
    finally:
        session.close()
        node.stop()


def draw(frames: list[tuple[np.ndarray, Any]], path: Path) -> Path:
    """Each scene with its markers drawn as RViz would: strips by colour and width, in the markers' frame."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(frames), figsize=(4.2 * len(frames), 4.6), squeeze=False)
    for ax, (image, array) in zip(axes[0], frames):
        ax.imshow(image, extent=(-1, 1, -1, 1), origin="upper", interpolation="nearest")
        for marker in array.markers:
            if marker.action != marker.ADD or not marker.points:
                continue
            xy = np.array([[p.x, p.y] for p in marker.points])
            color = (marker.color.r, marker.color.g, marker.color.b, marker.color.a)
            ax.plot(xy[:, 0], xy[:, 1], color=color, linewidth=1.2 if marker.scale.x < 0.02 else 3.2,
                    zorder=3 if marker.scale.x >= 0.02 else 2)
        ax.set_xlim(-1, 1)
        ax.set_ylim(-1, 1)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{len(array.markers) - 2} candidates, served in white", fontsize=9)
    fig.suptitle("~/markers as received (visualization_msgs/MarkerArray): candidates by mode cluster", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images/markers_toy.png"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    frames = collect(SCENES, Path("out"))
    print(f"wrote {draw(frames, args.out)} ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
