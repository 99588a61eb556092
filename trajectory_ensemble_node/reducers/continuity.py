"""Continuity-aware selection: which candidate (or mode) continues the chunk being executed.

``backward_coherence`` and ``mode_continuity`` score candidates by BID's backward coherence, squared and weighted by
the execution context (docs/closed-loop.md, "The BID score"); scores are float64 on CPU and ties go to the lowest
position. Without a reference they fall back to ``medoid`` and ``mode``. Continuity's other homes are listed in
:mod:`trajectory_ensemble_node.serving.continuity`.
"""

from __future__ import annotations

import torch

from .basic import medoid_reduce, mode_clusters, mode_reduce
from .types import ContinuityReference, Reducer


def coherence_scores(candidates: torch.Tensor, reference: ContinuityReference) -> torch.Tensor:
    """Backward-coherence score of each candidate (lower is more continuous).

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        reference (`ContinuityReference`): Target ``[H, D]`` and weights ``[H]``.

    Returns:
        `torch.Tensor` of shape `[N]`, float64 CPU: weighted mean squared distance over the overlap (all zeros when
        every weight is 0, i.e. nothing to continue).
    """
    work = candidates.detach().to("cpu", torch.float64)
    target = reference.target.detach().to("cpu", torch.float64)
    weights = reference.weights.detach().to("cpu", torch.float64)
    per_action = ((work - target) ** 2).sum(dim=-1)  # [N, H]
    total = float(weights.sum())
    if total == 0.0:
        return torch.zeros(work.shape[0], dtype=torch.float64)
    return (per_action * weights).sum(dim=-1) / total


def backward_coherence_reduce(candidates: torch.Tensor, reference: ContinuityReference | None) -> torch.Tensor:
    """``backward_coherence``: the candidate nearest the previous chunk over the overlap (``medoid`` without one).

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        reference (`ContinuityReference`, *optional*): The previous chunk at the new chunk's times.

    Returns:
        `torch.Tensor` of shape `[H, D]`: a copy of the chosen candidate.
    """
    if reference is None:
        return medoid_reduce(candidates)
    scores = coherence_scores(candidates, reference)
    return candidates[int(torch.argmin(scores))].clone()


def mode_continuity_reduce(
    candidates: torch.Tensor, reference: ContinuityReference | None, threshold: float | None = None
) -> torch.Tensor:
    """``mode_continuity``: in the cluster whose members are, on average, nearest the previous chunk, the member
    nearest it.

    Clusters are :func:`~trajectory_ensemble_node.reducers.mode_clusters`; equal mean scores go to the larger
    cluster, then to the one holding the lowest position; equal member scores go to the lowest position. Without a
    reference this is ``mode``.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        reference (`ContinuityReference`, *optional*): The previous chunk at the new chunk's times.
        threshold (`float`, *optional*): A fixed cluster diameter (RMS, action units), as for ``mode``; ``None``:
            the relative rule of :func:`~trajectory_ensemble_node.reducers.relative_mode_threshold`.

    Returns:
        `torch.Tensor` of shape `[H, D]`: a copy of the chosen candidate (with a reference).
    """
    if reference is None:
        return mode_reduce(candidates, threshold)
    scores = coherence_scores(candidates, reference)
    clusters = mode_clusters(candidates, threshold)
    # min() keeps the first of equal keys; clusters come ordered by their lowest position, members ascending.
    chosen = min(clusters, key=lambda members: (float(scores[list(members)].mean()), -len(members)))
    best = min(chosen, key=lambda member: float(scores[member]))
    return candidates[best].clone()


BUILTIN: tuple[Reducer, ...] = (
    Reducer(
        "backward_coherence",
        backward_coherence_reduce,
        streaming=False,
        space="normalized",
        description="candidate nearest the previous chunk over the overlap (BID); medoid without one",
        uses_context=True,
    ),
    Reducer(
        "mode_continuity",
        mode_continuity_reduce,
        streaming=False,
        space="normalized",
        description="in the cluster nearest the previous chunk over the overlap, its nearest member; mode without one",
        uses_context=True,
    ),
)
"""The continuity-aware reducers, in the registry's order."""
