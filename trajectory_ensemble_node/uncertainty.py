"""How much a group's candidates disagree: a nearly free uncertainty signal, computed in normalized space.

FIPER (NeurIPS 2025) and the STAC/Sentinel line of work detect policy failures from the spread of sampled action
chunks. A bimodal task makes the plain spread useless on its own: two valid modes are far apart by design. So the
modes are found first (:func:`~trajectory_ensemble_node.reducers.mode_clusters`, the ``mode`` reducer's own
clustering) and the score measures what is left once the modes are accounted for.

Quantities (candidates ``x_i`` ``[H, D]`` in normalized space, ``rms(a, b) = ||a - b||_F / sqrt(H * D)``):

- ``uncertainty_modes``: number of clusters at the ``mode`` threshold;
- ``uncertainty_mode_share``: the largest cluster's share of the candidates (the one ``mode`` executes);
- ``uncertainty_spread``: mean pairwise ``rms`` over all candidate pairs;
- ``uncertainty_step_std``: per step, the across-candidate standard deviation averaged over channels (``[H]``);
- ``uncertainty_score``: the mean ``rms`` distance from each candidate to its nearest other candidate (a
  nearest-neighbour spread). A bimodal set of tight modes scores low; scattered candidates score high. N = 1 has no
  spread: 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .reducers import MODE_DISTANCE_THRESHOLD, mode_clusters


@dataclass(frozen=True)
class Uncertainty:
    """Disagreement of one group's candidates (definitions in the module docstring).

    Args:
        modes (`int`), mode_share (`float`), spread (`float`), step_std (`tuple[float, ...]`, length H),
        score (`float`), candidates (`int`): how many candidates it was computed from.
    """

    modes: int
    mode_share: float
    spread: float
    step_std: tuple[float, ...]
    score: float
    candidates: int

    def __post_init__(self) -> None:
        for name in ("mode_share", "spread", "score"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"uncertainty {name} must be finite and >= 0, got {value!r}")

    def metrics(self, threshold: float | None = None) -> dict[str, float | int | bool | str]:
        """Flat metrics entries; with ``threshold``, also ``uncertain`` (score above it) and the threshold."""
        out: dict[str, float | int | bool | str] = {
            "uncertainty_modes": self.modes,
            "uncertainty_mode_share": self.mode_share,
            "uncertainty_spread": self.spread,
            "uncertainty_step_std": ",".join(f"{v:.4g}" for v in self.step_std),
            "uncertainty_step_std_max": max(self.step_std) if self.step_std else 0.0,
            "uncertainty_score": self.score,
        }
        if threshold is not None:
            out["uncertainty_threshold"] = float(threshold)
            out["uncertain"] = bool(self.score > threshold)
        return out


def estimate_uncertainty(candidates: torch.Tensor, threshold: float = MODE_DISTANCE_THRESHOLD) -> Uncertainty:
    """Uncertainty of a group from its (valid) candidates.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates in normalized (model) space.
        threshold (`float`): Cluster diameter for the mode count (the ``mode`` reducer's default).

    Returns:
        `Uncertainty`
    """
    if candidates.ndim != 3 or candidates.shape[0] < 1:
        raise ValueError(f"candidates must be [N >= 1, H, D], got shape {tuple(candidates.shape)}")
    x = candidates.detach().to("cpu", torch.float64)
    n, horizon = x.shape[0], x.shape[1]
    if n == 1:
        return Uncertainty(1, 1.0, 0.0, tuple(0.0 for _ in range(horizon)), 0.0, 1)
    flat = x.reshape(n, -1)
    distance = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist") / math.sqrt(flat.shape[1])
    off = ~torch.eye(n, dtype=torch.bool)
    spread = float(distance[off].mean())
    nearest = float(distance.masked_fill(~off, math.inf).min(dim=1).values.mean())
    clusters = mode_clusters(x, threshold)
    step_std = x.std(dim=0, unbiased=False).mean(dim=-1)
    return Uncertainty(
        modes=len(clusters),
        mode_share=max(len(c) for c in clusters) / n,
        spread=spread,
        step_std=tuple(float(v) for v in step_std),
        score=nearest,
        candidates=n,
    )
