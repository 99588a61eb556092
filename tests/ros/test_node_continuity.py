"""Closed-loop serving over real DDS (issue 16): goals that continue the chunk the node served last.

One node process (the random tiny model, no action statistics so published actions are the model's normalized ones,
``dt = 0.1`` s, chunk 8) runs with ``use_sim_time``; the test owns ``/clock``. Tests run in file order.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import metrics_dict, serve_node, succeeded  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

H, D, DT = 8, 10, 0.1
MAX_AGE_S = 3.0


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_continuity")
    (tmp / "rollouts").mkdir()
    yield from serve_node(tmp, ros_domain_id, {
        "use_sim_time": True, "candidate_count": 4, "rollout_dir": str(tmp / "rollouts"),
        "max_observation_age_s": MAX_AGE_S,
    })


@pytest.fixture
def client(served):
    return served[1]


def observe(client, t: float, *, clock: bool = True) -> None:
    """The simulated clock at ``t`` (unless ``clock`` is false), then a frame stamped ``t``: each published until the
    node reports it (its diagnostics stamped ``t``, the frame counted)."""
    if clock:
        client.publish_clock(t)
    client.publish_image(t)


def rows(msg) -> np.ndarray:
    return np.asarray(msg.data, dtype=np.float64).reshape(-1, D)


def stamp(msg) -> float:
    return msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9


def test_a_continuation_with_nothing_to_continue_starts_fresh_and_says_so(client, served):
    observe(client, 100.0)
    result = succeeded(client.run_goal(continue_previous=True))
    assert not result.continuity.continued and result.continuity.status == "no previous chunk"
    assert metrics_dict(result)["continuity"] == "no previous chunk"
    client.wait(lambda: "started fresh (no previous chunk)" in served[0].log(), 10.0, "the log line")


def test_the_next_chunk_keeps_the_frozen_actions_and_splices_at_their_times(client):
    observe(client, 200.0)
    first = succeeded(client.run_goal(reset_context=True)).trajectory
    previous = rows(first)
    observe(client, 200.2)  # two actions later: new action k lines up with previous action k + 2
    outcome = client.run_goal(continue_previous=True, inference_delay=2, return_candidates=True)
    result = succeeded(outcome)
    c = result.continuity
    assert (c.continued, c.status, c.frozen_actions, c.shift, c.guidance) == (True, "continued", 2, 2, "prefix")
    assert c.previous_stamp.sec + c.previous_stamp.nanosec * 1e-9 == pytest.approx(200.0)
    candidates = np.asarray(result.candidates.data, dtype=np.float64).reshape(-1, H, D)
    assert np.abs(candidates[:, :2] - previous[2:4]).max() <= 1e-4
    new = rows(result.trajectory)
    assert np.abs(new[:2] - previous[2:4]).max() <= 1e-4
    assert c.seam_jump == pytest.approx(float(np.linalg.norm(new[2] - previous[4])), abs=1e-4)
    # Row k executes at header.stamp + (k + 1) dt: the frozen rows fall at the previous chunk's times for them.
    assert stamp(result.trajectory) + DT == pytest.approx(stamp(first) + 3 * DT)
    assert {(f.frozen_actions, f.guidance) for f in outcome.feedback} == {(2, "prefix")}
    metrics = metrics_dict(result)
    assert metrics["context_frozen"] == "2" and metrics["seam_jump"] != ""


def test_bad_delays_are_named_errors_and_the_node_keeps_serving(client):
    observe(client, 300.0)
    negative = client.run_goal(continue_previous=True, inference_delay=-1)
    assert negative.result.error_code == ErrorCode.NEGATIVE_DELAY, negative.result.error_message
    too_long = client.run_goal(continue_previous=True, inference_delay=H)
    assert too_long.result.error_code == ErrorCode.DELAY_TOO_LONG, too_long.result.error_message
    assert "chunk length 8" in too_long.result.error_message
    for outcome in (negative, too_long):
        assert outcome.status == GoalStatus.STATUS_ABORTED and not outcome.feedback
    succeeded(client.run_goal())


def test_every_reason_to_start_fresh_is_named(client):
    observe(client, 400.0)
    assert succeeded(client.run_goal(reset_context=True)).continuity.status == "reset requested"
    observe(client, 400.1)
    changed = succeeded(client.run_goal(continue_previous=True, instruction="go somewhere else"))
    assert changed.continuity.status == "instruction changed"
    observe(client, 400.2)
    assert succeeded(client.run_goal(continue_previous=True, instruction="go somewhere else")).continuity.continued
    observe(client, 410.0)
    elapsed = succeeded(client.run_goal(continue_previous=True, instruction="go somewhere else"))
    assert elapsed.continuity.status == "previous chunk elapsed"
    observe(client, 405.0, clock=False)  # an older frame on a clock that went on (a bag replayed from its start)
    older = succeeded(client.run_goal(continue_previous=True, instruction="go somewhere else"))
    assert older.continuity.status == "observation older than the previous chunk"
    for result in (changed, elapsed, older):
        assert not result.continuity.continued and math.isnan(result.continuity.seam_jump)


def test_a_rollout_cannot_continue_a_chunk(client):
    observe(client, 500.0)
    succeeded(client.run_goal(reset_context=True))
    observe(client, 500.1)
    outcome = client.run_goal(continue_previous=True, rollout=True)
    assert outcome.status == GoalStatus.STATUS_ABORTED
    assert outcome.result.error_code == ErrorCode.CONTEXT_UNSUPPORTED, outcome.result.error_message


def test_staleness_and_the_latency_estimate_follow_the_simulated_clock(client):
    observe(client, 600.0)
    # More than MAX_AGE_S of host time passes, by the node's own 1 Hz diagnostics timer; simulated time does not.
    client.wait_diagnostics(int(MAX_AGE_S) + 3)
    result = succeeded(client.run_goal())
    metrics = metrics_dict(result)
    assert float(metrics["goal_ms"]) > 0 and float(metrics["latency_estimate_ms"]) == 0.0
    continued = succeeded(client.run_goal(continue_previous=True))
    assert continued.continuity.frozen_actions == 0  # no simulated time passes while a goal runs
    client.publish_clock(600.0 + MAX_AGE_S + 1.0)
    stale = client.run_goal()
    assert stale.result.error_code == ErrorCode.STALE_OBSERVATION, stale.result.error_message


def test_a_frame_two_dt_older_than_the_goal_freezes_those_two_rows_too(client):
    observe(client, 700.0)
    first = succeeded(client.run_goal(reset_context=True)).trajectory
    previous = rows(first)
    # The next frame is stamped 700.3 and the goal comes at 700.5 (a 5 Hz camera, a slow link): the robot has
    # executed two more rows of the old chunk since the frame. No simulated time passes while a goal runs here (the
    # test holds the clock), so the serving latency is 0 and those two rows are the whole frozen count.
    observe(client, 700.3)
    client.publish_clock(700.5)
    result = succeeded(client.run_goal(continue_previous=True))
    c = result.continuity
    assert (c.continued, c.shift, c.frozen_actions) == (True, 3, 2)
    metrics = metrics_dict(result)
    assert float(metrics["latency_ms"]) == pytest.approx(200.0, abs=1.0)
    assert float(metrics["frozen_latency_ms"]) == pytest.approx(200.0, abs=1.0)
    # The frozen rows are the old chunk's rows at their times: new rows 0, 1 at 700.4, 700.5 = old rows 3, 4.
    assert np.abs(rows(result.trajectory)[:2] - previous[3:5]).max() <= 1e-4
