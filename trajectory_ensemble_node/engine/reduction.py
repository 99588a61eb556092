"""From a finished group's candidates to its one action: finiteness, normalization space, reducer."""

from __future__ import annotations

import torch

from ..contract import CandidateTrajectorySpec, check_finite
from ..normalization import ActionNormalizer
from ..reducers import ContinuityReference, Reducer
from .context import ExecutionContext


def reduce_candidates(
    candidates: torch.Tensor,
    spec: CandidateTrajectorySpec,
    reducer: Reducer | None,
    normalizer: ActionNormalizer | None,
    *,
    reduce_before_denormalize: bool,
    context: ExecutionContext | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduce ``[N, H, D]`` model-space candidates to one ``[H, D]`` action, in the space the reducer is valid in.

    Reducers declared for ``"raw"`` space (e.g. ``pose_gripper``, whose rotations only mean something in robot
    units) run after denormalization, ``"normalized"`` ones (distance-based: medoid, mode) before it, and ``"any"``
    ones where the adapter declares (``reduce_before_denormalize``); they commute with the affine denormalization,
    so the answer is the same either way up to rounding.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Float32 candidates in the model's normalized space.
        spec (`CandidateTrajectorySpec`): The group's spec.
        reducer (`Reducer`, *optional*): ``None`` only for ``reducer="none"`` (count == 1).
        normalizer (`ActionNormalizer`, *optional*): When given, both outputs are in robot units.
        reduce_before_denormalize (`bool`): The adapter's declared default space.
        context (`ExecutionContext`, *optional*): The chunk being executed (normalized space). Continuity-aware
            reducers (``uses_context``, all declared ``"normalized"``) get it as a :class:`ContinuityReference`.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: the reduced action ``[H, D]`` and the candidates ``[N, H, D]``, both
        denormalized when a normalizer is given.

    Raises:
        NonFiniteCandidatesError: any candidate holds NaN or Inf; nothing is reduced.
    """
    check_finite(candidates)
    raw = normalizer.denormalize(candidates) if normalizer is not None else candidates
    if reducer is None:
        return raw[0].clone(), raw
    reference = None
    if reducer.uses_context and context is not None:
        horizon = candidates.shape[1]
        reference = ContinuityReference(context.target(horizon).to(candidates), context.weights(horizon).to(candidates))
    in_normalized_space = reducer.space == "normalized" or (reducer.space == "any" and reduce_before_denormalize)
    if normalizer is None or not in_normalized_space:
        return reducer(raw, reference), raw
    return normalizer.denormalize(reducer(candidates, reference)), raw
