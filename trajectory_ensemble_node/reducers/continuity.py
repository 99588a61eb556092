"""Continuity-aware selection: which candidate (or mode) continues the chunk being executed.

Both reducers here are ``uses_context`` reducers (see :mod:`trajectory_ensemble_node.reducers`). They score candidates by BID's backward
coherence (Liu et al. 2024): the weighted squared distance to the previous chunk over the overlap,
``score_i = sum_k w_k * ||c_i[k] - y[k]||^2 / sum_k w_k``, with the execution context's weights (1 on the frozen
actions, a decaying ramp, then 0). Scores are in float64 on CPU so ties are device-independent; ties go to the
lowest candidate position.

Squared, where the reference BID code averages the unsquared L2 norm per action: it is the objective the guidance
pulls every candidate toward (the weighted squared gap), and it weighs one large deviation (a seam the controller
feels as a jump) above the same total spread over several actions, which the unsquared mean would prefer. On the
toy closed loop the two pick differently in 9 of 30 episodes and change nothing measurable (``docs/closed-loop.md``,
"The BID score").

- ``backward_coherence``: the candidate with the lowest score (an exact copy: a trajectory the model produced).
- ``mode_continuity``: cluster like ``mode`` (:func:`~trajectory_ensemble_node.reducers.mode_clusters`: complete
  linkage, by default at the relative cut, or at a fixed ``threshold``); keep the cluster with the lowest
  mean member score, i.e. the mode the committed prefix is on as a whole, and return its member with the lowest
  score: a trajectory the model produced, and within the mode the one that joins the prefix best (with guidance
  every member's frozen actions equal the previous chunk's, so the score ranks the guided ramp, i.e. the seam).
  Why not the members' mean, as ``mode`` returns: in closed loop on the toy task the mean stalled short of the
  target in 17 of 50 episodes, the member in none (``docs/closed-loop.md``).

Without a reference (an episode's first chunk) they fall back to ``medoid`` and ``mode``.

Continuity has four homes, one per layer; the others are :mod:`trajectory_ensemble_node.engine.context` (the value
type and the alignment math); :mod:`trajectory_ensemble_node.models.cosmos3.guidance` (guided denoising in the
adapter); :mod:`trajectory_ensemble_node.serving.continuity` (the face's memory of its last chunk, the rules to continue
it).
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
