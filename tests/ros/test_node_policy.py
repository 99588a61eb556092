"""The node over real DDS: goal policy (preempt), client cancel, reducer/action-space checks, shutdown.

One node process serves the module: tiny model, ``pusht`` (width 2), chunk 8, 12 steps, each paced to take at least
0.25 s (test-only step delay), so a cancel, a preemption or the shutdown lands while the group is denoising on any
machine. The last test stops the node with a goal running.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, published_through, serve_node, stamp_sec, succeeded  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

STEPS = 12
STEP_DELAY_S = 0.25
stamps = Stamps(2000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_policy")
    yield from serve_node(tmp, ros_domain_id, {"domain_name": "pusht", "num_inference_steps": STEPS,
                                               "candidate_count": 2, "max_observation_age_s": 120.0},
                         step_delay_s=STEP_DELAY_S)


@pytest.fixture
def client(served):
    return served[1]


def denoising_steps(outcome) -> list[int]:
    return [f.step for f in outcome.feedback if f.stage == "denoising"]


def wait_denoising(client, outcome, at_least: int = 1) -> None:
    client.wait(lambda: len(denoising_steps(outcome)) >= at_least, 120, f"{at_least} denoising step(s)")


def test_pusht_result_is_chunk_by_two(client):
    client.publish_image(stamps())
    outcome = client.run_goal()
    assert outcome.status == GoalStatus.STATUS_SUCCEEDED, outcome.result.error_message
    trajectory = outcome.result.trajectory
    assert (trajectory.horizon, trajectory.action_dim, len(trajectory.data)) == (8, 2, 16)
    # The last feedback may land after the result (different DDS channels).
    wait_denoising(client, outcome, at_least=STEPS)
    assert trajectory.domain_name == "pusht" and denoising_steps(outcome) == list(range(1, STEPS + 1))


def test_reducer_invalid_for_the_action_space_is_refused_before_any_model_work(client):
    client.publish_image(stamps())
    outcome = client.run_goal(reducer="pose_gripper")
    assert outcome.status == GoalStatus.STATUS_ABORTED
    assert outcome.result.error_code == ErrorCode.REDUCER_INVALID_FOR_ACTION_SPACE
    assert "pose_gripper" in outcome.result.error_message and "width 2" in outcome.result.error_message
    assert outcome.feedback == []  # refused before the group existed


def test_a_bad_reducer_for_the_width_gets_the_same_text_from_a_goal_a_parameter_and_the_python_api(client):
    # One validation point: a goal, a parameter file and a Python call go through the same contract check.
    from _cosmos3 import PROMPT, fresh_pipe, policy

    from trajectory_ensemble_node.contract import CandidateTrajectorySpec
    from trajectory_ensemble_node.errors import ParameterError, ReducerLayoutError
    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
    from trajectory_ensemble_node.serving import params

    client.publish_image(stamps())
    from_goal = client.run_goal(candidate_count=2, reducer="pose_gripper").result.error_message
    with pytest.raises(ReducerLayoutError) as from_api:
        Cosmos3ActionModel(fresh_pipe()).make_request(
            prompt=PROMPT, action=policy("pusht"), spec=CandidateTrajectorySpec(count=2, reducer="pose_gripper"))
    with pytest.raises(ParameterError) as from_parameter:
        params.validate({"domain_name": "pusht", "candidate_count": 2, "reducer": "pose_gripper"}, env={})
    assert from_goal == str(from_api.value)
    assert f"\n  reducer: {from_goal}" in str(from_parameter.value)
    assert "pose_gripper" in from_goal and "pusht actions have width 2" in from_goal


def test_a_new_goal_preempts_the_running_one_and_nothing_of_it_is_published(client):
    client.publish_image(stamps())
    client.clear("trajectory")
    first = client.send_goal(use_seed=True, seed=111)
    wait_denoising(client, first)
    second = client.send_goal(use_seed=True, seed=222)
    client.result(first)
    client.result(second)
    assert first.status == GoalStatus.STATUS_ABORTED
    assert first.result.error_code == ErrorCode.PREEMPTED
    assert first.result.error_message == f"preempted by {second.goal_id}"
    assert max(denoising_steps(first)) < STEPS
    assert second.status == GoalStatus.STATUS_SUCCEEDED, second.result.error_message
    # A later goal's trajectory has landed, so anything the preempted one published has too.
    marker = stamps()
    client.publish_image(marker)
    succeeded(client.run_goal(use_seed=True, seed=333))
    assert [m.base_seed for m in published_through(client, "trajectory", marker)] == [222, 333]
    _, goals = client.latest_status("goals", predicate=lambda v: int(v.get("goals_preempted", 0)) >= 1)
    assert goals["goals_preempted"] == "1"


def test_client_cancel_stops_the_group_within_one_step(client):
    client.publish_image(stamps())
    client.clear("trajectory")
    outcome = client.send_goal()
    wait_denoising(client, outcome, at_least=2)
    step_at_cancel = max(denoising_steps(outcome))
    response = client.cancel(outcome)
    assert len(response.goals_canceling) == 1
    client.result(outcome)
    assert outcome.status == GoalStatus.STATUS_CANCELED
    assert outcome.result.error_code == ErrorCode.CANCELED
    # The step in flight when the cancel arrived may finish; no later step starts.
    assert max(denoising_steps(outcome)) <= step_at_cancel + 2 < STEPS
    # Nothing of it was published: a later goal's trajectory is the first, and its last feedback has landed after
    # any of the canceled goal's.
    marker = stamps()
    client.publish_image(marker)
    later = client.run_goal()
    succeeded(later)
    assert [stamp_sec(m) for m in published_through(client, "trajectory", marker)] == [marker]
    client.wait(lambda: any(f.stage == "done" for f in later.feedback), 30, "the later goal's last feedback")
    assert not any(f.stage in ("reducing", "done") for f in outcome.feedback)


def test_the_node_serves_normally_after_preemption_and_cancel(client):
    client.publish_image(stamps())
    outcome = client.run_goal()
    assert outcome.status == GoalStatus.STATUS_SUCCEEDED, outcome.result.error_message
    _, goals = client.latest_status("goals", predicate=lambda v: v.get("goals_running") == "0")
    assert goals["goals_waiting"] == "0" and goals["goals_canceled"] == "1"


def test_shutdown_ends_the_running_goal(served):
    node, client = served
    client.publish_image(stamps())
    outcome = client.send_goal()
    wait_denoising(client, outcome)
    assert node.stop() == 0
    client.result(outcome, timeout=30)
    assert outcome.status == GoalStatus.STATUS_ABORTED
    assert outcome.result.error_code == ErrorCode.SHUTDOWN
    assert "shutting down: ending every goal" in node.log()
