"""``calibrate --bag``'s reducer and ``mode`` threshold: chosen on the calibration bags' recorded actions, reported on
the held-out bags'.

Every goal of the replay returns its candidates, so every reducer can be compared on the same groups without
drawing again (:func:`~trajectory_ensemble_node.reducers.reduce_variants`):

1. **Chunks.** Each succeeded goal's candidates are taken back into the model's normalized space (the node's action
   statistics are affine: ``n = (a - denormalize(0)) / (denormalize(1) - denormalize(0))``, unclamped), and every
   variant (``--reducer-variants``: reducers, ``mode`` at its relative rule and at fixed cuts, ``single`` =
   candidate 0) reduces them as the node would, back in robot units.
2. **Error.** Each chunk is aligned with the bag's recorded actions like ``replay --reference-topic`` does
   (:func:`~trajectory_ensemble_node.replay.open_loop.compare_goal`: row ``k`` at ``stamp + (k + 1) dt``); a
   variant's error is the RMSE over every compared row and channel of the calibration goals.
3. **Choice.** The reducer: the variant with the lowest calibration RMSE (the first listed on a tie). The ``mode``
   threshold: the ``mode`` variant with the lowest (``0``: the relative rule), what the node's ``mode_threshold``
   parameter serves. Both are reported with the held-out bags' RMSE and, per goal, the paired difference against
   ``single`` (mean and bootstrap 95 % interval over goals; negative = closer to the recording than one sample).

A demonstration is one sample of what was possible: a reducer that serves the other valid mode is counted as far
from it. Successful episodes of the team's own robot are the data this choice is for; on a task with several ways to
succeed, more episodes make the comparison fair to every mode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..normalization import ActionNormalizer
from ..reducers import ReducerVariant, parse_variants, reduce_variants
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
    from ..errors import ReducerLayoutError
    from ..reducers import get_reducer

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


def goal_errors(report: Any, variants: Sequence[ReducerVariant], normalizer: ActionNormalizer | None,
                selectors: tuple[str, ...] | None = None) -> list[dict[str, np.ndarray]]:
    """Per succeeded goal with candidates: ``{label: errors [compared rows, channels]}`` against the recording.

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
        chunks = reduce_variants(to_normalized(goal.candidates, None if goal.normalized else normalizer), variants,
                                 None if goal.normalized else normalizer)
        errors = {}
        for label, chunk in chunks.items():
            compared = compare_goal(goal.index, goal.stamp_ns, goal.dt, chunk.numpy(), None, series, channels)
            errors[label] = compared.errors
        if any(e.size for e in errors.values()):
            out.append(errors)
    return out


def _rmse(goals: Sequence[Mapping[str, np.ndarray]], label: str) -> float | None:
    rows = [g[label] for g in goals if g[label].size]
    if not rows:
        return None
    values = np.concatenate(rows, axis=0)
    return float(np.sqrt(np.mean(values * values)))


def _per_goal(goals: Sequence[Mapping[str, np.ndarray]], label: str) -> list[float]:
    return [float(np.sqrt(np.mean(g[label] ** 2))) for g in goals if g[label].size]


def _versus_single(goals: Sequence[Mapping[str, np.ndarray]], label: str) -> dict[str, Any] | None:
    if not goals or SINGLE not in goals[0] or label == SINGLE:
        return None
    differences = np.asarray(_per_goal(goals, label)) - np.asarray(_per_goal(goals, SINGLE))
    low, high = bootstrap_mean(differences, seed=0)
    return {"mean_difference": float(differences.mean()), "ci95": [low, high], "goals": int(differences.size),
            "closer": int((differences < 0).sum()), "farther": int((differences > 0).sum())}


def choose(calibration: Sequence[Mapping[str, np.ndarray]], heldout: Sequence[Mapping[str, np.ndarray]],
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
        table[label] = {**described,
                        "calibration": {"rmse": _rmse(calibration, label), "goals": len(calibration)},
                        "heldout": {"rmse": _rmse(heldout, label) if heldout else None, "goals": len(heldout),
                                    "versus_single": _versus_single(heldout, label)}}
    ranked = [v for v in variants if table[v.label]["calibration"]["rmse"] is not None]
    best = min(ranked, key=lambda v: table[v.label]["calibration"]["rmse"])  # min keeps the first of equals
    modes = [v for v in ranked if v.reducer == "mode"]
    best_mode = min(modes, key=lambda v: table[v.label]["calibration"]["rmse"]) if modes else None
    return {
        "recommended": best.label,
        "reducer": best.reducer if best.reducer != SINGLE else "none",
        "mode_threshold": None if best_mode is None else (best_mode.mode_threshold or 0.0),
        "mode_recommended": None if best_mode is None else best_mode.label,
        "heldout_rmse": table[best.label]["heldout"]["rmse"],
        "heldout_versus_single": table[best.label]["heldout"]["versus_single"],
        "criterion": "lowest RMSE against the recorded actions over the calibration goals' compared rows (robot "
                     "units); mode_threshold: the best mode variant, 0 = the relative rule (the node's "
                     "mode_threshold parameter); held-out figures from the held-out bags, versus_single: per-goal "
                     "RMSE minus candidate 0's, mean and bootstrap 95% interval",
        "variants": table,
    }


def markdown_lines(section: Mapping[str, Any]) -> list[str]:
    """The reducer section of the ``calibrate --bag`` summary."""
    threshold = section["mode_threshold"]
    mode = "-" if threshold is None else f"{threshold:g} (`{section['mode_recommended']}`; 0 = the relative rule)"
    lines = ["", f"Reducer: `{section['recommended']}` (the lowest calibration RMSE against the recorded actions); "
             f"mode_threshold: {mode}.", "", "| variant | calibration RMSE | held-out RMSE | held-out per goal vs single [95%] |",
             "|---|---|---|---|"]

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    for label, row in section["variants"].items():
        versus = row["heldout"]["versus_single"]
        paired = "-" if versus is None else (f"{versus['mean_difference']:+.4f} [{versus['ci95'][0]:+.4f}, "
                                             f"{versus['ci95'][1]:+.4f}]")
        lines.append(f"| `{label}` | {fmt(row['calibration']['rmse'])} | {fmt(row['heldout']['rmse'])} | {paired} |")
    return lines
