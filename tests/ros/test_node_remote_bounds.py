"""Issue 61, row 4, over DDS: with the remote server frozen, a goal ends at its deadline, at ``engine_timeout_s`` or at
its cancel, not a close handshake later.

Before the fix, goals with deadlines of 1.5, 2.5 and 3.0 s ended ``REMOTE_TIMEOUT`` at 2.50, 3.51 and 4.01 s, a cancel
took 1.009 s, and a goal without a deadline ended at 11.0 s against ``engine_timeout_s`` 10: the client closed each
connection with a 1 s close handshake that a frozen server never answers. The server here is written for the test
(``tests/remote/_fake_server.py``): it completes the handshake, sends its metadata, takes the request, and never
reads or writes again. Times are measured on the client, from before the goal is sent (or the cancel asked) to the
moment its result arrives, so DDS's round trips count against the margin too.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))  # the fake server

from _fake_server import FakeConnection, FakeServer  # noqa: E402
from _node_harness import BASE_PARAMS, Stamps, serve_node  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402
from builtin_interfaces.msg import Duration  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402
from trajectory_ensemble_node.openpi.extras import EXTRA_KEYS  # noqa: E402
from trajectory_ensemble_node.toy import ACTION_SETTINGS, INSTRUCTION  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

MARGIN_S = 0.3
"""How late a goal may end after its deadline, timeout or cancel (the issue's bound)."""
ENGINE_TIMEOUT_S = 1.0
SERVED = {**BASE_PARAMS, **ACTION_SETTINGS, "model": "toy", "instruction": INSTRUCTION, "reducer": "mode",
          "candidate_count": 2, "max_candidates": 8, "max_observation_age_s": 120.0}
METADATA = {"server": "frozen-for-the-test", "extras": {"keys": list(EXTRA_KEYS), "num_candidates": {"max": 8}}}
"""A handshake the node accepts: fields a server does not send are not checked (vLLM-Omni sends fewer)."""
stamps = Stamps(6100)


@pytest.fixture(scope="module")
def frozen(tmp_path_factory, ros_domain_id):
    server = FakeServer(METADATA, lambda conn: None)

    def behave(conn: FakeConnection) -> None:
        if conn.next_request() is not None:
            server.count_request()
        conn.stop.wait()  # frozen: never reads again, so a close frame would wait unanswered

    server.behaviour = behave
    tmp = tmp_path_factory.mktemp("remote_bounds")
    nodes = serve_node(tmp, ros_domain_id, {**SERVED, "engine": "openpi", "engine_url": server.url,
                                            "engine_timeout_s": ENGINE_TIMEOUT_S})
    try:
        _node, ros = next(nodes)
        yield ros, server
    finally:
        server.close()
        nodes.close()


def ended_at(outcome) -> dict[str, float]:
    ended: dict[str, float] = {}
    outcome.result_future.add_done_callback(lambda _: ended.setdefault("at", time.monotonic()))
    return ended


@pytest.mark.parametrize("deadline_s", [0.8, 1.5])
def test_a_goal_ends_remote_timeout_at_its_deadline(frozen, deadline_s):
    ros, _ = frozen
    ros.publish_image(stamps())
    sent = time.monotonic()
    outcome = ros.send_goal(deadline=Duration(sec=int(deadline_s), nanosec=int(deadline_s % 1 * 1e9)))
    ended = ended_at(outcome)
    ros.result(outcome)
    assert outcome.status == GoalStatus.STATUS_ABORTED
    assert outcome.result.error_code == ErrorCode.REMOTE_TIMEOUT, outcome.result.error_message
    late = ended["at"] - sent - deadline_s
    print(f"deadline {deadline_s} s: ended {late:+.3f} s after it")
    assert late < MARGIN_S, f"deadline {deadline_s} s: the goal ended {late:.3f} s after it"


def test_a_goal_without_a_deadline_ends_at_engine_timeout_s(frozen):
    ros, _ = frozen
    ros.publish_image(stamps())
    sent = time.monotonic()
    outcome = ros.send_goal()
    ended = ended_at(outcome)
    ros.result(outcome)
    assert outcome.result.error_code == ErrorCode.REMOTE_TIMEOUT, outcome.result.error_message
    print(f"engine_timeout_s {ENGINE_TIMEOUT_S} s: ended {ended['at'] - sent - ENGINE_TIMEOUT_S:+.3f} s after it")
    assert ended["at"] - sent - ENGINE_TIMEOUT_S < MARGIN_S


def test_a_cancel_ends_the_goal_at_once(frozen):
    ros, server = frozen
    ros.publish_image(stamps())
    asked = server.requests
    outcome = ros.send_goal()
    ended = ended_at(outcome)
    ros.wait(lambda: server.requests == asked + 1, 30, "the frozen server to take the request")
    canceled = time.monotonic()
    ros.cancel(outcome)
    ros.result(outcome)
    assert outcome.status == GoalStatus.STATUS_CANCELED
    print(f"cancel: ended {ended['at'] - canceled:.3f} s after it")
    assert ended["at"] - canceled < MARGIN_S, f"the cancel took {ended['at'] - canceled:.3f} s"
