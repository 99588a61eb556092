"""The node on a simulator's clock over real DDS (issue 36): a 1 kHz ``/clock``, resets, seeks, a paused simulator.

One node process runs with ``use_sim_time``; the test client publishes ``/clock`` at 1 kHz (Gazebo's default) from a
``SimClock`` at real-time factor 1 for the whole module, and moves that clock as a simulator would (a reset, a
seek, a pause). Every physical forward is paced to at least 0.1 s (test-only step delay), so a jump can land inside
a goal. Tests run in file order and assert what a client sees: results, codes, counts, the log and ``/diagnostics``.

Chunks span ``H * DT`` = 16 s of the simulator's time (``fps`` 1), more than twice what a goal took with both cores
busy beside the suite (6.7 s at load 9): a continuation then finds its chunk still running at its frame plus the
latency estimate, which is the premise of the frozen-count test (at 10 fps a 1.6 s chunk had elapsed by the next frame
when load slowed the goal, and the continuation started fresh; at 2 fps, 8 s, it had at load 9).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import NS, image_msg, metrics_dict, serve_node, succeeded  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

H, DT, STEPS = 16, 1.0, 6
STEP_DELAY_S = 0.1
NS_PER_S = 1_000_000_000


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_clock")
    for node, client in serve_node(tmp, ros_domain_id, {"use_sim_time": True, "candidate_count": 4,
                                                        "chunk_size": H, "fps": 1.0 / DT, "num_inference_steps": STEPS,
                                                        "max_observation_age_s": 3.0},
                                   step_delay_s=STEP_DELAY_S):
        out = client.clock_out()
        out.clock.jump(100 * NS_PER_S)
        out.clock.resume()
        out.start(1000.0)
        # Until the node hears /clock its time reads 0: a frame it got then would be 100 s old once the clock came.
        client.wait(lambda: "the clock jumped forward" in node.log(), 30.0, "the node to hear /clock")
        yield node, client


@pytest.fixture
def client(served):
    return served[1]


@pytest.fixture
def clock(client):
    return client.clock_out().clock


def frame_now(client, clock) -> int:
    """Publish a frame stamped at the simulator's time now (no settling: goals name it); returns its stamp (ns)."""
    stamp = clock.now_ns()
    msg = image_msg(stamp // NS_PER_S)
    msg.header.stamp.nanosec = stamp % NS_PER_S
    for publisher in client.image_pubs.values():
        for _ in range(3):
            publisher.publish(msg)
    return stamp


def stamp_time(ns: int):
    from builtin_interfaces.msg import Time

    return Time(sec=ns // NS_PER_S, nanosec=ns % NS_PER_S)


def goal_on_frame(client, clock, **fields):
    """A goal for a frame published just now: the node waits for that frame (``min_observation_stamp``)."""
    return client.run_goal(min_observation_stamp=stamp_time(frame_now(client, clock)), **fields)


def test_goals_complete_under_a_1_khz_clock(served, client, clock):
    node, _ = served
    published = client.clock_out().published
    outcomes = [goal_on_frame(client, clock, candidate_count=4) for _ in range(3)]
    for outcome in outcomes:
        result = succeeded(outcome)
        assert result.trajectory.horizon == H and metrics_dict(result)["candidate_count"] == "4"
    # The clock kept running at its rate the whole time: over a thousand messages a second.
    assert client.clock_out().published - published > 1000
    assert "Traceback" not in node.log()


def test_diagnostics_keep_coming_while_the_simulator_is_paused(client, clock):
    clock.pause()  # /clock still goes out, always the same time
    try:
        client.clear("diagnostics")
        client.wait(lambda: len(client.messages("diagnostics")) >= 3, 15.0, "three /diagnostics on a paused clock")
    finally:
        clock.resume()


def test_use_sim_time_cannot_be_changed_while_running(client, clock):
    result = client.set_parameter("use_sim_time", False)
    assert not result.successful and "use_sim_time is read-only" in result.reason
    # Still on the simulator's clock: a frame stamped on it is fresh, and the goal is served.
    succeeded(goal_on_frame(client, clock))


def test_a_backward_jump_drops_the_frames_and_the_chunk_and_says_why(served, client, clock):
    node, _ = served
    succeeded(goal_on_frame(client, clock, reset_context=True))
    clock.jump(-90 * NS_PER_S)  # a simulator reset: about 10 s after the module's start
    client.wait(lambda: "the clock jumped back" in node.log(), 30.0, "the jump in the node's log")
    stale = client.run_goal()  # no frame since the reset
    assert stale.status == GoalStatus.STATUS_ABORTED
    assert stale.result.error_code == ErrorCode.NO_OBSERVATION, stale.result.error_message
    assert "since the clock jumped back" in stale.result.error_message
    assert stale.result.continuity.status == "not served" and math.isnan(stale.result.continuity.seam_jump)
    # /diagnostics reports no frame (not a negative age at level OK).
    _, values = client.latest_status("observations", predicate=lambda v: v.get(f"age_s {NS}/observation/image")
                                     == "never")
    assert values["observation_age_s"] == "never"
    fresh = succeeded(goal_on_frame(client, clock, continue_previous=True))
    assert not fresh.continuity.continued and fresh.continuity.status == "clock jumped back"


def test_after_a_forward_jump_the_frozen_count_is_that_of_the_true_latency(served, client, clock):
    node, _ = served
    jumps = node.log().count("the clock jumped forward")  # the module's start was one (0 s to 100 s)
    succeeded(goal_on_frame(client, clock, reset_context=True))
    # A seek of 1000 s while the next goal denoises: its "latency" would read 1000 s.
    straddling = client.send_goal(min_observation_stamp=stamp_time(frame_now(client, clock)), continue_previous=True)
    client.wait(lambda: any(f.stage == "denoising" for f in straddling.feedback), 60.0, "the goal to denoise")
    clock.jump(1000 * NS_PER_S)
    jumped = metrics_dict(succeeded(client.result(straddling)))
    client.wait(lambda: node.log().count("the clock jumped forward") > jumps, 30.0, "the jump in the node's log")
    assert jumped["latency_sample_taken"] == "false"
    # The first goal after the seek starts fresh (its frame is 1000 s after the chunk) and measures the latency anew.
    first = succeeded(goal_on_frame(client, clock, continue_previous=True))
    assert first.continuity.status == "previous chunk elapsed"
    measured = metrics_dict(first)
    estimate_ms = float(measured["latency_estimate_ms"])
    assert measured["latency_sample_taken"] == "true"
    assert 0 < estimate_ms <= float(measured["latency_ms"]) < 60_000  # its own latency, nothing of the seek
    # The next continuation freezes the rows of that latency (what had gone since its stamp + the estimate).
    nxt = succeeded(goal_on_frame(client, clock, continue_previous=True))
    c, m = nxt.continuity, metrics_dict(nxt)
    # The premise, checked rather than assumed: the chunk of ``first`` (16 s) was still running at this frame.
    assert c.continued, f"the continuation did not continue ({c.status!r}): {m}"
    predicted_ms = float(m["frozen_latency_ms"])
    assert 0 <= predicted_ms - estimate_ms < 1000.0
    overlap = int(m["context_overlap"])
    assert c.continued and c.frozen_actions == min(math.ceil(predicted_ms / 1000.0 / DT - 1e-9), overlap, H - 1)


def test_the_node_stops_cleanly_with_the_clock_running(served):
    node, _ = served
    assert node.stop() == 0
