"""``bench --pusht --through node``: the same methods played through the node over DDS by ``sim --env pusht``.

The bench starts one node serving the checkpoint on sim time (a free ROS domain, its log beside the JSON) and plays
every start of every method with the product's simulated robot acting in :class:`.ros_world.PushTWorld`. Each method
becomes the goals a robot would send:

- a reducer ``R`` at ``d = 0``: goals of ``--count`` candidates reduced by ``R``, 8 rows executed, the env stopped
  until the next chunk arrives (``fixed_delay 0``); ``single``: one candidate with the same seed, which is candidate 0
  of the group (the seeding rule);
- ``naive_async`` at ``d``: one candidate, no continuation, taking over ``d`` steps after its goal;
- ``guided_mode`` and ``bid`` at ``d``: ``continue_previous`` goals of ``--count`` candidates with their reducer and
  guidance, taking over ``d`` steps after the goal (``fixed_delay d``), the frozen rows the node's.

Goal ``c`` of the episode from reset seed ``s`` has base seed ``300 s + c``, as the in-process bench's request ``c``.
The node's timeline is the sim's clock and the in-process one's is the bench's steps, so the two agree within their
intervals, not bit for bit. ``sync`` (the sim's sync executes whole chunks), ``temporal_ensemble`` and
``weighted_average`` (the node serves chunks, not blends of them) cannot run through the node: they are named and left
out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..chunk_execution import Method

NODE_CONTINUITY = ("naive_async", "guided_mode", "bid")
"""Continuity methods the node's goals express (:mod:`trajectory_ensemble_lab.chunk_execution`'s names)."""


def goal_settings(method: Method, delay: int, *, execute: int, max_steps: int, single: bool) -> dict[str, Any]:
    """The :class:`~trajectory_ensemble_node.demo.sim_model.SimSettings` fields that play ``method`` at ``delay``."""
    continued = method.guidance is not None
    return {"execute": execute, "fixed_delay": delay, "continue_previous": continued,
            "candidates": 1 if single else method.count, "reducer": "none" if single else method.reducer,
            "guidance": method.guidance or "", "step_budget": max_steps}


def play(checkpoint: Path, runs: Sequence[tuple[str, str, Method, int, bool]], seeds: Sequence[int], *, steps: int,
         count: int, execute: int, max_steps: int, log_dir: Path, log: Callable[[str], None],
         refused: Callable[[str, str], None]) -> dict[tuple[str, str, int], list[Any]]:
    """Every run (``(block, name, method, delay, single)``) on every start, through one node started here.

    Returns:
        `dict`: ``(block, name, delay)`` to the episodes (:class:`~.bench.BenchEpisode`) in seed order.

    Raises:
        NodeStartError: the node did not come up (its log says why).
    """
    from trajectory_ensemble_node.demo.sim_model import SimSettings
    from trajectory_ensemble_node.demo.sim_report import simulate

    from .bench_records import BenchEpisode
    from .ros_world import PushTWorld, node_in_free_domain, node_params
    from .sim import CONTROL_HZ
    from .train import CHUNK

    playable = []
    for block, name, method, delay, single in runs:
        if block == "continuity" and name not in NODE_CONTINUITY:
            refused(name, f"not through the node: its goals serve chunks, and {name} executes them otherwise "
                          f"(only {', '.join(NODE_CONTINUITY)} and the reducers run --through node)")
            continue
        playable.append((block, name, method, delay, single))
    base = SimSettings(real_time_factor=1.0, fps=float(CONTROL_HZ), image_rate=float(CONTROL_HZ), horizon=CHUNK)
    params = node_params(checkpoint, base, num_inference_steps=steps, candidate_count=count, reducer="mode")
    log(f"bench --pusht: starting the node; log {log_dir}/node.log")
    out: dict[tuple[str, str, int], list[Any]] = {}
    with node_in_free_domain(params, log_dir) as domain:
        log(f"bench --pusht: the node serves on ROS_DOMAIN_ID={domain}")
        for block, name, method, delay, single in playable:
            settings = dataclasses.replace(base, **goal_settings(method, delay, execute=execute, max_steps=max_steps,
                                                                  single=single))
            world = PushTWorld()
            records = simulate(list(seeds), settings, world=world, log=lambda _: None)
            episodes = []
            for record, trace in zip(records, world.traces[-len(records):], strict=True):
                episode = BenchEpisode(trace.env_seed, steps=len(trace.actions),
                                       max_coverage=max(trace.coverage, default=0.0), success=trace.success,
                                       actions=trace.actions)
                episode.seams = [float(s["seam_first_row"]) for s in record.switches[1:]
                                 if s.get("seam_first_row") is not None]
                episode.group_ms = [g.latency_wall_s * 1000.0 for g in record.goals if g.latency_wall_s is not None]
                episodes.append(episode)
                log(f"seed {trace.env_seed} {name} d={delay} (node): max coverage {episode.max_coverage:.3f} "
                    f"{'success' if episode.success else 'failure'} in {episode.steps} steps")
            out[(block, name, delay)] = episodes
    return out
