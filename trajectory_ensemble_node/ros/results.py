"""A goal's action result and last feedback: trajectory or error, and the report (denoising steps, uncertainty,
candidate validity, continuity).

The engine reports all of it as flat per-group metrics (``metrics`` in the result, the final feedback and
``/diagnostics`` carry those as KeyValues); this module maps them onto the typed result fields, so a behaviour tree
reads ``result.uncertain`` or ``result.validity.dropped`` instead of parsing strings. Pure functions of their
arguments (no node, no clock, no DDS).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from builtin_interfaces.msg import Time
from trajectory_ensemble_msgs.action import GenerateTrajectory
from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateValidity, Continuity, Uncertainty

from ..errors import ErrorCode
from ..safety import REASONS
from .conversions import metrics_key_values, seconds_to_time

NOT_SERVED = "not served"
"""``continuity.status`` of a goal that failed before its continuity was decided (refused, canceled early)."""


def _int(metrics: Mapping[str, Any], key: str) -> int:
    value = metrics.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _float(metrics: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = metrics.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def uncertainty_msg(metrics: Mapping[str, Any]) -> Uncertainty:
    """``Uncertainty`` from the ``uncertainty_*`` and ``novelty_*`` metrics (zeros when absent, e.g. a failed group).

    ``window`` is 1 for a scored goal without an aggregation window (its own scores are the window's), 0 for a goal
    that scored nothing.
    """
    step_std = metrics.get("uncertainty_step_std") or ""
    scored = "uncertainty_score" in metrics
    score, novelty = _float(metrics, "uncertainty_score"), _float(metrics, "novelty_score")
    return Uncertainty(
        score=score,
        threshold=_float(metrics, "uncertainty_threshold"),
        modes=_int(metrics, "uncertainty_modes"),
        mode_share=_float(metrics, "uncertainty_mode_share"),
        spread=_float(metrics, "uncertainty_spread"),
        step_std=[float(v) for v in str(step_std).split(",") if v],
        novelty_score=novelty,
        novelty_threshold=_float(metrics, "novelty_threshold"),
        novel=bool(metrics.get("novel", False)),
        rule=str(metrics.get("uncertainty_rule") or ""),
        window=_int(metrics, "uncertainty_window") or (1 if scored else 0),
        window_score=_float(metrics, "uncertainty_score_window", score),
        window_novelty_score=_float(metrics, "novelty_score_window", novelty),
    )


def validity_msg(metrics: Mapping[str, Any]) -> CandidateValidity:
    """``CandidateValidity`` from the validity counts; only reasons that dropped something are listed."""
    reasons = [reason for reason in REASONS if _int(metrics, f"dropped_{reason}") > 0]
    return CandidateValidity(
        valid=_int(metrics, "valid_candidates"),
        dropped=_int(metrics, "dropped_candidates"),
        clamped=_int(metrics, "clamped_candidates"),
        drop_reasons=reasons,
        drop_counts=[_int(metrics, f"dropped_{reason}") for reason in reasons],
        action_clamped=bool(metrics.get("action_clamped", False)),
    )


def continuity_msg(metrics: Mapping[str, Any], status: str, previous_stamp: float | None) -> Continuity:
    """``Continuity`` from the ``context_*`` metrics and the node's decision.

    Args:
        metrics (`Mapping[str, Any]`): The group's metrics (``context_*`` and ``seam_jump`` when continued).
        status (`str`): ``continuity.status``: ``"continued"``, ``"not requested"`` or why the goal started fresh.
        previous_stamp (`float`, *optional*): Seconds; the continued chunk's observation stamp.
    """
    continued = "context_frozen" in metrics
    seam = metrics.get("seam_jump")
    return Continuity(
        continued=continued,
        status=status,
        frozen_actions=_int(metrics, "context_frozen"),
        shift=_int(metrics, "context_shift"),
        guidance=str(metrics.get("context_guidance") or "") if continued else "",
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
    response.steps_planned = _int(metrics, "steps_planned")
    response.steps_fitted = _int(metrics, "steps_fitted")
    response.steps_used = _int(metrics, "steps_used")
    response.uncertain = bool(metrics.get("uncertain", False))
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
        weights_version=int(metrics.get("weights_version") or 0), metrics=metrics_key_values(metrics),
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
