"""``calibrate --bag``'s reducer and ``mode`` threshold: chosen on the calibration bags' recorded actions, reported on
the held-out bags'.

Chunks back in normalized space, aligned with the recording as ``replay --reference-topic`` does, ranked among their
group's own candidates; the default ``mode`` stays unless a variant's paired rank difference has a bootstrap 95 %
interval wholly below 0. Why the rank and not the RMSE: docs/replay-tests.md, "Calibration from bags".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ReducerLayoutError
from ..normalization import ActionNormalizer
from ..reducers import ReducerVariant, get_reducer, parse_variants, reduce_variants
from ..reducers.variants import SINGLE, variant_table
from ..stats import bootstrap_mean

DEFAULT_VARIANTS = "single,mean,median,trimmed_mean,medoid,mode,mode@0.025,mode@0.05,mode@0.1,mode@0.2,mode@0.4"
"""What ``--reducer-variants`` compares by default: every width-free reducer, ``mode``'s relative rule, and fixed
cuts around the former default 0.2 (normalized units)."""


def usable_variants(text: str, width: int) -> tuple[ReducerVariant, ...]:
    """The variants of ``text`` whose reducer accepts ``width``-wide actions (``pose_gripper`` needs 10).

    Raises:
        InvalidSpecError, UnknownReducerError: ``text`` names a bad variant (:func:`parse_variants`).
    """
    kept = []
    for variant in parse_variants(text):
        if variant.reducer != SINGLE:
            try:
                get_reducer(variant.reducer).check_layout(width)
            except ReducerLayoutError:
                continue
        kept.append(variant)
    return tuple(kept)


def to_normalized(candidates: np.ndarray, normalizer: ActionNormalizer | None) -> torch.Tensor:
    """``[N, H, D]`` candidates as returned (robot units with a normalizer) back in normalized space, unclamped."""
    tensor = torch.as_tensor(np.asarray(candidates, dtype=np.float32))
    if normalizer is None:
        return tensor
    zero = torch.zeros(1, tensor.shape[-1])
    offset = normalizer.denormalize(zero)[0]
    scale = normalizer.denormalize(zero + 1.0)[0] - offset
    return (tensor - offset) / scale


@dataclass(frozen=True)
class GoalErrors:
    """One goal against the recording: each variant's errors and each candidate's, ``[compared rows, channels]``."""

    variants: dict[str, np.ndarray]
    candidates: tuple[np.ndarray, ...]

    def rmse(self, label: str) -> float:
        """The variant's RMSE over this goal's compared rows."""
        return float(np.sqrt(np.mean(self.variants[label] ** 2)))

    def rank(self, label: str) -> int:
        """``1 +`` the number of candidates strictly closer to the recording than the variant's chunk."""
        served = self.rmse(label)
        return 1 + sum(float(np.sqrt(np.mean(c * c))) < served for c in self.candidates)


def goal_errors(report: Any, variants: Sequence[ReducerVariant], normalizer: ActionNormalizer | None,
                selectors: tuple[str, ...] | None = None) -> list[GoalErrors]:
    """Each succeeded goal with candidates whose chunk overlaps the recording, compared with it.

    Args:
        report (`ReplayReport`): A replay with ``reference_series`` and returned candidates.
        variants (`Sequence[ReducerVariant]`): What to compare.
        normalizer (`ActionNormalizer`, *optional*): The node's action statistics (``None``: it serves normalized).
        selectors (`tuple[str, ...]`, *optional*): ``--reference-channels``.

    Raises:
        ReferenceError: The served channels do not match the recording.
    """
    from ..replay.open_loop import compare_goal, match_channels

    series = report.reference_series
    done = [g for g in report.goals if g.status == "SUCCEEDED" and g.candidates is not None
            and g.stamp_ns is not None]
    if series is None or not done:
        return []
    channels = match_channels(series, done[0].trajectory.shape[1], report.served_names, selectors)
    out = []
    for goal in done:
        stats = None if goal.normalized else normalizer
        chunks = reduce_variants(to_normalized(goal.candidates, stats), variants, stats)

        def errors(chunk: np.ndarray) -> np.ndarray:
            return compare_goal(goal.index, goal.stamp_ns, goal.dt, chunk, None, series, channels).errors

        compared = GoalErrors({label: errors(chunk.numpy()) for label, chunk in chunks.items()},
                              tuple(errors(np.asarray(c, dtype=np.float64)) for c in goal.candidates))
        if all(e.size for e in compared.variants.values()):
            out.append(compared)
    return out


def _rmse(goals: Sequence[GoalErrors], label: str) -> float | None:
    if not goals:
        return None
    values = np.concatenate([g.variants[label] for g in goals], axis=0)
    return float(np.sqrt(np.mean(values * values)))


def _figures(goals: Sequence[GoalErrors], label: str) -> dict[str, Any]:
    ranks = [g.rank(label) for g in goals]
    figures: dict[str, Any] = {"goals": len(goals), "rmse": _rmse(goals, label),
                               "served_rank": float(np.mean(ranks)) if ranks else None}
    if ranks:
        figures["served_rank_ci95"] = list(bootstrap_mean(ranks, seed=0))
    figures["ranks"] = ranks
    return figures


def _versus_single(goals: Sequence[GoalErrors], label: str) -> dict[str, Any] | None:
    if not goals or label == SINGLE or SINGLE not in goals[0].variants:
        return None
    differences = np.asarray([g.rank(label) - g.rank(SINGLE) for g in goals], dtype=np.float64)
    low, high = bootstrap_mean(differences, seed=0)
    return {"mean_rank_difference": float(differences.mean()), "ci95": [low, high], "goals": int(differences.size),
            "better": int((differences < 0).sum()), "worse": int((differences > 0).sum())}


def _pick(goals: Sequence[GoalErrors], table: Mapping[str, Mapping[str, Any]], variants: Sequence[ReducerVariant],
          default: ReducerVariant) -> ReducerVariant:
    """``default``, unless some of ``variants`` rank better on ``goals`` beyond chance (then the best of those)."""
    def clearly_better(variant: ReducerVariant) -> bool:
        if variant == default:
            return False
        differences = [g.rank(variant.label) - g.rank(default.label) for g in goals]
        return bool(np.mean(differences) < 0 and bootstrap_mean(differences, seed=0)[1] < 0)

    def key(variant: ReducerVariant) -> tuple[float, float]:
        figures = table[variant.label]["calibration"]
        return figures["served_rank"], figures["rmse"]

    better = [v for v in variants if clearly_better(v)]
    return min(better, key=key) if better else default  # min keeps the first of equal keys


def choose(calibration: Sequence[GoalErrors], heldout: Sequence[GoalErrors],
           variants: Sequence[ReducerVariant]) -> dict[str, Any]:
    """The ``reducer`` section of the record (module docstring, step 3).

    Raises:
        ValueError: No calibration goal was compared with the recording.
    """
    if not calibration:
        raise ValueError("no calibration goal could be compared with the recorded actions (no succeeded goal with "
                         "candidates overlaps the reference topic in time)")
    table: dict[str, dict[str, Any]] = {}
    for label, described in variant_table(variants).items():
        table[label] = {**described, "calibration": _figures(calibration, label),
                        "heldout": {**_figures(heldout, label), "versus_single": _versus_single(heldout, label)}}

    default = next((v for v in variants if v.reducer == "mode" and v.mode_threshold is None), variants[0])
    best = _pick(calibration, table, variants, default)
    modes = [v for v in variants if v.reducer == "mode"]
    best_mode = _pick(calibration, table, modes, default if default in modes else modes[0]) if modes else None
    return {
        "recommended": best.label,
        "reducer": best.reducer if best.reducer != SINGLE else "none",
        "mode_threshold": None if best_mode is None else (best_mode.mode_threshold or 0.0),
        "mode_recommended": None if best_mode is None else best_mode.label,
        "default": default.label,
        "heldout": table[best.label]["heldout"],
        "criterion": "served rank: 1 + the group's candidates strictly closer to the recorded actions (RMSE over "
                     "the compared rows, robot units). The default stays unless a variant's per-goal rank minus the "
                     "default's has a bootstrap 95% interval below 0 on the calibration goals; of those, the lowest "
                     "mean rank. mode_threshold: the same among the mode variants, 0 = the relative rule (the node's "
                     "mode_threshold parameter). versus_single: per held-out goal, rank minus candidate 0's, mean "
                     "and bootstrap 95% interval",
        "variants": table,
    }


def markdown_lines(section: Mapping[str, Any]) -> list[str]:
    """The reducer section of the ``calibrate --bag`` summary."""
    threshold = section["mode_threshold"]
    mode = "-" if threshold is None else f"{threshold:g} (`{section['mode_recommended']}`; 0 = the relative rule)"
    lines = ["", f"Reducer: `{section['recommended']}`; mode_threshold: {mode}. The default `{section['default']}` "
             "stays unless a variant ranks better on the calibration goals beyond chance (rank: 1 + the group's "
             "candidates closer to the recorded actions).", "",
             "| variant | rank, calibration | rank, held-out [95%] | held-out rank vs single [95%] | RMSE cal. | "
             "RMSE held-out |", "|---|---|---|---|---|---|"]

    def fmt(value: float | None, digits: int = 4) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    for label, row in section["variants"].items():
        cal, held = row["calibration"], row["heldout"]
        versus = held["versus_single"]
        paired = "-" if versus is None else (f"{versus['mean_rank_difference']:+.2f} [{versus['ci95'][0]:+.2f}, "
                                             f"{versus['ci95'][1]:+.2f}]")
        interval = (f" [{held['served_rank_ci95'][0]:.2f}, {held['served_rank_ci95'][1]:.2f}]"
                    if "served_rank_ci95" in held else "")
        lines.append(f"| `{label}` | {fmt(cal['served_rank'], 2)} | {fmt(held['served_rank'], 2)}{interval} | "
                     f"{paired} | {fmt(cal['rmse'])} | {fmt(held['rmse'])} |")
    return lines
