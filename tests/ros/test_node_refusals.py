"""A refused goal never preempts, queues behind or displaces a running one, under every goal policy (issue 36).

One node process per ``goal_policy``: ``preempt`` and ``queue`` with one goal slot (so a goal that were admitted would
preempt, or wait behind, the running one), ``reject`` with two (with one, the goal callback rejects any second goal
before it is even read). The tiny model runs 12 steps paced to at least 0.25 s each (test-only step delay), so a
goal is still denoising when the next one arrives. A goal with a 1 ns deadline must end ``DEADLINE_UNMEETABLE``
while the running goal goes on to succeed: first on a node that has served nothing yet (the engine measured its
costs at start-up: there is no cold engine to plan on), then once it has served.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, metrics_dict, serve_node, succeeded  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402
from builtin_interfaces.msg import Duration  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

STEPS = 12
STEP_DELAY_S = 0.25
ONE_NS = Duration(sec=0, nanosec=1)
stamps = Stamps(3000)


@pytest.fixture(scope="module", params=[("preempt", 1), ("queue", 1), ("reject", 2)],
                ids=["preempt", "queue", "reject"])
def served(request, tmp_path_factory, ros_domain_id):
    policy, slots = request.param
    tmp = tmp_path_factory.mktemp(f"node_refusals_{policy}")
    yield from serve_node(tmp, ros_domain_id, {"domain_name": "pusht", "num_inference_steps": STEPS,
                                               "candidate_count": 2, "max_observation_age_s": 120.0,
                                               "goal_policy": policy, "max_concurrent_goals": slots},
                          step_delay_s=STEP_DELAY_S)


@pytest.fixture
def client(served):
    return served[1]


def refused_while_running(client) -> None:
    client.publish_image(stamps())
    running = client.send_goal()
    assert running.accepted
    client.wait(lambda: any(f.stage == "denoising" for f in running.feedback), 120, "the running goal to denoise")
    late = client.send_goal(deadline=ONE_NS)
    assert late.accepted, "accepted, then refused by its deadline (not by the goal policy)"
    client.result(late)
    assert late.status == GoalStatus.STATUS_ABORTED
    assert late.result.error_code == ErrorCode.DEADLINE_UNMEETABLE, late.result.error_message
    assert not any(f.stage == "denoising" for f in late.feedback), "refused before it was admitted"
    assert not running.result_future.done(), "refused while the running goal still runs, not after it"
    result = succeeded(client.result(running))
    assert result.trajectory.horizon == 8 and result.steps_used == STEPS


def test_a_node_that_served_nothing_yet_plans_from_its_start_up_measurement(client):
    # 0.1 s is less than encoding + one 0.25 s step: refused from the costs measured at start-up, never planned cold.
    client.publish_image(stamps())
    short = client.run_goal(deadline=Duration(sec=0, nanosec=100_000_000))
    assert short.result.error_code == ErrorCode.DEADLINE_UNMEETABLE, short.result.error_message
    assert "as measured here" in short.result.error_message
    assert short.result.continuity.status == "not requested" and short.feedback == []
    refused_while_running(client)


def test_a_meetable_deadline_is_served(client):
    client.publish_image(stamps())
    meetable = succeeded(client.run_goal(deadline=Duration(sec=600, nanosec=0)))
    assert metrics_dict(meetable)["deadline_met"] == "true" and meetable.steps_used == STEPS


def test_a_1_ns_deadline_is_refused_and_the_running_goal_succeeds_once_the_node_has_served(client):
    refused_while_running(client)
