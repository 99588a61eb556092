"""Goal-end log lines all reach the node's log, across mixed severities (issue 20, lost logs).

The node logs a goal's end after its result (``ros/deferred.py``). When that worker logged every severity from one
call site, rclpy raised ``ValueError: Logger severity cannot be changed between calls`` after the first line, and a
bare ``except Exception: pass`` hid it: after one success, the aborts' warnings never appeared.
"""

from __future__ import annotations


import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, serve_node, wait_until_stale  # noqa: E402
from _reliability_harness import publish_until_received, wait_for_log  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.reliability]

MAX_AGE_S = 1.5
stamps = Stamps(20_000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    yield from serve_node(tmp_path_factory.mktemp("rel_logs"), ros_domain_id, {"max_observation_age_s": MAX_AGE_S})


def test_every_goal_end_line_reaches_the_log(served):
    node, client = served
    ends: list[tuple[str, str]] = []  # (goal id, the line fragment the log must hold)

    publish_until_received(client, stamps())
    ok = client.run_goal()
    assert ok.status == GoalStatus.STATUS_SUCCEEDED, ok.result.error_message
    ends.append((ok.goal_id, f"goal {ok.goal_id}: "))

    wait_until_stale(client, MAX_AGE_S)
    stale = client.run_goal()
    assert stale.result.error_code == ErrorCode.STALE_OBSERVATION
    ends.append((stale.goal_id, f"goal {stale.goal_id} aborted (STALE_OBSERVATION)"))

    publish_until_received(client, stamps())
    unknown = client.run_goal(reducer="no_such_reducer")
    assert unknown.result.error_code == ErrorCode.UNKNOWN_REDUCER
    ends.append((unknown.goal_id, f"goal {unknown.goal_id} aborted (UNKNOWN_REDUCER)"))

    above = client.run_goal(candidate_count=99)
    assert above.result.error_code == ErrorCode.CANDIDATE_COUNT_ABOVE_MAX
    ends.append((above.goal_id, f"goal {above.goal_id} aborted (CANDIDATE_COUNT_ABOVE_MAX)"))

    publish_until_received(client, stamps())
    again = client.run_goal()
    assert again.status == GoalStatus.STATUS_SUCCEEDED, again.result.error_message
    ends.append((again.goal_id, f"goal {again.goal_id}: "))

    missing = [fragment for _, fragment in ends if not wait_for_log(node, fragment, timeout_s=10.0)]
    assert not missing, f"goal-end lines missing from the node log: {missing}\n{node.log()[-3000:]}"
    assert "Logger severity cannot be changed" not in node.log()
