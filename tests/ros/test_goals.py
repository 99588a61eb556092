"""ros/goals.py: goal validation into a plan, and the goal policy (preempt / queue / reject). Runs without rclpy."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from _node_harness import wait_until

from trajectory_ensemble_node.errors import (
    CandidateCountError,
    GoalRequestError,
    GroupCanceledError,
    GroupPreemptedError,
    ReducerLayoutError,
    UnknownReducerError,
)
from trajectory_ensemble_node.ros import goals
from trajectory_ensemble_node.serving import params


def make_goal(**fields) -> SimpleNamespace:
    """A ``GenerateTrajectory.Goal`` look-alike with the message's defaults (plan_action_goal reads fields only)."""
    defaults = dict(candidate_count=0, reducer="", return_candidates=False, use_seed=False, seed=0, instruction="",
                    rollout=False)
    return SimpleNamespace(**{**defaults, **fields})


def node_params(**overrides) -> params.NodeParams:
    return params.validate({"candidate_count": 4, "max_candidates": 8, "domain_name": "droid_lerobot",
                            "reducer": "mean", **overrides}, env={})


VALID = ("mean", "median", "medoid", "trimmed_mean", "pose_gripper", "mode")


def test_goal_defaults_limits_and_reducer_checks_happen_before_any_model_work():
    default = make_goal()
    plan = goals.plan_action_goal(default, node_params(), default_instruction="go", valid_reducers=VALID)
    assert (plan.spec.count, plan.spec.reducer, plan.instruction, plan.return_candidates) == (4, "mean", "go", False)
    seeded = goals.plan_action_goal(make_goal(use_seed=True, seed=2**64 - 1, candidate_count=2, return_candidates=True,
                                       instruction="x"),
                             node_params(), default_instruction="go", valid_reducers=VALID)
    assert seeded.base_seed == 2**64 - 1 and seeded.spec.count == 2 and seeded.spec.return_candidates
    assert goals.plan_action_goal(default, node_params(publish_candidates=True), default_instruction="",
                           valid_reducers=VALID).spec.return_candidates
    with pytest.raises(CandidateCountError, match=r"candidate_count 9 is outside \[1, max_candidates=8\]"):
        goals.plan_action_goal(make_goal(candidate_count=9), node_params(), default_instruction="",
                        valid_reducers=VALID)
    with pytest.raises(UnknownReducerError, match="unknown reducer 'vote'"):
        goals.plan_action_goal(make_goal(reducer="vote"), node_params(), default_instruction="",
                        valid_reducers=VALID)
    with pytest.raises(ReducerLayoutError, match="pusht actions have width 2"):
        goals.plan_action_goal(make_goal(reducer="pose_gripper"), node_params(domain_name="pusht"),
                        default_instruction="", valid_reducers=VALID)
    with pytest.raises(ReducerLayoutError, match="not valid for this model"):
        goals.plan_action_goal(make_goal(reducer="median"), node_params(), default_instruction="",
                        valid_reducers=("mean",))
    with pytest.raises(GoalRequestError, match="rollout_dir"):
        goals.plan_action_goal(make_goal(rollout=True), node_params(), default_instruction="",
                        valid_reducers=VALID)


def test_min_observation_stamp_is_read_in_nanoseconds_and_a_negative_one_refused():
    plan = goals.plan_action_goal(make_goal(), node_params(), default_instruction="", valid_reducers=VALID)
    assert plan.min_observation_stamp_ns == 0
    stamp = SimpleNamespace(sec=12, nanosec=5)
    plan = goals.plan_action_goal(make_goal(min_observation_stamp=stamp), node_params(), default_instruction="",
                           valid_reducers=VALID)
    assert plan.min_observation_stamp_ns == 12_000_000_005
    with pytest.raises(GoalRequestError, match="min_observation_stamp must be >= 0"):
        goals.plan_action_goal(make_goal(min_observation_stamp=SimpleNamespace(sec=-1, nanosec=0)), node_params(),
                        default_instruction="", valid_reducers=VALID)


class FakeHandle:
    def __init__(self) -> None:
        self.cancels: list[tuple] = []
        self.callbacks: list = []

    def cancel(self, reason, message=""):
        self.cancels.append((reason.value, message))
        return True

    def add_done_callback(self, callback):
        self.callbacks.append(callback)


def test_preempt_policy_stops_the_oldest_goal_and_names_the_newer_one():
    tracker = goals.GoalTracker("preempt", 1)
    first, second = tracker.register("A"), tracker.register("B")
    assert tracker.admit(first) is False
    handle = FakeHandle()
    first.attach(handle)
    tracker.admit(second)
    assert handle.cancels == [("preempted", "preempted by B")]
    error = first.stop_error()
    assert isinstance(error, GroupPreemptedError) and str(error) == "preempted by B"
    assert isinstance(first.claim_success(), GroupPreemptedError)
    assert tracker.num_running == 1


def test_a_goal_accepted_earlier_but_admitted_later_is_the_one_preempted():
    tracker = goals.GoalTracker("preempt", 1)
    older, newer = tracker.register("A"), tracker.register("B")
    tracker.admit(newer)
    with pytest.raises(GroupPreemptedError, match="preempted by B"):
        tracker.admit(older)
    assert newer.stop_error() is None and tracker.num_running == 1


def test_a_goal_that_committed_to_its_result_can_no_longer_be_preempted_or_canceled():
    tracker = goals.GoalTracker("preempt", 1)
    first = tracker.register("A")
    tracker.admit(first)
    assert first.claim_success() is None
    assert first.request_cancel() is False
    first.preempt("B")
    assert first.stop_error() is None


def test_a_cancel_before_submission_cancels_the_group_as_soon_as_it_exists():
    record = goals.GoalTracker("preempt", 1).register("A")
    assert record.request_cancel()
    handle = FakeHandle()
    record.attach(handle)
    assert handle.cancels[0][0] == "canceled"
    assert isinstance(record.stop_error(), GroupCanceledError)


def test_queue_policy_waits_for_a_slot_and_reject_policy_refuses():
    tracker = goals.GoalTracker("queue", 1)
    first, second = tracker.register("A"), tracker.register("B")
    tracker.admit(first)
    waited: list[bool] = []
    thread = threading.Thread(target=lambda: waited.append(tracker.admit(second)))
    thread.start()
    wait_until(lambda: tracker.num_waiting == 1)
    tracker.release(first)
    thread.join(5)
    assert waited == [True] and tracker.num_running == 1
    rejecting = goals.GoalTracker("reject", 1)
    rejecting.admit(rejecting.register("A"))
    assert "goal_policy is reject" in rejecting.should_reject()
    closing = goals.GoalTracker("queue", 1)
    closing.close()
    assert "shutting down" in closing.should_reject()


def test_a_goals_state_follows_admission_the_queue_and_its_end_and_is_counted_once():
    from trajectory_ensemble_node.errors import ErrorCode
    from trajectory_ensemble_node.ros.goal_state import GoalState

    tracker = goals.GoalTracker("queue", 1)
    first, second = tracker.register("A"), tracker.register("B")
    assert first.state is GoalState.ACCEPTED
    tracker.admit(first)
    assert first.state is GoalState.RUNNING
    thread = threading.Thread(target=tracker.admit, args=(second,))
    thread.start()
    wait_until(lambda: second.state is GoalState.QUEUED)
    assert first.claim_success() is None and first.state is GoalState.SUCCEEDED
    tracker.release(first)
    thread.join(5)
    assert second.state is GoalState.RUNNING
    assert second.finish(ErrorCode.TOO_FEW_VALID_CANDIDATES) is GoalState.FAILED
    tracker.release(second)
    assert tracker.snapshot()["succeeded"] == 1 and tracker.snapshot()["aborted"] == 1
    tracker.release(second)  # released twice: counted once
    assert tracker.snapshot()["aborted"] == 1


def test_a_stop_that_came_first_names_the_end_and_a_later_one_is_refused():
    from trajectory_ensemble_node.errors import ErrorCode, NotActiveError
    from trajectory_ensemble_node.ros.goal_state import GoalState

    tracker = goals.GoalTracker("preempt", 2)
    record = tracker.register("A")
    tracker.admit(record)
    handle = FakeHandle()
    record.attach(handle)
    assert tracker.stop_all(GoalState.NOT_ACTIVE, "the node was deactivated") == 1
    assert handle.cancels == [("deactivated", "the node was deactivated")]
    assert isinstance(record.stop_error(), NotActiveError) and record.stop_error().code == ErrorCode.NOT_ACTIVE
    assert record.request_cancel() is False  # too late: it already ended
    assert record.finish(ErrorCode.ENGINE_FAILURE) is GoalState.NOT_ACTIVE  # the engine's error does not rename it
    assert isinstance(record.claim_success(), NotActiveError)
    with pytest.raises(ValueError, match="is stopped as one of"):
        tracker.register("B").stop(GoalState.SUCCEEDED, "no")


def test_a_stop_wakes_a_goal_waiting_in_the_queue():
    stopped = []
    tracker = goals.GoalTracker("queue", 1, on_stop=stopped.append)
    running, waiting = tracker.register("A"), tracker.register("B")
    tracker.admit(running)
    errors: list[BaseException] = []

    def admit() -> None:
        try:
            tracker.admit(waiting)
        except GroupCanceledError as error:
            errors.append(error)

    thread = threading.Thread(target=admit)
    thread.start()
    wait_until(lambda: tracker.num_waiting == 1)
    assert waiting.request_cancel()
    thread.join(5)  # woken by the stop itself: the wait has no timeout
    assert not thread.is_alive() and isinstance(errors[0], GroupCanceledError) and stopped == [waiting]