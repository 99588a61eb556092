"""Running the simulated robot against the node, and what comes of it: the JSON report, the picture, the bench.

:func:`simulate` runs episodes of :class:`.sim_robot.SimRobot` against a running node, or starts one
(:class:`.launcher.NodeProcess`: the toy model, ``use_sim_time: true``). ``make demo`` draws its closed-loop
picture with :func:`plot_closed_loop`; ``trajectory-ensemble bench --closed-loop --ros`` is :func:`run_bench`, which
writes the metric keys of the in-process bench (:func:`..toy.episodes.summarize`) for each execution setting.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..toy import task
from .sim_model import EpisodeRecord, SimSettings, episode_line
from .sim_robot import SimRobot
from .sim_world import SimWorld

PANEL_SWITCHES = ("return_candidates", "hold_for_goals")
""":class:`SimSettings` flags the report names only when true (``make demo``'s PushT panel sets them)."""
BENCH_RTF = 0.1
"""Real-time factor of ``bench --closed-loop --ros`` and the demo: a toy group of N = 8 takes ~2 s of wall time on one
CPU core, i.e. ~0.2 s of sim time, 1-2 control steps at 8 fps: the bench's ``d = 2``."""


def node_params(settings: SimSettings, device: str = "cpu", model: str = "toy") -> dict[str, Any]:
    """The node's parameters for the sim: the toy action settings, sim time, and a staleness limit that holds.

    ``max_observation_age_s`` allows two frame periods of wall time: a node that measures frame age on its wall
    clock (not ROS time) would otherwise refuse every frame at small real-time factors.
    """
    from ..toy import ACTION_SETTINGS

    params: dict[str, Any] = {"model": model, "device": device, **ACTION_SETTINGS, "use_sim_time": True}
    params["max_observation_age_s"] = max(1.0, 2.0 / (settings.image_rate * settings.real_time_factor))
    return params


@contextmanager
def serving_node(settings: SimSettings, log_dir: Path, device: str = "cpu",
                 log: Callable[[str], None] = print) -> Iterator[Any]:
    """Start the node as a child process (domain of :func:`.launcher.pick_domain_id`, also set here for rclpy).

    Yields:
        `NodeProcess`: The started node; it is stopped on exit.
    """
    from ..cli.launcher import NodeProcess, pick_domain_id, ros_env

    domain_id = pick_domain_id()
    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    params = node_params(settings, device)
    log(f"sim: starting the node (ROS_DOMAIN_ID={domain_id}, log {log_dir / 'node.log'})")
    node = NodeProcess(params, ros_env(domain_id), log_path=log_dir / "node.log")
    try:
        node.start(ready_timeout_s=600.0)
        yield node
    finally:
        code = node.stop()
        log(f"sim: node stopped (exit status {code})")


def simulate(scenes: Sequence[Any], settings: SimSettings, *, node: str = "/trajectory_ensemble",
             image_topic: str | None = None, start_node: bool = False, device: str = "cpu", wait_s: float = 60.0,
             log_dir: Path = Path("out/sim"), log: Callable[[str], None] = print,
             world: SimWorld | None = None) -> list[EpisodeRecord]:
    """One episode per scene through the node; returns their records.

    Args:
        scenes (`Sequence[Any]`): Initial scenes (what ``world.reset`` takes: toy scenes, PushT reset seeds).
        settings (`SimSettings`): How the sim drives the node.
        node (`str`): The node's fully qualified name.
        image_topic (`str`, *optional*): Camera topic (default ``<node>/observation/image``).
        start_node (`bool`): Start the node here (:func:`serving_node`) instead of using a running one.
        device (`str`): With ``start_node``: the node's torch device.
        wait_s (`float`): Seconds to wait for the node's action server and camera subscription.
        log_dir (`Path`): With ``start_node``: where ``node.log`` goes.
        log (`Callable[[str], None]`): Progress lines.
        world (`SimWorld`, *optional*): What the robot acts in (default: the toy task, :class:`.sim_world.ToyWorld`).

    Raises:
        NodeStartError: The started node failed to come up.
        NodeUnreachableError: No node answered within ``wait_s``.
        TimeoutError: An episode's first chunk never came.
    """
    if start_node:
        with serving_node(settings, log_dir, device, log):
            return simulate(scenes, settings, node=node, image_topic=image_topic, wait_s=wait_s, log=log,
                            world=world)
    from ..cli.ros_client import ClientSession

    records = []
    with ClientSession("toy_robot_sim") as session:
        robot = SimRobot(session, settings, node=node, image_topic=image_topic, log=log, world=world)
        robot.wait_for_node(wait_s)
        robot.warm_up(scenes[0])
        log(f"sim: {len(scenes)} episodes, {settings.mode}, continue_previous {settings.continue_previous}, "
            f"real-time factor {settings.real_time_factor:g}")
        for scene in scenes:
            records.append(robot.run_episode(scene))
            log(f"sim: {episode_line(records[-1])}")
    return records


# --- the JSON report -------------------------------------------------------------------------------------------------


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (strict JSON readers refuse NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def summary(records: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """The in-process bench's metrics (``episodes.summarize``) plus what only a run through the node has:
    goal latencies (sim steps and wall seconds, episode-first goals excluded: the world waits for those) and the
    node's own seam report."""
    from ..toy.episodes import summarize

    out = summarize([r.episode() for r in records])
    goals = [g for r in records for g in r.goals if g.status == "SUCCEEDED" and not g.clock_paused]
    node_seams = [g.seam_jump_node for g in goals
                  if g.continued and g.seam_jump_node is not None and math.isfinite(g.seam_jump_node)]
    out.update({
        "goals": sum(len(r.goals) for r in records),
        "goals_failed": sum(g.status != "SUCCEEDED" for r in records for g in r.goals),
        "latency_steps_mean": float(np.mean([g.latency_steps for g in goals])) if goals else None,
        "latency_wall_s_mean": float(np.mean([g.latency_wall_s for g in goals])) if goals else None,
        "continued_fraction": float(np.mean([bool(g.continued) for g in goals])) if goals else None,
        "seam_jump_node_mean": float(np.mean(node_seams)) if node_seams else None,
    })
    return out


def report(records: Sequence[EpisodeRecord], settings: SimSettings) -> dict[str, Any]:
    """The ``sim --json`` document: settings, :func:`summary` and the per-episode records."""
    # horizon last, after mode, as before SimSettings had the field, and the panel's switches only when set: the
    # toy's report keeps its bytes.
    fields = {k: v for k, v in asdict(settings).items() if k not in ("horizon", *PANEL_SWITCHES)}
    asked = {k: True for k in PANEL_SWITCHES if getattr(settings, k)}
    return finite({"settings": {**fields, "mode": settings.mode, "horizon": settings.horizon, **asked},
                   "summary": summary(records) if records else {},
                   "episodes": [r.to_json() for r in records]})


# --- the picture -----------------------------------------------------------------------------------------------------


def plot_closed_loop(runs: Sequence[tuple[str, Sequence[EpisodeRecord]]], path: Path, title: str = "") -> Path:
    """A row per run, a column per scene: the scene as the camera sees it, the executed path, chunk switches.

    Args:
        runs (`Sequence[tuple[str, Sequence[EpisodeRecord]]]`): ``(label, episodes)`` per row, the same scenes in
            the same order in every row.
        path (`Path`): PNG to write.
        title (`str`): Figure title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    cols = max(len(records) for _, records in runs)
    fig, axes = plt.subplots(len(runs), cols, figsize=(2.6 * cols + 0.4, 2.45 * len(runs) + 0.5), squeeze=False)
    for row, (label, records) in enumerate(runs):
        for col, ax in enumerate(axes[row]):
            ax.set_xticks([])
            ax.set_yticks([])
            if col >= len(records):
                ax.axis("off")
                continue
            record = records[col]
            scene = task.make_scene(record.scene_seed)
            # The scene without the robot, as the policy sees it (image spans [-1, 1], y up).
            ax.imshow(task.render(scene, robot=np.array([9.0, 9.0])), extent=(-1, 1, -1, 1), origin="upper")
            p = np.asarray(record.positions)
            ax.plot(p[:, 0], p[:, 1], "-", color="#ffd166", lw=1.5, marker="o", ms=1.6)
            ax.plot(*p[0], "s", color="#5aa0ff", ms=5)
            switched = [s for s in record.switches if s["seam_jump_sim"] is not None]
            if switched:
                at = p[[s["step"] for s in switched]]
                ax.plot(at[:, 0], at[:, 1], "x", color="white", ms=5, mew=1.2)
            seams = [s["seam_jump_sim"] for s in switched]
            seam = f"mean seam {np.mean(seams):.2f}, jerk {record.episode().jerk / 1e3:.1f}k" if seams else "no switch"
            ax.set_title(f"scene {record.scene_seed - task.HELDOUT_SEED_BASE}: {record.outcome} after "
                         f"{len(p) - 1} steps\n{seam}", fontsize=8)
            ax.set_xlim(-1, 1)
            ax.set_ylim(-0.75, 0.75)
            if col == 0:
                ax.set_ylabel(label, fontsize=8)
    fig.suptitle(title or "closed loop through the node (sim time): executed path (yellow), chunk switches (x)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
