"""Trustworthy output over real DDS (issue 17): faulty candidates, uncertainty, per-goal deadlines.

One node process (the random tiny model, 8 candidates, 20 steps, a joint trajectory, a tiny calibrated threshold so
that disagreeing candidates are marked uncertain) serves the module; the test-only ``fault_injection`` hook corrupts
chosen candidates inside the real engine. Tests run in file order. A deadline that fits fewer steps is tested in
``test_node_deadlines`` (on a node whose steps are paced, so the step count does not depend on the host's speed).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, metrics_dict, published_through, serve_node, stamp_sec, succeeded  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402
from builtin_interfaces.msg import Duration  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

COUNT = 8
STEPS = 20  # enough steps that half the goal time still fits several after encoding, whatever its jitter
JOINTS = [f"joint_{i}" for i in range(10)]
THRESHOLD = 1e-6
stamps = Stamps(5000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_trust")
    yield from serve_node(tmp, ros_domain_id, {
        "candidate_count": COUNT, "num_inference_steps": STEPS, "joint_names": JOINTS,
        "uncertainty_threshold": THRESHOLD,
    })


@pytest.fixture
def client(served):
    return served[1]


def test_one_nan_candidate_of_eight_is_dropped_and_the_goal_succeeds(client):
    assert client.set_parameter("fault_injection", "nan_candidates:3").successful
    client.publish_image(stamps())
    result = succeeded(client.run_goal(return_candidates=True))
    assert list(result.candidates.valid) == [i != 3 for i in range(COUNT)]
    assert (result.validity.valid, result.validity.dropped) == (COUNT - 1, 1)
    assert list(result.validity.drop_reasons) == ["non_finite"] and list(result.validity.drop_counts) == [1]
    data = np.asarray(result.candidates.data, dtype=np.float32).reshape(COUNT, 8, 10)
    assert np.isnan(data[3]).all() and np.isfinite(np.delete(data, 3, axis=0)).all()
    assert all(math.isfinite(v) for v in result.trajectory.data)
    metrics = metrics_dict(result)
    assert metrics["dropped_non_finite"] == "1" and metrics["valid_candidates"] == "7"


def test_the_last_feedback_and_diagnostics_carry_the_validity_counts(client):
    assert client.set_parameter("fault_injection", "nan_candidates:0,5").successful
    client.publish_image(stamps())
    outcome = client.run_goal()
    succeeded(outcome)
    # The last feedback may land just after the result: the two travel on different DDS channels.
    last = client.wait(lambda: outcome.feedback and outcome.feedback[-1].stage == "done" and outcome.feedback[-1],
                       5, "the last ('done') feedback")
    feedback_metrics = {kv.key: kv.value for kv in last.metrics}
    assert feedback_metrics["dropped_candidates"] == "2" and feedback_metrics["valid_candidates"] == "6"
    _, values = client.latest_status("engine", predicate=lambda v: v.get("dropped_candidates") == "2")
    assert values["dropped_non_finite"] == "2"


def test_all_candidates_invalid_aborts_publishes_nothing_and_the_next_goal_succeeds(client):
    assert client.set_parameter("fault_injection", "nan_candidates").successful
    client.publish_image(stamps())
    client.clear("trajectory", "joint_trajectory")
    outcome = client.run_goal()
    assert outcome.status == GoalStatus.STATUS_ABORTED
    assert outcome.result.error_code == ErrorCode.TOO_FEW_VALID_CANDIDATES, outcome.result.error_message
    assert "0 of 8 candidates valid" in outcome.result.error_message
    assert (outcome.result.validity.valid, outcome.result.validity.dropped) == (0, COUNT)
    assert len(outcome.result.trajectory.data) == 0
    # The next goal's trajectories have landed, so anything the aborted goal published has too: nothing did.
    marker = stamps()
    client.publish_image(marker)
    succeeded(client.run_goal())
    for topic in ("trajectory", "joint_trajectory"):
        assert [stamp_sec(m) for m in published_through(client, topic, marker)] == [marker], topic


def test_disagreeing_candidates_are_marked_uncertain_and_diagnostics_warn_without_aborting(client):
    client.publish_image(stamps())
    result = succeeded(client.run_goal())
    assert result.uncertain and result.uncertainty.score > THRESHOLD
    assert result.uncertainty.threshold == pytest.approx(THRESHOLD)
    assert result.uncertainty.modes >= 1 and 0 < result.uncertainty.mode_share <= 1
    assert len(result.uncertainty.step_std) == 8 and result.trajectory.horizon == 8
    status, _ = client.latest_status("engine", predicate=lambda v: v.get("uncertain") == "true")
    assert status.level == b"\x01" and "uncertain" in status.message
    # One candidate cannot disagree with itself: the next result is certain and the warning clears.
    client.publish_image(stamps())
    assert not succeeded(client.run_goal(candidate_count=1)).uncertain
    status, _ = client.latest_status("engine", predicate=lambda v: v.get("uncertain") == "false")
    assert status.level == b"\x00"


def test_a_deadline_not_even_one_step_can_meet_is_refused_with_its_code(client):
    client.publish_image(stamps())
    outcome = client.run_goal(deadline=Duration(sec=0, nanosec=1000))
    assert outcome.status == GoalStatus.STATUS_ABORTED
    assert outcome.result.error_code == ErrorCode.DEADLINE_UNMEETABLE, outcome.result.error_message
    assert not [f for f in outcome.feedback if f.stage == "denoising"]
    client.publish_image(stamps())
    succeeded(client.run_goal())
