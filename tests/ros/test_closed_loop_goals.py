"""The closed-loop goal fields (continue_previous, reset_context, inference_delay, guidance, deadline) planned by
ros/goals.py, and ros/results.py's typed result and feedback fields.

Pure: no node, no DDS (the node-level behaviour is tests/ros/test_node_continuity.py and test_node_trust.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("trajectory_ensemble_msgs")

from trajectory_ensemble_node.errors import (  # noqa: E402
    DelayTooLongError,
    ErrorCode,
    ExecutionContextError,
    GoalRequestError,
    NegativeDelayError,
)
from trajectory_ensemble_node.ros import goals, results  # noqa: E402
from trajectory_ensemble_node.serving import continuity, params  # noqa: E402


def make_goal(**fields) -> SimpleNamespace:
    defaults = dict(candidate_count=0, reducer="", return_candidates=False, use_seed=False, seed=0, instruction="",
                    rollout=False, continue_previous=False, reset_context=False, inference_delay=0, guidance="",
                    deadline=SimpleNamespace(sec=0, nanosec=0))
    return SimpleNamespace(**{**defaults, **fields})


def node_params(**overrides) -> params.NodeParams:
    return params.validate({"domain_name": "pusht", "reducer": "mode", **overrides}, env={})


VALID = ("mean", "mode", "mode_continuity", "backward_coherence")


def plan(goal, **overrides):
    return goals.plan_action_goal(goal, node_params(**overrides), default_instruction="go", valid_reducers=VALID)


def test_goal_fields_and_the_node_default_decide_whether_a_goal_continues():
    assert not plan(make_goal()).continue_previous
    asked = plan(make_goal(continue_previous=True, inference_delay=3, guidance="mask",
                           deadline=SimpleNamespace(sec=1, nanosec=500_000_000)))
    assert (asked.continue_previous, asked.inference_delay, asked.guidance, asked.deadline_s) == (True, 3, "mask", 1.5)
    assert asked.spec.reducer == "mode_continuity"  # the continuity reducer, as the goal named none
    assert plan(make_goal(continue_previous=True, reducer="mean")).spec.reducer == "mean"
    by_default = plan(make_goal(), continue_previous=True, guidance_mode="vjp")
    assert by_default.continue_previous and by_default.guidance == "vjp"
    reset = plan(make_goal(reset_context=True), continue_previous=True)
    assert reset.reset_context and not reset.continue_previous and reset.spec.reducer == "mode"


@pytest.mark.parametrize(("fields", "error", "quoted"), [
    ({"inference_delay": -1}, NegativeDelayError, "-1"),
    ({"inference_delay": 8}, DelayTooLongError, "chunk length 8"),
    ({"guidance": "magic"}, ExecutionContextError, "'magic'"),
    ({"continue_previous": True, "reset_context": True}, GoalRequestError, "not both"),
    ({"deadline": SimpleNamespace(sec=-1, nanosec=0)}, GoalRequestError, "-1.0"),
])
def test_bad_closed_loop_and_deadline_fields_are_named_errors(fields, error, quoted):
    with pytest.raises(error, match=None) as info:
        plan(make_goal(**fields))
    assert quoted in str(info.value)


def test_results_map_the_engine_metrics_onto_typed_fields():
    metrics = {"steps_planned": 10, "steps_fitted": 4, "steps_used": 3, "uncertain": True, "uncertainty_score": 0.5,
               "uncertainty_threshold": 0.04, "uncertainty_modes": 2, "uncertainty_mode_share": 0.75,
               "uncertainty_spread": 0.9, "uncertainty_step_std": (0.1, 0.2), "valid_candidates": 6,
               "dropped_candidates": 2, "clamped_candidates": 0, "dropped_non_finite": 1, "dropped_max": 1,
               "dropped_min": 0, "action_clamped": False, "context_frozen": 2, "context_shift": 4,
               "context_guidance": "prefix", "seam_jump": 0.25}
    response = SimpleNamespace()
    results.fill_report(response, metrics, continuity_status="continued", previous_stamp=12.5)
    assert (response.steps_planned, response.steps_fitted, response.steps_used, response.uncertain) == (10, 4, 3, True)
    assert response.uncertainty.modes == 2 and list(response.uncertainty.step_std) == pytest.approx([0.1, 0.2])
    assert list(response.validity.drop_reasons) == ["non_finite", "max"]
    assert list(response.validity.drop_counts) == [1, 1]
    c = response.continuity
    assert (c.continued, c.frozen_actions, c.shift, c.guidance) == (True, 2, 4, "prefix")
    assert c.seam_jump == pytest.approx(0.25) and (c.previous_stamp.sec, c.previous_stamp.nanosec) == (12, 500_000_000)
    fresh = SimpleNamespace()
    results.fill_report(fresh, {}, continuity_status="no previous chunk", previous_stamp=None)
    assert not fresh.continuity.continued and math.isnan(fresh.continuity.seam_jump)


def test_a_succeeded_goal_s_result_and_last_feedback_carry_the_same_report():
    from trajectory_ensemble_msgs.msg import ActionTrajectory

    metrics = {"weights_version": 3, "steps_planned": 10, "steps_used": 10, "valid_candidates": 8,
               "context_frozen": 2, "context_guidance": "prefix", "seam_jump": 0.1, "goal_ms": 12.5}
    response = results.success_result(ActionTrajectory(horizon=8, action_dim=2), metrics, base_seed=2**63 + 1,
                                      continuity_status="continued", previous_stamp=3.0)
    assert (response.error_code, response.base_seed, response.weights_version) == (0, 2**63 + 1, 3)
    assert response.trajectory.horizon == 8 and response.validity.valid == 8
    assert float({kv.key: kv.value for kv in response.metrics}["goal_ms"]) == 12.5
    feedback = results.done_feedback(response)
    assert (feedback.stage, feedback.step, feedback.total_steps) == ("done", 10, 10)
    assert (feedback.frozen_actions, feedback.guidance) == (2, "prefix")
    assert list(feedback.metrics) == list(response.metrics)


def test_a_failed_goal_s_result_names_its_code_and_reports_dropped_candidates_only_when_counted():
    plain = results.failure_result(ErrorCode.CANCELED, "canceled by the client", base_seed=7, weights_version=1)
    assert (plain.error_code, plain.error_message, plain.base_seed) == (ErrorCode.CANCELED, "canceled by the client", 7)
    assert list(plain.metrics) == [] and plain.validity.dropped == 0
    counts = {"valid_candidates": 1, "dropped_candidates": 7, "dropped_non_finite": 7}
    dropped = results.failure_result(ErrorCode.TOO_FEW_VALID_CANDIDATES, "1 of 8 valid", base_seed=7,
                                     weights_version=1, counts=counts)
    assert (dropped.validity.valid, dropped.validity.dropped) == (1, 7)
    assert list(dropped.validity.drop_reasons) == ["non_finite"]
    assert {kv.key: kv.value for kv in dropped.metrics}["dropped_candidates"] == "7"
    # Nothing served, nothing continued: NaN seam (as the message defines it) and the status the goal was decided with.
    for result in (plain, dropped):
        assert not result.continuity.continued and math.isnan(result.continuity.seam_jump)
    assert plain.continuity.status == results.NOT_SERVED
    continuing = results.failure_result(ErrorCode.PREEMPTED, "preempted", base_seed=7, weights_version=1,
                                        continuity_status=continuity.CONTINUED)
    assert continuing.continuity.status == "continued" and math.isnan(continuing.continuity.seam_jump)
