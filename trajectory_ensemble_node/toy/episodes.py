"""A closed-loop episode of the toy task: its budget and seeds, its record, and the metrics of a set of them.

The in-process bench (:mod:`.closed_loop`) and the simulated robot over ROS (``trajectory-ensemble sim``) both
produce :class:`Episode` s, so both report the same metric keys from :func:`summarize`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..stats import bootstrap_mean, wilson
from . import task

EXECUTE = task.HORIZON // 2
"""``s``: actions executed per chunk (the next one is requested while half of the current one is ahead)."""
STEP_BUDGET = 32
"""Steps per episode. The time-consistent expert (``task.expert_continuation``) reaches the target in 8 steps async
and ``8 + d`` with sync; a policy that re-plans the whole remaining distance into every chunk halves it per chunk and
needs 5 chunks to get within the target radius, i.e. 20 steps async and 28 with sync at d = 2."""
SEED_STRIDE = 1000
"""Chunk ``c`` of held-out scene ``i`` draws from base seed ``base_seed + SEED_STRIDE * i + c``."""


def scene_seed(base_seed: int, scene: task.Scene) -> int:
    """Candidate base seed of a held-out scene's first chunk (chunk ``c`` adds ``c``)."""
    return base_seed + SEED_STRIDE * (scene.seed - task.HELDOUT_SEED_BASE)


@dataclass
class Episode:
    """One closed-loop episode's record (positions ``[T + 1, 2]`` in scene units)."""

    positions: list[np.ndarray]
    switches: list[int] = field(default_factory=list)
    seams: list[float] = field(default_factory=list)
    sides: list[int] = field(default_factory=list)
    reached: bool = False
    collided: bool = False
    group_ms: list[float] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """JSON-ready form (positions rounded to 1e-6), from which :meth:`from_record` rebuilds the episode."""
        return {"positions": np.round(np.asarray(self.positions), 6).tolist(), "switches": self.switches,
                "seams": self.seams, "sides": self.sides, "reached": self.reached, "collided": self.collided}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Episode:
        return cls(positions=[np.asarray(p) for p in record["positions"]], switches=list(record["switches"]),
                   seams=list(record["seams"]), sides=list(record["sides"]), reached=bool(record["reached"]),
                   collided=bool(record["collided"]))

    @property
    def steps(self) -> int:
        return len(self.positions) - 1

    @property
    def flips(self) -> int:
        """Changes of side between consecutive chunks that pass the obstacle (side 0: planned past it)."""
        passing = [side for side in self.sides if side != 0]
        return int(sum(a != b for a, b in zip(passing, passing[1:])))

    @property
    def jerk(self) -> float:
        """Mean squared jerk of the executed path (third finite difference / dt^3, dt = 1 / task.FPS, squared norm)."""
        p = np.asarray(self.positions)
        if len(p) < 4:
            return 0.0
        jerk = (p[3:] - 3 * p[2:-1] + 3 * p[1:-2] - p[:-3]) * task.FPS**3
        return float((jerk**2).sum(-1).mean())


def _pooled(episodes: Sequence[Episode], values, reduce=np.mean) -> tuple[float, list[float]]:
    per = [values(e) for e in episodes]
    pooled = [v for vs in per for v in vs]
    if not pooled:
        return 0.0, [0.0, 0.0]
    rng = np.random.default_rng(0)
    stats = []
    for _ in range(1000):
        pick = rng.integers(0, len(per), size=len(per))
        sample = [v for j in pick for v in per[j]]
        stats.append(reduce(sample) if sample else 0.0)
    return float(reduce(pooled)), [float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))]


def summarize(episodes: Sequence[Episode]) -> dict[str, Any]:
    """The metrics of one (method, delay) cell, with 95% intervals (``<metric>_ci95``)."""
    n = len(episodes)
    success = sum(e.reached and not e.collided for e in episodes)
    collisions = sum(e.collided for e in episodes)
    flips = [float(e.flips) for e in episodes]
    jerk = [e.jerk for e in episodes]
    reached = [float(e.steps) for e in episodes if e.reached]
    seam_mean, seam_mean_ci = _pooled(episodes, lambda e: e.seams, np.mean)
    seam_max, seam_max_ci = _pooled(episodes, lambda e: e.seams, np.max)
    return {
        "episodes": n,
        "success_rate": success / n, "success_rate_ci95": list(wilson(success, n)),
        "collision_rate": collisions / n, "collision_rate_ci95": list(wilson(collisions, n)),
        "mode_flips_per_episode": float(np.mean(flips)), "mode_flips_per_episode_ci95": list(bootstrap_mean(flips)),
        "seam_jump_mean": seam_mean, "seam_jump_mean_ci95": seam_mean_ci,
        "seam_jump_max": seam_max, "seam_jump_max_ci95": seam_max_ci,
        "jerk": float(np.mean(jerk)), "jerk_ci95": list(bootstrap_mean(jerk)),
        "steps_to_target": float(np.mean(reached)) if reached else None,
        "steps_to_target_ci95": list(bootstrap_mean(reached)) if reached else None,
        "chunks_per_episode": float(np.mean([len(e.sides) for e in episodes])),
    }
