"""A goal's action result and last feedback: trajectory or error, and the report (denoising steps, uncertainty,
candidate validity, continuity).

Reads the typed reports back from the node's metrics (``from_metrics``) and maps them onto the result's typed fields,
so a behaviour tree reads ``result.uncertain`` instead of parsing strings. Pure functions (no node, clock or DDS).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from builtin_interfaces.msg import Time
from trajectory_ensemble_msgs.action import GenerateTrajectory
from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateValidity, Continuity, Uncertainty

from ..engine.context import ContinuityReport
from ..engine.deadline import StepsReport
from ..engine.validity import ValidityCounts
from ..errors import ErrorCode
from ..metrics import GroupCounters, numbers_as_sent
from ..novelty import NoveltyReport
from ..safety import REASONS
from ..uncertainty import UncertaintyReport
from .conversions import metrics_key_values, seconds_to_time

NOT_SERVED = "not served"
"""``continuity.status`` of a goal that failed before its continuity was decided (refused, canceled early)."""


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _float(value: Any, default: float = 0.0) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def uncertainty_msg(metrics: Mapping[str, Any]) -> Uncertainty:
    """``Uncertainty`` from the ``uncertainty_*`` and ``novelty_*`` metrics (zeros when absent, e.g. a failed group).

    ``window`` is 1 for a scored goal without an aggregation window (its own scores are the window's), 0 for a goal
    that scored nothing. ``step_std`` carries the values the metrics text carries (4 significant digits).
    """
    report = UncertaintyReport.from_metrics(metrics)
    novelty = report.novelty or NoveltyReport()
    scored = report.score is not None
    score, novelty_score = _float(report.score), _float(novelty.score)
    return Uncertainty(
        score=score,
        threshold=_float(report.threshold),
        modes=_int(report.modes),
        mode_share=_float(report.mode_share),
        spread=_float(report.spread),
        step_std=list(numbers_as_sent(report.step_std or ())),
        novelty_score=novelty_score,
        novelty_threshold=_float(novelty.threshold),
        novel=bool(novelty.novel or False),
        rule=str(report.rule or ""),
        window=_int(report.window) or (1 if scored else 0),
        window_score=_float(report.score_window, score),
        window_novelty_score=_float(novelty.score_window, novelty_score),
    )


def validity_msg(metrics: Mapping[str, Any]) -> CandidateValidity:
    """``CandidateValidity`` from the validity counts; only reasons that dropped something are listed."""
    counts = ValidityCounts.from_metrics(metrics)
    reasons = [reason for reason in REASONS if _int(counts.dropped_for(reason)) > 0]
    return CandidateValidity(
        valid=_int(counts.valid),
        dropped=_int(counts.dropped),
        clamped=_int(counts.clamped),
        drop_reasons=reasons,
        drop_counts=[_int(counts.dropped_for(reason)) for reason in reasons],
        action_clamped=bool(counts.action_clamped or False),
    )


def continuity_msg(metrics: Mapping[str, Any], status: str, previous_stamp: float | None) -> Continuity:
    """``Continuity`` from the ``context_*`` metrics and the node's decision.

    Args:
        metrics (`Mapping[str, Any]`): The group's metrics (``context_*`` and ``seam_jump`` when continued).
        status (`str`): ``continuity.status``: ``"continued"``, ``"not requested"`` or why the goal started fresh.
        previous_stamp (`float`, *optional*): Seconds; the continued chunk's observation stamp.
    """
    report = ContinuityReport.from_metrics(metrics)
    continued = report.continued
    seam = report.seam_jump
    return Continuity(
        continued=continued,
        status=status,
        frozen_actions=_int(report.frozen),
        shift=_int(report.shift),
        guidance=str(report.guidance or "") if continued else "",
        seam_jump=float(seam) if isinstance(seam, (int, float)) and math.isfinite(seam) else math.nan,
        previous_stamp=seconds_to_time(previous_stamp) if continued and previous_stamp is not None else Time(),
    )


def fill_report(response: Any, metrics: Mapping[str, Any], *, continuity_status: str,
                previous_stamp: float | None) -> None:
    """Set ``steps_*``, ``uncertain``, ``uncertainty``, ``validity`` and ``continuity`` on a result.

    Args:
        response (`GenerateTrajectory.Result`): The result being built.
        metrics (`Mapping[str, Any]`): The group's metrics.
        continuity_status (`str`): See :func:`continuity_msg`.
        previous_stamp (`float`, *optional*): See :func:`continuity_msg`.
    """
    steps = StepsReport.from_metrics(metrics)
    response.steps_planned = _int(steps.planned)
    response.steps_fitted = _int(steps.fitted)
    response.steps_used = _int(steps.used)
    response.uncertain = bool(UncertaintyReport.from_metrics(metrics).uncertain or False)
    response.uncertainty = uncertainty_msg(metrics)
    response.validity = validity_msg(metrics)
    response.continuity = continuity_msg(metrics, continuity_status, previous_stamp)


def success_result(trajectory: ActionTrajectory, metrics: Mapping[str, Any], *, base_seed: int,
                   continuity_status: str, previous_stamp: float | None) -> GenerateTrajectory.Result:
    """The result of a succeeded goal: its trajectory, seed, weights version, metrics and typed report.

    Args:
        trajectory (`ActionTrajectory`): What was published on ``~/trajectory``.
        metrics (`Mapping[str, Any]`): The group's metrics with the node's (``goal_ms``, ``continuity``...).
        base_seed (`int`): The group's base seed.
        continuity_status (`str`): See :func:`continuity_msg`.
        previous_stamp (`float`, *optional*): See :func:`continuity_msg`.
    """
    response = GenerateTrajectory.Result(
        error_code=int(ErrorCode.OK), trajectory=trajectory, base_seed=int(base_seed),
        weights_version=int(GroupCounters.from_metrics(metrics).weights_version or 0),
        metrics=metrics_key_values(metrics),
    )
    fill_report(response, metrics, continuity_status=continuity_status, previous_stamp=previous_stamp)
    return response


def done_feedback(response: GenerateTrajectory.Result) -> GenerateTrajectory.Feedback:
    """A succeeded goal's last feedback (``stage: done``): its steps, continuity and metrics, as its result has."""
    return GenerateTrajectory.Feedback(
        step=response.steps_used, total_steps=response.steps_planned, stage="done",
        frozen_actions=response.continuity.frozen_actions, guidance=response.continuity.guidance,
        metrics=response.metrics)


def failure_result(code: int, message: str, *, base_seed: int, weights_version: int,
                   counts: Mapping[str, Any] | None = None,
                   continuity_status: str = NOT_SERVED) -> GenerateTrajectory.Result:
    """The result of a goal that ended without a trajectory (aborted, canceled, preempted, shut down).

    Its ``continuity`` says nothing was continued (``seam_jump`` NaN, as the message defines it) and keeps the status
    the goal was decided with: ``"continued"`` when it was continuing the previous chunk as it failed, why it was to
    start fresh, or :data:`NOT_SERVED` when it failed before that decision (a refused goal).

    Args:
        code (`int`): Its :class:`~trajectory_ensemble_node.errors.ErrorCode`.
        message (`str`): Why, for the operator.
        base_seed (`int`): The group's base seed (0 when the goal never got a plan).
        weights_version (`int`): The model's weights version.
        counts (`Mapping[str, Any]`, *optional*): Validity counts of a group whose candidates were dropped
            (``TOO_FEW_VALID_CANDIDATES``); they fill ``validity`` and ``metrics``.
        continuity_status (`str`): The goal's ``continuity.status`` (see above).
    """
    response = GenerateTrajectory.Result(error_code=int(code), error_message=message, base_seed=int(base_seed),
                                         weights_version=int(weights_version))
    fill_report(response, {}, continuity_status=continuity_status, previous_stamp=None)
    if counts:
        fill_report(response, counts, continuity_status=continuity_status, previous_stamp=None)
        response.metrics = metrics_key_values(counts)
    # Nothing was served, so nothing was continued, whatever the metrics of the dropped candidates say.
    response.continuity.continued = False
    response.continuity.seam_jump = math.nan
    return response
