"""``train-grpo --ros``: the GRPO loop against a live node, over real DDS.

The node runs as a child process (:class:`~trajectory_ensemble_node.cli.launcher.NodeProcess`) with
``enable_weight_updates: true``, ``weights_dir`` (the trainer's weight folder, the only one the service may read) and
``rollout_dir``. Per scene the trainer publishes the rendered observation on ``~/observation/image`` and sends a
``rollout`` goal; it reads the record the node wrote (``result.rollout_path``). Each new weight file goes through
``~/update_weights``. The checks, which raise :class:`RosGrpoError` when broken:

- every rollout's ``weights_version`` (result and record manifest alike) equals the version of the last push, so
  it rises after each push and one iteration's groups never mix versions;
- the record was made from the observation the trainer sent (its conditioning latents match the trainer's own
  encoding of the scene: catches a goal that raced the image);
- after each push the node still serves a normal goal (no rollout), on the new version.

The held-out evaluation runs through normal goals too (``return_candidates``, fixed seeds).
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.errors import TrajectoryEnsembleError
from trajectory_ensemble_node.toy import task
from trajectory_ensemble_node.cli.launcher import NodeProcess, pick_domain_id, ros_env
from trajectory_ensemble_node.models.cosmos3 import read_record


class RosGrpoError(TrajectoryEnsembleError, RuntimeError):
    """The node broke a GRPO invariant (wrong or mixed ``weights_version``, a failed goal or weight push)."""


NODE = "trajectory_ensemble"
NS = f"/{NODE}"
GOAL_TIMEOUT_S = 300.0


class RosPolicy:
    """The serving side as a live node: rollout goals in, weight files pushed through ``~/update_weights``.

    Args:
        args (`argparse.Namespace`): The ``train-grpo`` options (``pipeline``, ``steps``, ``noise_level``,
            ``group_size``, ``work_dir``).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        work = args.work_dir.resolve()
        self.weights_dir = work / "weights"
        self.rollout_dir = work / "rollouts_ros"
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.rollout_dir.mkdir(parents=True, exist_ok=True)
        self.domain_id = pick_domain_id()
        count = max(args.group_size, getattr(args, "heldout_group", 1))
        params = {
            "model": str(args.pipeline.resolve()) if args.pipeline is not None else "toy",
            "device": "cpu",
            "num_inference_steps": args.steps,
            "candidate_count": count,
            "max_candidates": count,
            "max_batch_candidates": count,
            "enable_weight_updates": True,
            "weights_dir": str(self.weights_dir),
            "rollout_dir": str(self.rollout_dir),
            "rollout_noise_level": float(args.noise_level),
            # Goals follow their image within a second; a loaded CI machine can be slow to deliver it.
            "max_observation_age_s": 60.0,
        }
        self.node = NodeProcess(params, ros_env(self.domain_id), log_path=work / "node.log")
        self.node.start()
        try:
            self.client = _Client(self.domain_id)
        except BaseException:
            self.node.stop()
            raise
        self.version = 0
        self.checks: dict[str, Any] = {"rollout_versions": [], "pushed_versions": [], "normal_goals_after_push": [],
                                       "rollout_goals": 0, "domain_id": self.domain_id}

    @property
    def weights_version(self) -> int:
        return self.version

    def _goal(self, scene: task.Scene, seed: int, count: int, rollout: bool) -> Any:
        self.client.publish_image(task.render(scene))
        result = self.client.run_goal(candidate_count=count, reducer="mean", return_candidates=True, use_seed=True,
                                      seed=int(seed), rollout=rollout)
        if result.error_code != 0:
            raise RosGrpoError(f"goal on scene {scene.seed} failed: error {result.error_code}: "
                               f"{result.error_message!r}")
        if int(result.weights_version) != self.version:
            raise RosGrpoError(f"goal on scene {scene.seed} ran on weights_version {int(result.weights_version)}, "
                               f"expected {self.version} (the last push)")
        return result

    def rollout(self, scenes: Sequence[task.Scene], base_seeds: Sequence[int], count: int
                ) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
        """One rollout goal per scene; the records the node wrote, checked for their ``weights_version``."""
        records = []
        for scene, seed in zip(scenes, base_seeds, strict=True):
            result = self._goal(scene, seed, count, rollout=True)
            if not result.rollout_path:
                raise RosGrpoError(f"rollout goal on scene {scene.seed} returned no rollout_path")
            path = Path(result.rollout_path)
            tensors, manifest = read_record(path)
            if int(manifest["weights_version"]) != int(result.weights_version):
                raise RosGrpoError(f"record {path.name!r} says weights_version {manifest['weights_version']}, "
                                   f"its result {int(result.weights_version)}")
            if list(manifest["seeds"])[0] != int(seed):
                raise RosGrpoError(f"record {path.name!r} has base seed {manifest['seeds'][0]}, the goal sent {seed}")
            self.checks["rollout_versions"].append(int(manifest["weights_version"]))
            self.checks["rollout_goals"] += 1
            path.unlink()
            path.with_suffix(".json").unlink()
            records.append((tensors, manifest))
        return records

    def push(self, path: Path) -> int:
        """``~/update_weights`` with ``path`` (inside ``weights_dir``); then one normal goal on the new version."""
        response = self.client.update_weights(str(Path(path).resolve()))
        if not response.success or int(response.weights_version) != self.version + 1:
            raise RosGrpoError(f"update_weights({str(path)!r}) answered success={response.success}, "
                               f"version {int(response.weights_version)} (expected {self.version + 1}): "
                               f"{response.message!r}")
        self.version = int(response.weights_version)
        self.checks["pushed_versions"].append(self.version)
        scene = task.make_scene(task.TRAIN_SEED_BASE + 7)
        normal = self._goal(scene, seed=1, count=2, rollout=False)
        self.checks["normal_goals_after_push"].append(
            {"weights_version": int(normal.weights_version), "rollout_path": normal.rollout_path,
             "horizon": int(normal.trajectory.horizon)})
        return self.version

    def candidates(self, scenes: Sequence[task.Scene], base_seeds: Sequence[int], count: int) -> list[np.ndarray]:
        """Candidates ``[N, H, 2]`` of normal goals (serving sampler), one goal per scene."""
        out = []
        for scene, seed in zip(scenes, base_seeds, strict=True):
            msg = self._goal(scene, seed, count, rollout=False).candidates
            out.append(np.asarray(msg.data, dtype=np.float64).reshape(len(msg.seeds), msg.horizon, msg.action_dim))
        return out

    def report(self) -> dict[str, Any]:
        """The checks made (all passed, or the run would have raised)."""
        checks = dict(self.checks)
        checks["all_normal_goals_on_new_version"] = all(
            g["weights_version"] == v for g, v in zip(checks["normal_goals_after_push"], checks["pushed_versions"]))
        return checks

    def close(self) -> None:
        self.client.close()
        self.node.stop()


class _Client:
    """A plain rclpy node in its own context: the image publisher, the action client and the weights client."""

    def __init__(self, domain_id: int) -> None:
        import rclpy
        from rclpy.action import ActionClient
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile
        from sensor_msgs.msg import Image
        from trajectory_ensemble_msgs.action import GenerateTrajectory
        from trajectory_ensemble_msgs.srv import UpdateWeights

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(f"grpo_trainer_{uuid.uuid4().hex[:8]}", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.Image = Image
        self.image_pub = self.node.create_publisher(Image, f"{NS}/observation/image", QoSProfile(depth=10))
        self.Goal = GenerateTrajectory.Goal
        self.action = ActionClient(self.node, GenerateTrajectory, f"{NS}/generate_trajectory")
        self.weights = self.node.create_client(UpdateWeights, f"{NS}/update_weights")
        self.UpdateWeights = UpdateWeights
        self._running = True
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        if not self.action.wait_for_server(timeout_sec=120.0) or not self.weights.wait_for_service(timeout_sec=60.0):
            raise RosGrpoError("the node's generate_trajectory action or update_weights service was not found")
        _wait(lambda: self.image_pub.get_subscription_count() > 0, 60.0, "the node's image subscription")

    def _spin(self) -> None:
        while self._running and self.context.ok():
            self.executor.spin_once(timeout_sec=0.05)

    def publish_image(self, rgb: np.ndarray) -> None:
        """Publish one observation (three times, same stamp, so one lost sample cannot matter), then settle."""
        msg = self.Image(height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8", step=rgb.shape[1] * 3)
        msg.header.stamp = self.node.get_clock().now().to_msg()
        msg.header.frame_id = "camera"
        msg.data = np.ascontiguousarray(rgb, dtype=np.uint8).tobytes()
        for _ in range(3):
            self.image_pub.publish(msg)
        time.sleep(0.3)

    def run_goal(self, **fields: Any) -> Any:
        handle = _wait_future(self.action.send_goal_async(self.Goal(**fields)), 60.0, "goal acceptance")
        if not handle.accepted:
            raise RosGrpoError(f"goal {fields!r} was rejected")
        return _wait_future(handle.get_result_async(), GOAL_TIMEOUT_S, "a goal result").result

    def update_weights(self, path: str) -> Any:
        return _wait_future(self.weights.call_async(self.UpdateWeights.Request(path=path, strict=True)), 120.0,
                            "the update_weights response")

    def close(self) -> None:
        import rclpy

        self._running = False
        self._thread.join(5)
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise RosGrpoError(f"timed out after {timeout} s waiting for {what}")


def _wait_future(future: Any, timeout: float, what: str) -> Any:
    _wait(future.done, timeout, what)
    return future.result()
