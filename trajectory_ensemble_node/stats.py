"""The statistics every report of this project uses: intervals, conformal thresholds and AUROC.

One home, so a rate in the README, a false-alarm rate from ``calibrate`` and a success rate from the closed-loop bench
carry the same interval. Plain numpy; nothing here imports torch or rclpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

Z95 = 1.959963984540054
"""The standard normal quantile of a two-sided 95 % interval."""
BOOTSTRAP_SAMPLES = 2000


def wilson(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial rate (95% by default); ``(0, 1)`` for no trials."""
    if trials == 0:
        return (0.0, 1.0)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap 95% interval of the mean of ``values`` (:data:`BOOTSTRAP_SAMPLES` resamples)."""
    data = np.asarray(values, dtype=np.float64)
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, len(data), size=(BOOTSTRAP_SAMPLES, len(data)))].mean(axis=1)
    return (float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975)))


def conformal_threshold(scores: Sequence[float], alpha: float) -> float:
    """The ``ceil((1 - alpha)(n + 1))``-th smallest calibration score (``inf`` when that rank exceeds ``n``).

    Args:
        scores (`Sequence[float]`): Calibration scores, one per exchangeable sample (e.g. per successful episode).
        alpha (`float`): Target false-alarm rate, in (0, 1).

    Raises:
        ValueError: no scores, or ``alpha`` outside (0, 1).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    ordered = sorted(float(s) for s in scores)
    if not ordered:
        raise ValueError("no calibration scores")
    rank = math.ceil((1 - alpha) * (len(ordered) + 1))
    return ordered[rank - 1] if rank <= len(ordered) else math.inf


def auroc(negatives: Sequence[float], positives: Sequence[float]) -> float:
    """P(positive score > negative score) + 1/2 P(tie): the area under the ROC curve (Mann-Whitney); NaN if a side
    is empty."""
    neg, pos = np.asarray(negatives, dtype=np.float64), np.asarray(positives, dtype=np.float64)
    if not len(neg) or not len(pos):
        return math.nan
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(neg) * len(pos)))


def _auroc_matrix(labels: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """AUROC of each row of ``scores`` ``[B, n]`` against the matching row of boolean ``labels`` ``[B, n]``."""
    order = np.argsort(scores, axis=1, kind="mergesort")
    ranked = np.take_along_axis(scores, order, axis=1)
    ranks = np.empty_like(scores)
    for row in range(scores.shape[0]):
        # Average ranks over ties (Mann-Whitney counts a tie one half).
        _, first, counts = np.unique(ranked[row], return_index=True, return_counts=True)
        ranks[row, order[row]] = np.repeat(first + (counts + 1) / 2.0, counts)
    pos = labels.sum(axis=1).astype(np.float64)
    neg = labels.shape[1] - pos
    rank_sum = np.where(labels, ranks, 0.0).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


def paired_bootstrap_auroc(labels: Sequence[bool], scores_a: Sequence[float], scores_b: Sequence[float],
                           seed: int = 0) -> dict[str, object]:
    """AUROC of two scores on the same labelled samples, with percentile bootstrap 95 % intervals.

    Args:
        labels (`Sequence[bool]`): True for a positive sample (e.g. a failed episode).
        scores_a (`Sequence[float]`), scores_b (`Sequence[float]`): Two scores of the same samples.
        seed (`int`): Seeds the resampling (:data:`BOOTSTRAP_SAMPLES` resamples of the samples, with replacement;
            a resample without both classes is left out).

    Returns:
        `dict`: ``a``, ``b``, ``difference`` (``a - b``) on the data, and ``ci_a``, ``ci_b``, ``ci_difference``.
    """
    y = np.asarray(labels, dtype=bool)
    a, b = np.asarray(scores_a, dtype=np.float64), np.asarray(scores_b, dtype=np.float64)
    if not (len(y) == len(a) == len(b)):
        raise ValueError(f"labels and scores must have one entry per sample, got {len(y)}, {len(a)}, {len(b)}")
    point_a, point_b = auroc(a[~y], a[y]), auroc(b[~y], b[y])
    index = np.random.default_rng(seed).integers(0, len(y), size=(BOOTSTRAP_SAMPLES, len(y)))
    ys = y[index]
    keep = ys.any(axis=1) & (~ys).any(axis=1)
    ya, yb = _auroc_matrix(ys[keep], a[index][keep]), _auroc_matrix(ys[keep], b[index][keep])

    def ci(values: np.ndarray) -> list[float]:
        return [float(np.quantile(values, 0.025)), float(np.quantile(values, 0.975))] if len(values) else [
            math.nan, math.nan]

    return {"a": point_a, "b": point_b, "difference": point_a - point_b, "ci_a": ci(ya), "ci_b": ci(yb),
            "ci_difference": ci(ya - yb)}
