"""Completion of a finished group: from its candidates to its one result, or to the named error it fails with.

The scheduler (:mod:`.scheduler`) decides *when* a group is done; this module decides *what* it returns. Once every
candidate is out of the model, the candidates are screened (invalid ones dropped, limits clamped), reduced in the
space the reducer is valid in, the reduced trajectory is checked again, and the group's typed reports (counters,
steps, the adapter's extras, validity, continuity, uncertainty) are bundled into the :class:`EnsembleResult`. A
failure anywhere becomes one named error for the whole group, never a partial result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..contract import EnsembleResult
from ..errors import GroupFailedError, GroupOutOfMemoryError, TrajectoryEnsembleError
from ..metrics import now_ms
from ..uncertainty import group_uncertainty
from .adapter import OBSERVATION_EMBEDDING, CandidateModelAdapter
from .deadline import StepCosts
from .reduction import reduce_candidates
from .request import GroupRequest
from .run import GroupRun
from .validity import DEFAULT_CHECK, check_reduced, screen_candidates, to_model_space, validity_counts


def complete_group(run: GroupRun, adapter: CandidateModelAdapter, device: torch.device,
                   costs: StepCosts) -> EnsembleResult:
    """The result of a group whose candidates are all out of the model (``run.outputs`` complete).

    Args:
        run (`GroupRun`): The finished group.
        adapter (`CandidateModelAdapter`): The model (its reduce space and weights version).
        device (`torch.device`): Device whose peak memory the counters report.
        costs (`StepCosts`): Measured costs; the post-processing time of this group is added.

    Raises:
        TrajectoryEnsembleError: too few valid candidates, a reduced trajectory that breaks its limits, ...; any
            other exception is the caller's to name (:func:`named_failure`).
    """
    candidates = torch.cat([out.candidates for out in run.outputs], dim=0)
    extras: dict[str, Any] = {}
    for out in run.outputs:
        extras.update(out.extras)
    started = now_ms()

    def reports() -> Sequence[Any]:  # once reduced: the post-processing time includes the reduction's
        reduce_ms = now_ms() - started
        costs.observe("post_ms", reduce_ms + float(run.outputs[-1].extras.get("postprocess_ms", 0.0)))
        return run.reports(reduce_ms, extras, device, adapter.weights_version)

    return finish_group(run.request, candidates, reports=reports, embedding=extras.get(OBSERVATION_EMBEDDING),
                        rollout=extras.get("rollout"),
                        reduce_before_denormalize=adapter.capabilities.reduce_before_denormalize)


def finish_group(request: GroupRequest, candidates: torch.Tensor, *, reduce_before_denormalize: bool,
                 reports: Callable[[], Sequence[Any]] = tuple, embedding: torch.Tensor | None = None,
                 rollout: Any = None, metrics: dict[str, Any] | None = None) -> EnsembleResult:
    """A group's result from its candidates, by the engine's rule wherever they came from (the engine's model, or one
    remote request per sample): screened (invalid ones dropped, limits clamped), the survivors reduced in the space
    the reducer is valid in, the reduced trajectory checked again, then the reports.

    Args:
        request (`GroupRequest`): The group (spec, reducer, normalizer, validity, context, novelty).
        candidates (`torch.Tensor` of shape `[N, H, D]`): Model-space candidates; a missing one is NaN.
        reduce_before_denormalize (`bool`): The model's declared space for ``"any"`` reducers.
        reports (`Callable[[], Sequence[Any]]`): Called once reduced: the reports of how the group ran, first in the
            result (then validity, continuity and uncertainty).
        embedding (`torch.Tensor`, *optional*): The observation embedding, for the novelty scorer.
        rollout (`Any`, *optional*): The group's recorded rollout.
        metrics (`dict[str, Any]`, *optional*): Entries the result's metrics carry beyond its reports.

    Raises:
        TooFewValidCandidatesError: fewer than the quorum passed. ReducedTrajectoryInvalidError: the reduced
            trajectory broke a limit.
    """
    # Invalid candidates (always NaN/Inf; limits when given) are dropped before the reducer sees them.
    check = request.validity or DEFAULT_CHECK
    screening = screen_candidates(candidates, request.normalizer, check, request.request_id)
    action, reduced_raw = reduce_candidates(screening.survivors, request.spec, request.reducer, request.normalizer,
                                            reduce_before_denormalize=reduce_before_denormalize,
                                            context=request.context)
    candidates = reduced_raw if screening.raw is None else screening.raw
    if request.reducer is None and screening.raw is not None:
        action = screening.raw[0].clone()  # the plain path publishes its (clamped) candidate untouched
    action, action_clamped = check_reduced(action, check, request.request_id)
    found: list[Any] = [*reports(), validity_counts(screening.report, action_clamped)]
    if request.context is not None:
        model_action = action if request.normalizer is None else to_model_space(action, request.normalizer)
        found.append(request.context.report(model_action))
    # In model (normalized) space, over the candidates that were reduced.
    found.append(group_uncertainty(screening.survivors, request.uncertainty_threshold, request.novelty, embedding))
    return EnsembleResult(
        group=request.group,
        spec=request.spec,
        action=action.float().cpu(),
        candidate_ids=request.group.candidate_ids,
        seeds=request.seeds,
        candidates=candidates.float().cpu() if request.spec.return_candidates else None,
        base_seed=request.base_seed,
        rollout=rollout,
        candidate_valid=screening.valid,
        verdicts=screening.report.verdicts,
        reports=tuple(found),
        metrics=dict(metrics or {}),
    )


def named_failure(run: GroupRun, exc: BaseException, stage: str) -> BaseException:
    """``exc`` as the group's error: a package error as it is, out-of-memory as ``GroupOutOfMemoryError``, anything
    else as ``GroupFailedError`` naming the stage and the cause.

    Args:
        run (`GroupRun`): The group that failed.
        exc (`BaseException`): What was raised.
        stage (`str`): What the group was doing (``"denoising"``, ``"post-processing"``, ``"reducing"``).
    """
    if isinstance(exc, TrajectoryEnsembleError):
        return exc
    request_id = run.request.request_id
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        error: GroupFailedError = GroupOutOfMemoryError(request_id, f"out of memory while {stage}: {exc}")
    else:
        error = GroupFailedError(request_id, f"{type(exc).__name__} while {stage}: {exc}")
    error.__cause__ = exc
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return error
