"""The state oracle in closed loop: the product's reducers over its candidates, paired by start and noise seed.

An episode is ``gym_pusht/PushT-v0`` from one reset seed. At step 0 and every :data:`~.evaluate.EXECUTE` steps
after, the oracle draws N candidate chunks for the current state (:func:`~.oracle.sample`, noise seeded by
``[noise seed, reset seed, request]``), a method turns them into one chunk, and the env executes its first rows
(``bench --pusht``'s reducer block at ``d = 0``: the env waits for each chunk). ``single`` is candidate 0 of the same
group; every other method is the product's reducer of that name (``trajectory_ensemble_node.reducers``, looked up by
name when the evaluation runs, so a changed rule is measured by running it again), applied to the candidates in
normalized units ``[-1, 1]``, as the served policy reduces them. Every method of one (start, noise seed) draws the
same first group, so differences are paired.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.reducers import configured_reducer
from trajectory_ensemble_node.reducers.variants import SINGLE, parse_variants
from trajectory_ensemble_node.stats import bootstrap_mean, wilson

from .bench_records import paired_outcomes
from .evaluate import EXECUTE
from .oracle import DEFAULT_STEPS, OracleNet, denormalize_actions, history_features, sample
from .sim import MAX_STEPS, PushTError, make_env, read_state

REDUCERS = ("single", "mean", "median", "medoid", "mode")
"""The methods by default: one candidate, and each basic reducer of the product at N."""
HIGH_COVERAGE = 0.8


@dataclass
class OracleEpisode:
    """One closed-loop episode of one method.

    Args:
        env_seed (`int`): gym-pusht reset seed.
        noise_seed (`int`): The candidates' noise seed.
        steps (`int`): Control steps taken.
        max_coverage (`float`): Highest ``info["coverage"]``.
        success (`bool`): ``info["is_success"]`` at some step.
        requests (`int`): Chunks drawn.
    """

    env_seed: int
    noise_seed: int
    steps: int = 0
    max_coverage: float = 0.0
    success: bool = False
    requests: int = 0


@dataclass(frozen=True)
class Execution:
    """How chunks are drawn and executed.

    Args:
        count (`int`): Candidates N per group.
        steps (`int`): Euler steps per candidate.
        execute (`int`): Rows of each chunk executed before the next request.
        execute_near_goal (`int`, *optional*): Rows executed instead once coverage reaches ``near_goal``.
        near_goal (`float`): The coverage from which ``execute_near_goal`` applies.
        max_steps (`int`): Step cap (the env's 300).
    """

    count: int = 8
    steps: int = DEFAULT_STEPS
    execute: int = EXECUTE
    execute_near_goal: int | None = None
    near_goal: float = 0.8
    max_steps: int = MAX_STEPS

    def __post_init__(self) -> None:
        rows = [self.execute] + ([self.execute_near_goal] if self.execute_near_goal is not None else [])
        if self.count < 1 or self.steps < 1 or any(not 1 <= r <= 16 for r in rows) or not 1 <= self.max_steps <= MAX_STEPS:
            raise PushTError(f"the oracle needs count >= 1, steps >= 1, executed rows in 1..16 and max_steps in "
                             f"1..{MAX_STEPS}; got {self}")


def reduce_group(method: str, candidates: torch.Tensor) -> torch.Tensor:
    """One chunk from a group ``[N, H, 2]`` (normalized units): candidate 0 for ``single``, else the product's
    reducer named ``method`` (a variant name as the product parses it: ``mode@0.05`` is ``mode`` at a fixed cut).

    Raises:
        UnknownReducerError: ``method`` names no registered reducer.
        InvalidSpecError: a malformed variant name.
        PushTError: the reducer needs an execution context (the continuity reducers), which this loop has none of.
    """
    (variant,) = parse_variants([method])
    if variant.reducer == SINGLE:
        return candidates[0]
    reducer = configured_reducer(variant.reducer, variant.mode_threshold)
    if reducer.uses_context:
        raise PushTError(f"reducer {method!r} needs the previous chunk; the oracle evaluates context-free reducers")
    return reducer(candidates)


def request_generator(noise_seed: int, env_seed: int, request: int) -> torch.Generator:
    """The noise of one group: the same for every method of one (noise seed, start)."""
    seed = int(np.random.SeedSequence([noise_seed, env_seed, request]).generate_state(1, np.uint64)[0])
    return torch.Generator().manual_seed(seed)


Rule = Callable[[torch.Tensor], torch.Tensor]
"""A reduction being measured that is not (yet) a registered reducer: ``[N, H, 2]`` normalized -> ``[H, 2]``."""


def run_episode(net: OracleNet, env: Any, env_seed: int, noise_seed: int, method: str,
                execution: Execution, rule: Rule | None = None) -> OracleEpisode:
    """Play one episode of ``method`` from reset seed ``env_seed``.

    Args:
        net (`OracleNet`): The oracle (eval mode).
        env: A ``make_env()`` env (state observations; the oracle reads the full state from it).
        env_seed (`int`): Reset seed.
        noise_seed (`int`): Noise seed of the candidates.
        method (`str`): ``single`` or a reducer name (the episode's label when ``rule`` is given).
        execution (`Execution`): N, Euler steps, executed rows.
        rule (`Rule`, *optional*): Reduce with this instead of the reducer named ``method``.
    """
    env.reset(seed=env_seed)
    episode = OracleEpisode(env_seed, noise_seed)
    states = [np.concatenate([read_state(env).agent, read_state(env).block])]
    obs_steps = net.config.obs_steps
    while True:
        obs = torch.from_numpy(history_features(np.stack(states), len(states) - 1, obs_steps))
        group = sample(net, obs, execution.count, request_generator(noise_seed, env_seed, episode.requests),
                       execution.steps)
        episode.requests += 1
        chunk = denormalize_actions(reduce_group(method, group) if rule is None else rule(group)).numpy()
        near = execution.execute_near_goal is not None and episode.max_coverage >= execution.near_goal
        for target in chunk[: execution.execute_near_goal if near else execution.execute]:
            _, _, terminated, truncated, info = env.step(np.clip(target, 0.0, 512.0).astype(np.float32))
            episode.steps += 1
            state = read_state(env)
            states.append(np.concatenate([state.agent, state.block]))
            episode.max_coverage = max(episode.max_coverage, float(info["coverage"]))
            episode.success = episode.success or bool(info["is_success"])
            if terminated or truncated or episode.steps >= execution.max_steps:
                return episode


def summarize(episodes: Sequence[OracleEpisode]) -> dict[str, Any]:
    """One method's figures: mean max coverage (bootstrap 95 %), success (Wilson 95 %), episodes above 0.8."""
    coverage = [e.max_coverage for e in episodes]
    successes = sum(e.success for e in episodes)
    return {"episodes": len(episodes), "coverage_mean": round(float(np.mean(coverage)), 4),
            "coverage_mean_ci95": [round(v, 4) for v in bootstrap_mean(coverage)],
            "successes": successes, "success_rate": round(successes / len(episodes), 4),
            "success_rate_ci95": [round(v, 4) for v in wilson(successes, len(episodes))],
            "above_0_8": sum(c >= HIGH_COVERAGE for c in coverage),
            "per_episode": [asdict(e) for e in episodes]}


def paired_versus(base: Sequence[OracleEpisode], other: Sequence[OracleEpisode]) -> dict[str, Any]:
    """``other`` minus ``base`` on the (start, noise seed) pairs both played, with bootstrap 95 % intervals.

    Raises:
        ValueError: the two share no episode.
    """
    f = paired_outcomes(*({(e.env_seed, e.noise_seed): (e.max_coverage, e.success) for e in eps}
                          for eps in (base, other)), what="(start, noise seed)")
    return {"episodes": f["pairs"], "coverage_diff_mean": round(f["coverage_diff_mean"], 4),
            "coverage_diff_ci95": [round(v, 4) for v in f["coverage_diff_ci95"]],
            "success_diff": round(f["success_diff"], 4),
            "success_diff_ci95": [round(v, 4) for v in f["success_diff_ci95"]],
            "only_other_succeeded": f["only_b_succeeded"], "only_base_succeeded": f["only_a_succeeded"]}


@dataclass
class Evaluation:
    """Every method's episodes, in the order played."""

    episodes: dict[str, list[OracleEpisode]] = field(default_factory=dict)

    def figures(self, baseline: str = "single") -> dict[str, Any]:
        """``methods`` (per method :func:`summarize`) and ``versus_<baseline>`` (:func:`paired_versus`)."""
        methods = {name: summarize(eps) for name, eps in self.episodes.items()}
        versus = ({name: paired_versus(self.episodes[baseline], eps) for name, eps in self.episodes.items()
                   if name != baseline} if baseline in self.episodes else {})
        return {"methods": methods, f"versus_{baseline}": versus}


def evaluate(net: OracleNet, starts: Sequence[int], noise_seeds: Sequence[int], methods: Sequence[str],
             execution: Execution, log: Callable[[str], None] = print,
             rules: Mapping[str, Rule] | None = None) -> Evaluation:
    """Play every method on every (start, noise seed).

    Args:
        net (`OracleNet`): The oracle.
        starts (`Sequence[int]`): Reset seeds.
        noise_seeds (`Sequence[int]`): Noise seeds per start.
        methods (`Sequence[str]`): ``single`` and reducer names (checked before any episode runs).
        execution (`Execution`): How chunks are drawn and executed.
        log (`Callable[[str], None]`): One line per episode.
        rules (`Mapping[str, Rule]`, *optional*): Methods measured by a rule of their own (a candidate rule before
            it becomes a reducer); their names are labels, not reducer names.
    """
    rules = dict(rules or {})
    probe = torch.zeros(2, 16, 2)
    for method in methods:
        if method not in rules:
            reduce_group(method, probe)  # an unknown or context-needing name fails before the first episode
    env = make_env()
    result = Evaluation()
    for method in methods:
        played = result.episodes.setdefault(method, [])
        for env_seed in starts:
            for noise_seed in noise_seeds:
                ep = run_episode(net, env, env_seed, noise_seed, method, execution, rules.get(method))
                played.append(ep)
                log(f"{method} start {env_seed} noise {noise_seed}: coverage {ep.max_coverage:.3f} "
                    f"{'success' if ep.success else ''} steps {ep.steps}")
    return result


def markdown(figures: dict[str, Any], count: int, baseline: str = "single") -> str:
    """The reducer table: coverage, success, episodes above 0.8 and the paired difference against ``baseline``."""
    lines = [f"| method | mean max coverage (95 %) | success (Wilson 95 %) | coverage >= 0.8 | paired vs {baseline}: "
             "coverage (95 %), success |", "|---|---|---|---|---|"]
    versus = figures.get(f"versus_{baseline}", {})
    for name, f in figures["methods"].items():
        low, high = f["coverage_mean_ci95"]
        s_low, s_high = f["success_rate_ci95"]
        label = f"`{name}`" + ("" if name == "single" else f"@{count}")
        against = ""
        if name in versus:
            p = versus[name]
            c_low, c_high = p["coverage_diff_ci95"]
            against = f"{p['coverage_diff_mean']:+.3f} ({c_low:+.3f}..{c_high:+.3f}), {p['success_diff']:+.0%}"
        lines.append(f"| {label} | {f['coverage_mean']:.3f} ({low:.3f}..{high:.3f}) | {f['successes']}/{f['episodes']}"
                     f" ({s_low:.0%}..{s_high:.0%}) | {f['above_0_8']}/{f['episodes']} | {against} |")
    return "\n".join(lines) + "\n"
