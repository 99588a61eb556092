"""One closed-loop PushT episode of one method, as ``bench --pusht`` records it (in process, over the wire or
through the node), and the paired comparison of two methods' episodes that the bench and the oracle both report."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trajectory_ensemble_node.stats import bootstrap_mean


@dataclass
class BenchEpisode:
    """One closed-loop episode of one method.

    Args:
        env_seed (`int`): gym-pusht reset seed.
        steps (`int`): Control steps taken.
        max_coverage (`float`): Highest ``info["coverage"]``.
        success (`bool`): ``info["is_success"]`` at some step.
        seams (`list[float]`): Seam jumps at chunk take-overs (env pixels).
        group_ms (`list[float]`): Wall time of each request.
        actions (`list[list[float]]`): The executed targets ``[steps, 2]`` (env pixels).
    """

    env_seed: int
    steps: int = 0
    max_coverage: float = 0.0
    success: bool = False
    seams: list[float] = field(default_factory=list)
    group_ms: list[float] = field(default_factory=list)
    actions: list[list[float]] = field(default_factory=list)


def paired_outcomes(a: Mapping[Hashable, tuple[float, bool]], b: Mapping[Hashable, tuple[float, bool]],
                    what: str = "start") -> dict[str, Any]:
    """``b`` minus ``a`` on the keys both played, each key one (max coverage, success) of each method.

    Args:
        a (`Mapping`): Key (a start, or a start and a noise seed) to the first method's outcome.
        b (`Mapping`): The same for the second method.
        what (`str`): What a key is, for the error.

    Returns:
        `dict`: ``pairs``, ``coverage_diff_mean`` and ``success_diff`` with bootstrap 95 % intervals over the pairs
        (``coverage_diff_ci95``, ``success_diff_ci95``), ``only_b_succeeded`` and ``only_a_succeeded``.

    Raises:
        ValueError: the two share no key.
    """
    keys = sorted(set(a) & set(b))
    if not keys:
        raise ValueError(f"the two methods share no {what}")
    coverage = [b[k][0] - a[k][0] for k in keys]
    success = [float(b[k][1]) - float(a[k][1]) for k in keys]
    return {"pairs": len(keys), "coverage_diff_mean": float(np.mean(coverage)),
            "coverage_diff_ci95": list(bootstrap_mean(coverage)), "success_diff": float(np.mean(success)),
            "success_diff_ci95": list(bootstrap_mean(success)),
            "only_b_succeeded": sum(d > 0 for d in success), "only_a_succeeded": sum(d < 0 for d in success)}
