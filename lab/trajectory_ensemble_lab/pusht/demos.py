"""Run the expert on gym-pusht starts, keep the successes, and measure how multimodal they are.

Each start (gym-pusht reset seed) is played by every expert seed asked for (two by default). A demonstration is a
successful episode (the env's ``is_success``: coverage > 0.95) with its reset seed and expert seed; failures are
counted, never kept. The multimodality figure is the share of starts whose two expert seeds took different
:class:`~.expert.ExpertRoute` *and* traced different paths: the executed agent paths of their first
:data:`PATH_COMPARE_STEPS` steps lie at least :data:`PATH_APART` pixels apart (symmetric Hausdorff distance), so a
label that changed while the agent went the same way does not count.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trajectory_ensemble_node.stats import wilson

from .expert import ExpertRoute, PushTExpert
from .sim import AGENT_RADIUS, MAX_STEPS, PushTError, make_env, read_state

PATH_COMPARE_STEPS = 40
"""The first 4 s of two episodes are compared: long enough to reach and push the first face."""
PATH_APART = 4 * AGENT_RADIUS
"""Two paths are different when one passes at least this far (60 px, four agent radii) from the other."""


@dataclass
class Episode:
    """One expert episode.

    Args:
        env_seed (`int`): gym-pusht reset seed.
        expert_seed (`int`): The expert's own seed (its generator is seeded with ``[expert_seed, env_seed]``).
        route (`ExpertRoute` or `None`): How it started (``None`` when it never planned).
        routes_open (`list[ExpertRoute]`): The good ways to start it drew from.
        success (`bool`): The env's ``is_success`` at the last step.
        coverage (`float`): The env's ``info["coverage"]`` at the last step.
        max_coverage (`float`): The largest coverage along the episode.
        actions (`np.ndarray` of shape `(K, 2)`, float32): The targets sent, one per step.
        agent_path (`np.ndarray` of shape `(K + 1, 2)`): The agent's position at reset and after each step.
        frames (`np.ndarray` of shape `(K + 1, 96, 96, 3)`, uint8, *optional*): The env's pixel observations.
        seconds (`float`): Wall time of the episode.
    """

    env_seed: int
    expert_seed: int
    route: ExpertRoute | None
    routes_open: list[ExpertRoute]
    success: bool
    coverage: float
    max_coverage: float
    actions: np.ndarray
    agent_path: np.ndarray
    frames: np.ndarray | None = None
    seconds: float = 0.0
    plans: int = field(default=0)

    @property
    def steps(self) -> int:
        """Control steps taken."""
        return len(self.actions)

    def summary(self) -> dict[str, Any]:
        """JSON form without the arrays."""
        return {"env_seed": self.env_seed, "expert_seed": self.expert_seed, "success": self.success,
                "steps": self.steps, "coverage": round(self.coverage, 4), "max_coverage": round(self.max_coverage, 4),
                "route": self.route.as_dict() if self.route else None,
                "routes_open": [r.as_dict() for r in self.routes_open], "seconds": round(self.seconds, 2)}


def run_episode(env_seed: int, expert_seed: int, max_steps: int = MAX_STEPS, frames: bool = False,
                env: Any = None) -> Episode:
    """Play start ``env_seed`` with the expert seeded ``expert_seed``.

    Args:
        env_seed (`int`): gym-pusht reset seed.
        expert_seed (`int`): The expert's seed.
        max_steps (`int`): Stop after this many steps (the env's own limit is 300; tests cap it lower).
        frames (`bool`): Record the env's 96x96 pixel observations (about 4 ms a step).
        env (*optional*): A ``make_env(pixels=frames)`` env to reuse.

    Raises:
        PushTError: ``max_steps`` < 1 or a seed < 0.
    """
    if max_steps < 1 or env_seed < 0 or expert_seed < 0:
        raise PushTError(f"run_episode needs max_steps >= 1 and seeds >= 0, got max_steps={max_steps}, "
                         f"env_seed={env_seed}, expert_seed={expert_seed}")
    started = time.perf_counter()
    env = env if env is not None else make_env(pixels=frames)
    obs, info = env.reset(seed=env_seed)
    expert = PushTExpert([expert_seed, env_seed], max_steps=min(max_steps, MAX_STEPS))
    actions, path = [], [read_state(env).agent]
    shown = [obs["pixels"]] if frames else []
    cover = best = 0.0
    success = False
    for _ in range(max_steps):
        action = expert.act(read_state(env))
        obs, _, terminated, truncated, info = env.step(action)
        actions.append(action)
        path.append(read_state(env).agent)
        if frames:
            shown.append(obs["pixels"])
        cover, success = float(info["coverage"]), bool(info["is_success"])
        best = max(best, cover)
        if terminated or truncated:
            break
    return Episode(env_seed, expert_seed, expert.route, list(expert.routes_open), success, cover, best,
                   np.array(actions, dtype=np.float32).reshape(-1, 2), np.array(path),
                   np.stack(shown) if frames else None, time.perf_counter() - started, expert.plans)


def path_distance(a: np.ndarray, b: np.ndarray, steps: int = PATH_COMPARE_STEPS) -> float:
    """Symmetric Hausdorff distance (pixels) between the first ``steps`` steps of two agent paths ``[K, 2]``."""
    a, b = np.asarray(a)[: steps + 1], np.asarray(b)[: steps + 1]
    d = np.linalg.norm(a[:, None, :] - b[None, :, :], axis=2)
    return float(max(d.min(axis=1).max(), d.min(axis=0).max()))


def multimodality(episodes: Sequence[Episode]) -> dict[str, Any]:
    """The share of starts whose first two expert seeds took different routes along different paths.

    Args:
        episodes (`Sequence[Episode]`): Every episode run (successful or not); starts with fewer than two expert
            seeds are left out.

    Returns:
        `dict`: ``starts``, ``different_routes`` (labels only), ``different_paths`` (labels and paths), their
        shares with Wilson 95 % intervals, and the median path distance.
    """
    by_start: dict[int, list[Episode]] = {}
    for ep in episodes:
        by_start.setdefault(ep.env_seed, []).append(ep)
    pairs = [sorted(eps, key=lambda e: e.expert_seed)[:2] for eps in by_start.values() if len(eps) >= 2]
    labels = [a.route != b.route for a, b in pairs]
    distances = [path_distance(a.agent_path, b.agent_path) for a, b in pairs]
    both = [lab and dist >= PATH_APART for lab, dist in zip(labels, distances)]
    n = len(pairs)
    return {
        "starts": n, "different_routes": int(sum(labels)), "different_paths": int(sum(both)),
        "share": round(sum(both) / n, 4) if n else None, "share_ci95": [round(v, 4) for v in wilson(sum(both), n)],
        "route_label_share": round(sum(labels) / n, 4) if n else None,
        "path_distance_median": round(float(np.median(distances)), 1) if n else None,
        "path_compare_steps": PATH_COMPARE_STEPS, "path_apart_px": PATH_APART,
    }


def generate(seed: int, episodes: int, expert_seeds: Sequence[int] = (0, 1), max_steps: int = MAX_STEPS,
             frames: bool = True, on_episode: Callable[[Episode], None] | None = None) -> list[Episode]:
    """Play starts ``seed .. seed + episodes - 1``, each with every expert seed; return every episode played.

    Args:
        seed (`int`): First gym-pusht reset seed.
        episodes (`int`): Number of starts.
        expert_seeds (`Sequence[int]`): The expert seeds each start is played with.
        max_steps (`int`): Step cap per episode (300, the env's limit, unless a test caps it).
        frames (`bool`): Record the pixel observations (needed for bags).
        on_episode (`Callable[[Episode], None]`, *optional*): Called after each episode (logging, writing a bag);
            the caller keeps or drops it, :func:`kept` says which.

    Raises:
        PushTError: ``episodes`` < 1, ``seed`` < 0 or no expert seed.
    """
    if episodes < 1 or seed < 0 or not expert_seeds:
        raise PushTError(f"generate needs episodes >= 1, seed >= 0 and an expert seed, got episodes={episodes}, "
                         f"seed={seed}, expert_seeds={list(expert_seeds)}")
    env = make_env(pixels=frames)
    played = []
    for env_seed in range(seed, seed + episodes):
        for expert_seed in expert_seeds:
            ep = run_episode(env_seed, int(expert_seed), max_steps, frames, env)
            played.append(ep)
            if on_episode is not None:
                on_episode(ep)
    return played


def kept(episodes: Sequence[Episode]) -> list[Episode]:
    """The demonstrations: the successful episodes only."""
    return [ep for ep in episodes if ep.success]


def results(episodes: Sequence[Episode], settings: dict[str, Any], provenance: dict[str, str]) -> dict[str, Any]:
    """The results record: success rate (Wilson 95 %), kept seeds, multimodality, seconds per episode.

    Args:
        episodes (`Sequence[Episode]`): Every episode played.
        settings (`dict`): The run's options, recorded as they were.
        provenance (`dict[str, str]`): ``date`` and ``commit``, read when the run started (HEAD may move during it).
    """
    good = kept(episodes)
    n = len(episodes)
    seconds = [ep.seconds for ep in episodes]
    return {
        "date": provenance["date"], "commit": provenance["commit"], "settings": settings,
        "episodes_tried": n, "starts_tried": len({ep.env_seed for ep in episodes}),
        "successes": len(good), "success_rate": round(len(good) / n, 4) if n else None,
        "success_rate_ci95": [round(v, 4) for v in wilson(len(good), n)],
        "multimodality": multimodality(episodes),
        "seconds_per_episode": round(float(np.mean(seconds)), 2) if seconds else None,
        "steps_mean_success": round(float(np.mean([ep.steps for ep in good])), 1) if good else None,
        "kept": [[ep.env_seed, ep.expert_seed] for ep in good],
        "failed": [[ep.env_seed, ep.expert_seed, round(ep.max_coverage, 4)] for ep in episodes if not ep.success],
    }
