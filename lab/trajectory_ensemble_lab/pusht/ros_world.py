"""``trajectory-ensemble sim --env pusht``: ``gym_pusht/PushT-v0`` played as a robot through the node over DDS.

The product's simulated robot (:class:`trajectory_ensemble_node.demo.sim_robot.SimRobot`: ``/clock``, the camera,
``continue_previous`` goals, the served chunk executed at its stamps, the inference delay in control steps) acts in
:class:`PushTWorld`: the env as published (its reset seeds, its 300-step limit, ``info["coverage"]`` and
``info["is_success"]``), its rendered 96x96 frame as the camera at 10 Hz, the served rows stepped as absolute targets
in env pixels. The node serves a PushT checkpoint (:func:`node_params`) with ``use_sim_time: true``.

    trajectory-ensemble pusht-eval --policy out/pusht/policy --write-params out/pusht/serve.yaml
    trajectory-ensemble serve --params-file out/pusht/serve.yaml --ros-args -p use_sim_time:=true &
    trajectory-ensemble sim --env pusht --episodes 20 --execute 8 --fixed-delay 2 --json out/pusht/sim.json

Episodes start from validation reset seeds ``100 000 + --scene-seed + i``; goal ``c`` of the episode from reset seed
``s`` has base seed ``--base-seed + 300 s + c`` (:func:`.evaluate.request_seed`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.stats import wilson

from .evaluate import SPLITS, request_seed, serve_params
from .policy_state import AGENT_STATE_NAMES
from .sim import CONTROL_HZ, MAX_STEPS, PushTError, make_env, read_state
from ..records import write_json

SPLIT = "validation"
"""The split whose reset seeds ``sim --env pusht`` plays (the held-out starts are ``pusht-eval``'s, by name)."""


@dataclass
class PushTTrace:
    """What the env did in one episode, step by step.

    Args:
        env_seed (`int`): The reset seed.
        actions (`list[list[float]]`): Targets ``[steps, 2]`` stepped (env pixels, float32 as the env got them).
        coverage (`list[float]`): ``info["coverage"]`` after each step.
        poses (`list[list[float]]`): The T's ``(x, y, angle)`` after each step.
        success (`bool`): ``info["is_success"]`` at some step.
    """

    env_seed: int
    actions: list[list[float]] = field(default_factory=list)
    coverage: list[float] = field(default_factory=list)
    poses: list[list[float]] = field(default_factory=list)
    success: bool = False


class PushTWorld:
    """``gym_pusht/PushT-v0`` as a :class:`~trajectory_ensemble_node.demo.sim_world.SimWorld`; an episode is a reset
    seed. Every ``reset`` (the sim's warm-up included) starts a new :class:`PushTTrace` in :attr:`traces`.

    Args:
        env: A ``make_env(pixels=True)`` env to use (default: a new one).
    """

    name = "pusht"
    frame_id = "pusht_camera"
    fps = float(CONTROL_HZ)

    def __init__(self, env: Any = None) -> None:
        from .train import CHUNK

        self.horizon = CHUNK
        self.env = env if env is not None else make_env(pixels=True)
        self.traces: list[PushTTrace] = []
        self._pixels: np.ndarray | None = None
        self._agent: np.ndarray | None = None

    def episode_id(self, episode: int) -> int:
        return int(episode)

    def first_seed(self, base_seed: int, episode: int) -> int:
        return int(base_seed) + request_seed(int(episode), 0)

    def reset(self, episode: int) -> np.ndarray:
        obs, _ = self.env.reset(seed=int(episode))
        self._pixels, self._agent = obs["pixels"], np.asarray(obs["agent_pos"], dtype=np.float64)
        self.traces.append(PushTTrace(int(episode)))
        return np.asarray(obs["agent_pos"], dtype=np.float64)

    def render(self, position: np.ndarray) -> np.ndarray:
        if self._pixels is None:
            raise PushTError("PushTWorld: reset(seed) before the first frame")
        return np.ascontiguousarray(self._pixels, dtype=np.uint8)

    def step(self, previous: np.ndarray, target: np.ndarray, steps: int, budget: int) -> tuple[np.ndarray, str]:
        action = np.asarray(target, dtype=np.float32)
        obs, _, terminated, truncated, info = self.env.step(action)
        self._pixels, self._agent = obs["pixels"], np.asarray(obs["agent_pos"], dtype=np.float64)
        trace = self.traces[-1]
        trace.actions.append([float(v) for v in action])
        trace.coverage.append(float(info["coverage"]))
        trace.poses.append(read_state(self.env).block.tolist())
        trace.success = trace.success or bool(info["is_success"])
        # The env's own ends first (success, then its 300-step limit), then the sim's --step-budget.
        outcome = "success" if info["is_success"] else "limit" if (terminated or truncated) else ""
        return action.astype(np.float64), outcome or ("budget" if steps >= budget else "")

    def passing_side(self, rows: np.ndarray, start: np.ndarray) -> int:
        return 0  # the toy's obstacle sides; PushT has none

    def joint_state(self) -> tuple[tuple[str, ...], np.ndarray]:
        """The agent's position in the frame now, env pixels, as ``agent_x``, ``agent_y`` (what a PushT policy with
        a state input takes; a policy without one ignores the topic)."""
        if self._agent is None:
            raise PushTError("PushTWorld: reset(seed) before the first state")
        return AGENT_STATE_NAMES, self._agent.copy()


@contextmanager
def node_in_free_domain(params: dict[str, Any], log_dir: Path,
                        on_exit: Callable[[int], None] = lambda code: None) -> Iterator[int]:
    """A node serving ``params`` in an unused ROS domain, this process switched to it for the block; the caller's
    ``ROS_DOMAIN_ID`` comes back afterwards (a test session's, a shell's). Yields the domain; the node's log is
    ``log_dir/node.log`` and ``on_exit`` gets its exit status.

    Raises:
        NodeStartError: The node did not come up (its log says why).
    """
    from trajectory_ensemble_node.cli.launcher import NodeProcess, ros_env, unused_domain_id

    domain = unused_domain_id()
    # This process's rclpy reads the domain at each session's init; the node gets the same one through its
    # environment.
    saved_domain = os.environ.get("ROS_DOMAIN_ID")
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    log_dir.mkdir(parents=True, exist_ok=True)
    node = NodeProcess(params, ros_env(domain), log_path=log_dir / "node.log")
    try:
        node.start(ready_timeout_s=600.0)
        yield domain
    finally:
        on_exit(node.stop())
        if saved_domain is None:
            os.environ.pop("ROS_DOMAIN_ID", None)
        else:
            os.environ["ROS_DOMAIN_ID"] = saved_domain


def node_params(checkpoint: Path, settings: Any, **serve: Any) -> dict[str, Any]:
    """The node's parameters for ``sim --env pusht``: :func:`.evaluate.serve_params` (the checkpoint in env pixels),
    sim time, and a frame-age limit of two camera periods of wall time (as the toy sim's ``node_params``).

    Args:
        checkpoint (`Path`): A ``train-pusht`` output (pipeline + ``action_stats.json``).
        settings (`SimSettings`): The sim's settings (``image_rate``, ``real_time_factor``).
        **serve: More :func:`.evaluate.serve_params` keywords (``num_inference_steps``, ``candidate_count``,
            ``reducer``).
    """
    params = serve_params(checkpoint, **serve)
    params["use_sim_time"] = True
    params["max_observation_age_s"] = max(1.0, 2.0 / (settings.image_rate * settings.real_time_factor))
    return params


def settings_from(args: argparse.Namespace) -> Any:
    """``sim``'s flags as PushT settings: 10 Hz control and camera, chunks of 16, at most the env's 300 steps.

    Raises:
        PushTError: ``--step-budget`` outside ``1..300`` (or a setting :class:`SimSettings` refuses).
    """
    from trajectory_ensemble_node.demo.sim_model import SimSettings

    budget = MAX_STEPS if args.step_budget is None else args.step_budget
    if not 1 <= budget <= MAX_STEPS:
        raise PushTError(f"--step-budget must be in 1..{MAX_STEPS} for --env pusht (the env's limit), got {budget}")
    from .train import CHUNK

    return SimSettings(execute=args.execute, real_time_factor=args.real_time_factor, fps=float(CONTROL_HZ),
                       image_rate=float(CONTROL_HZ) if args.image_rate is None else args.image_rate,
                       continue_previous=not args.no_continue, inference_delay=args.inference_delay,
                       candidates=args.candidates, step_budget=budget, base_seed=args.base_seed,
                       fixed_delay=args.fixed_delay, horizon=CHUNK)


def episode_seeds(episodes: int, offset: int) -> list[int]:
    """Validation reset seeds ``100 000 + offset + i``, ``i < episodes``.

    Raises:
        PushTError: The range leaves the validation split.
    """
    low, high = SPLITS[SPLIT]
    if episodes < 1 or offset < 0 or low + offset + episodes > high:
        raise PushTError(f"--scene-seed {offset} with --episodes {episodes} leaves the {SPLIT} starts "
                         f"{low}..{high - 1}")
    return [low + offset + i for i in range(episodes)]


def episode_summary(record: Any, trace: PushTTrace) -> dict[str, Any]:
    """One episode of the report: env seed, steps, max coverage, success, goals and their continuity statuses, and
    the trace (stepped actions, coverage and T poses per step)."""
    if record.scene_seed != trace.env_seed:
        raise PushTError(f"the sim's episode {record.scene_seed} and the env's trace {trace.env_seed} differ")
    return {"env_seed": trace.env_seed, "steps": len(trace.actions), "outcome": record.outcome,
            "max_coverage": max(trace.coverage, default=0.0), "success": trace.success,
            "goals": [asdict(g) for g in record.goals],
            "continuity": [g.continuity_status for g in record.goals],
            "switches": record.switches, "wall_s": record.wall_s,
            "actions": trace.actions, "coverage": trace.coverage, "poses": trace.poses}


def report(records: list[Any], traces: list[PushTTrace], settings: Any) -> dict[str, Any]:
    """The ``sim --env pusht --json`` document: date, commit, settings, summary (success rate with its Wilson 95 %
    interval, mean max coverage, goals, continued fraction) and the episodes (:func:`episode_summary`).

    Args:
        records (`list[EpisodeRecord]`): The sim's records, one per episode.
        traces (`list[PushTTrace]`): The env's traces of the same episodes, in order.
        settings (`SimSettings`): The sim's settings.
    """
    from trajectory_ensemble_node.demo.sim_report import finite

    episodes = [episode_summary(r, t) for r, t in zip(records, traces, strict=True)]
    successes = sum(e["success"] for e in episodes)
    low, high = wilson(successes, len(episodes))
    goals = [g for r in records for g in r.goals if g.status == "SUCCEEDED" and not g.clock_paused]
    summary = {
        "episodes": len(episodes), "successes": successes,
        "success_rate": successes / len(episodes) if episodes else 0.0, "success_rate_ci95": [low, high],
        "coverage_mean": float(np.mean([e["max_coverage"] for e in episodes])) if episodes else 0.0,
        "goals": sum(len(r.goals) for r in records),
        "goals_failed": sum(g.status != "SUCCEEDED" for r in records for g in r.goals),
        "continued_fraction": float(np.mean([bool(g.continued) for g in goals])) if goals else None,
        "latency_steps_mean": float(np.mean([g.latency_steps for g in goals])) if goals else None,
    }
    fields = {k: v for k, v in asdict(settings).items() if k != "horizon"}
    return finite({"date": utc_now(), "commit": git_commit(), "env": "gym_pusht/PushT-v0 (gym-pusht 0.1.8)",
                   "settings": {**fields, "mode": settings.mode, "horizon": settings.horizon},
                   "summary": summary, "episodes": episodes})


def run(args: argparse.Namespace) -> int:
    """``sim --env pusht``: 0 when every episode ran to its end, 2 a refused setting (or no ``gym_pusht``), 3 the
    node did not answer."""
    from trajectory_ensemble_node.cli.ros_client import NodeUnreachableError, check_node_name
    from trajectory_ensemble_node.demo.sim_report import simulate

    try:
        check_node_name(args.node)
        if args.start_node:
            raise PushTError("--start-node starts the toy model; for --env pusht serve a PushT checkpoint with "
                             "use_sim_time: true (pusht-eval --policy DIR --write-params PARAMS, then serve "
                             "--params-file PARAMS --ros-args -p use_sim_time:=true)")
        settings = settings_from(args)
        seeds = episode_seeds(args.episodes, args.scene_seed)
        world = PushTWorld()
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:
        print(f"error: --env pusht needs {error.name} (the lab's pusht extra): {error}", file=sys.stderr)
        return 2
    try:
        records = simulate(seeds, settings, node=args.node, image_topic=args.image_topic, wait_s=args.wait,
                           log=lambda m: print(m, flush=True), world=world)
    except (NodeUnreachableError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    document = report(records, world.traces[-len(records):], settings)
    write_json(args.json, document)
    s = document["summary"]
    low, high = s["success_rate_ci95"]
    continued = s["continued_fraction"]
    print(f"sim --env pusht: success {s['successes']}/{s['episodes']} (95 % {low:.1%}..{high:.1%}), mean max coverage "
          f"{s['coverage_mean']:.3f}, continued {'n/a' if continued is None or math.isnan(continued) else continued}")
    print(f"wrote {args.json}")
    return 0
