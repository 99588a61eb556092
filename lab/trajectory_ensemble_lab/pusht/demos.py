"""Run the expert on gym-pusht starts, keep the successes, and measure how multimodal they are.

Each start (gym-pusht reset seed) is played by every expert seed asked for (two by default). A demonstration is a
successful episode (the env's ``is_success``: coverage > 0.95) with its reset seed and expert seed; failures are
counted, never kept. With :class:`DartNoise` (DART, Laskey et al. 2017) an episode sends the expert's target plus
correlated Gaussian noise, so it visits states a clean demonstration never does, and keeps the expert's clean target
of every step as its label (:attr:`Episode.labels`). The multimodality figure is the share of starts whose two expert seeds took different
:class:`~.expert.ExpertRoute` *and* traced different paths: the executed agent paths of their first
:data:`PATH_COMPARE_STEPS` steps lie at least :data:`PATH_APART` pixels apart (symmetric Hausdorff distance), so a
label that changed while the agent went the same way does not count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trajectory_ensemble_node.stats import wilson

from .expert import ExpertRoute, PushTExpert
from .sim import AGENT_RADIUS, MAX_STEPS, PushTError, PushTState, make_env, read_state, set_env_state

PATH_COMPARE_STEPS = 40
"""The first 4 s of two episodes are compared: long enough to reach and push the first face."""
PATH_APART = 4 * AGENT_RADIUS
"""Two paths are different when one passes at least this far (60 px, four agent radii) from the other."""


@dataclass(frozen=True)
class DartNoise:
    """Action noise injected while demonstrating (DART): the env is sent ``clip(expert target + n_t, 0, 512)``.

    ``n_t`` is a stationary AR(1) process per axis, ``n_t = rho n_{t-1} + sqrt(1 - rho^2) sigma e_t``, so the
    agent strays for several steps (the policy's own errors are correlated within a chunk) rather than jittering.

    Args:
        sigma (`float`): Stationary standard deviation of the noise per axis, env pixels (> 0).
        rho (`float`): Step-to-step correlation, in [0, 1).
    """

    sigma: float
    rho: float = 0.7

    def __post_init__(self) -> None:
        if not (self.sigma > 0 and 0 <= self.rho < 1):
            raise PushTError(f"DartNoise needs sigma > 0 and rho in [0, 1), got sigma={self.sigma!r}, "
                             f"rho={self.rho!r}")

    def generator(self, env_seed: int, expert_seed: int) -> np.random.Generator:
        """The noise's own generator for one episode (apart from the expert's, which stays as without noise)."""
        return np.random.default_rng([DART_STREAM, expert_seed, env_seed])


DART_STREAM = 7103
"""First word of the noise generator's seed, so that it never equals the expert's ``[expert_seed, env_seed]``."""


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
        plans (`int`): How many times the expert planned.
        states (`np.ndarray` of shape `(K + 1, 5)`, *optional*): Agent ``x, y`` and T ``x, y, angle`` at reset and
            after each step (env pixels, radians).
        labels (`np.ndarray` of shape `(K, 2)`, float32, *optional*): The expert's clean target at each step; equal
            to ``actions`` unless the episode ran with :class:`DartNoise` (then ``actions`` holds what was sent).
        dart_sigma (`float`): The noise's sigma in pixels, 0 for a clean demonstration.
        takeover_step (`int`, *optional*): For a DAgger takeover (:mod:`.dagger`), the step of the policy's episode
            whose state the expert took over from (``states[0]``); ``None`` for a demonstration from a reset.
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
    states: np.ndarray | None = None
    labels: np.ndarray | None = None
    dart_sigma: float = 0.0
    takeover_step: int | None = None

    @property
    def steps(self) -> int:
        """Control steps taken."""
        return len(self.actions)

    def summary(self) -> dict[str, Any]:
        """JSON form without the arrays."""
        return {"env_seed": self.env_seed, "expert_seed": self.expert_seed, "success": self.success,
                "steps": self.steps, "coverage": round(self.coverage, 4), "max_coverage": round(self.max_coverage, 4),
                "route": self.route.as_dict() if self.route else None,
                "routes_open": [r.as_dict() for r in self.routes_open], "seconds": round(self.seconds, 2),
                "dart_sigma": self.dart_sigma}


def run_episode(env_seed: int, expert_seed: int, max_steps: int = MAX_STEPS, frames: bool = False,
                env: Any = None, dart: DartNoise | None = None, start: PushTState | None = None,
                takeover_step: int | None = None) -> Episode:
    """Play start ``env_seed`` with the expert seeded ``expert_seed``.

    Args:
        env_seed (`int`): gym-pusht reset seed.
        expert_seed (`int`): The expert's seed.
        max_steps (`int`): Stop after this many steps (the env's own limit is 300; tests cap it lower).
        frames (`bool`): Record the env's 96x96 pixel observations (about 4 ms a step).
        env (*optional*): A ``make_env(pixels=frames)`` env to reuse.
        dart (`DartNoise`, *optional*): Send noisy targets and keep the clean ones as :attr:`Episode.labels`.
        start (`PushTState`, *optional*): Continue from this state (positions and velocities) instead of the reset's:
            a DAgger takeover (:mod:`.dagger`) of a policy's episode at step ``takeover_step``, whose plan budget is
            what the env's 300 steps leave after it.
        takeover_step (`int`, *optional*): With ``start``, the step of the policy's episode it was reached at.

    Raises:
        PushTError: ``max_steps`` < 1, a seed < 0, or frames asked for with ``start`` (the reset's frame is not its).
    """
    if start is not None and frames:
        raise PushTError("run_episode records frames from a reset only, not from a given start state")
    if max_steps < 1 or env_seed < 0 or expert_seed < 0:
        raise PushTError(f"run_episode needs max_steps >= 1 and seeds >= 0, got max_steps={max_steps}, "
                         f"env_seed={env_seed}, expert_seed={expert_seed}")
    started = time.perf_counter()
    env = env if env is not None else make_env(pixels=frames)
    obs, info = env.reset(seed=env_seed)
    budget = min(max_steps, MAX_STEPS)
    if start is not None:
        set_env_state(env, start)
        budget = MAX_STEPS - (takeover_step or 0)
    expert = PushTExpert([expert_seed, env_seed], max_steps=budget)
    state = read_state(env)
    actions, labels, states = [], [], [np.concatenate([state.agent, state.block])]
    noise_rng = dart.generator(env_seed, expert_seed) if dart is not None else None
    noise = np.zeros(2)
    shown = [obs["pixels"]] if frames else []
    cover = best = 0.0
    success = False
    for _ in range(max_steps):
        label = expert.act(state)
        action = label
        if dart is not None and noise_rng is not None:
            noise = dart.rho * noise + math.sqrt(1.0 - dart.rho ** 2) * dart.sigma * noise_rng.standard_normal(2)
            action = np.clip(label + noise, 0.0, 512.0).astype(np.float32)
        obs, _, terminated, truncated, info = env.step(action)
        actions.append(action)
        labels.append(label)
        state = read_state(env)
        states.append(np.concatenate([state.agent, state.block]))
        if frames:
            shown.append(obs["pixels"])
        cover, success = float(info["coverage"]), bool(info["is_success"])
        best = max(best, cover)
        if terminated or truncated:
            break
    states_arr = np.array(states)
    return Episode(env_seed, expert_seed, expert.route, list(expert.routes_open), success, cover, best,
                   np.array(actions, dtype=np.float32).reshape(-1, 2), states_arr[:, :2].copy(),
                   np.stack(shown) if frames else None, time.perf_counter() - started, expert.plans,
                   states_arr, np.array(labels, dtype=np.float32).reshape(-1, 2),
                   dart.sigma if dart is not None else 0.0, takeover_step)


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
             frames: bool = True, on_episode: Callable[[Episode], None] | None = None,
             dart: DartNoise | None = None, dart_seeds: Sequence[int] = (),
             skip: Callable[[int, int], bool] | None = None) -> list[Episode]:
    """Play starts ``seed .. seed + episodes - 1``, each with every expert seed; return every episode played.

    Args:
        seed (`int`): First gym-pusht reset seed.
        episodes (`int`): Number of starts.
        expert_seeds (`Sequence[int]`): The expert seeds each start is played with.
        max_steps (`int`): Step cap per episode (300, the env's limit, unless a test caps it).
        frames (`bool`): Record the pixel observations (needed for bags).
        on_episode (`Callable[[Episode], None]`, *optional*): Called after each episode (logging, writing a bag);
            the caller keeps or drops it, :func:`kept` says which.
        dart (`DartNoise`, *optional*): The noise the expert seeds in ``dart_seeds`` play with.
        dart_seeds (`Sequence[int]`): Expert seeds (also listed in ``expert_seeds``) that demonstrate with ``dart``.
        skip (`Callable[[int, int], bool]`, *optional*): ``skip(env_seed, expert_seed)`` true leaves that episode
            out (a resumed run skips what it wrote before).

    Raises:
        PushTError: ``episodes`` < 1, ``seed`` < 0 or no expert seed.
    """
    if episodes < 1 or seed < 0 or not expert_seeds:
        raise PushTError(f"generate needs episodes >= 1, seed >= 0 and an expert seed, got episodes={episodes}, "
                         f"seed={seed}, expert_seeds={list(expert_seeds)}")
    if (dart is None) != (not dart_seeds) or not set(dart_seeds) <= set(expert_seeds):
        raise PushTError(f"DART needs both the noise and its expert seeds, among the expert seeds; got "
                         f"dart={dart!r}, dart_seeds={list(dart_seeds)}, expert_seeds={list(expert_seeds)}")
    env = make_env(pixels=frames)
    played = []
    for env_seed in range(seed, seed + episodes):
        for expert_seed in expert_seeds:
            if skip is not None and skip(env_seed, int(expert_seed)):
                continue
            noisy = dart if expert_seed in dart_seeds else None
            ep = run_episode(env_seed, int(expert_seed), max_steps, frames, env, noisy)
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
