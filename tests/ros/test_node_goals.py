"""The node over real DDS, happy paths: result shape, candidates, stamps, joint trajectory, feedback, diagnostics.

One node process serves the whole module (tiny model, droid_lerobot: width 10, chunk 8, 3 steps).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import NS, Stamps, metrics_dict, serve_node, stamp_sec, succeeded  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402
from builtin_interfaces.msg import Time  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

JOINTS = [f"joint_{i}" for i in range(10)]
FPS = 10.0
OBSERVATION_WAIT_S = 4.0
stamps = Stamps(1000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_goals")
    # Staleness is tested in test_node_bad_inputs; here a slow first goal must not make the next one stale.
    yield from serve_node(tmp, ros_domain_id, {"joint_names": JOINTS, "rollout_dir": str(tmp / "rollouts"),
                                               "fps": FPS, "max_observation_age_s": 120.0,
                                               "observation_wait_s": OBSERVATION_WAIT_S})


@pytest.fixture
def client(served):
    return served[1]


def test_result_is_chunk_by_domain_width_and_candidates_come_only_when_asked(client):
    client.publish_image(stamps())
    plain = client.run_goal(candidate_count=3)
    assert plain.status == GoalStatus.STATUS_SUCCEEDED, plain.result.error_message
    trajectory = plain.result.trajectory
    assert plain.result.error_code == 0 and plain.result.error_message == ""
    assert (trajectory.horizon, trajectory.action_dim, trajectory.candidate_count) == (8, 10, 3)
    assert len(trajectory.data) == 80 and np.isfinite(trajectory.data).all()
    assert trajectory.domain_name == "droid_lerobot" and trajectory.reducer == "mean" and trajectory.normalized
    assert trajectory.dt == pytest.approx(1.0 / FPS)
    assert len(plain.result.candidates.data) == 0 and len(plain.result.candidates.seeds) == 0

    asked = client.run_goal(candidate_count=4, return_candidates=True, reducer="medoid")
    candidates = asked.result.candidates
    assert (candidates.horizon, candidates.action_dim, len(candidates.seeds)) == (8, 10, 4)
    assert list(candidates.candidate_ids) == [0, 1, 2, 3] and len(candidates.data) == 4 * 8 * 10
    assert candidates.seeds[0] == asked.result.base_seed == asked.result.trajectory.base_seed
    # medoid returns one of the candidates, exactly.
    rows = np.asarray(candidates.data, dtype=np.float32).reshape(4, 80)
    assert any(np.array_equal(row, np.asarray(asked.result.trajectory.data, dtype=np.float32)) for row in rows)
    client.wait(lambda: len(client.messages("candidates")) == 1, 10, "one CandidateArray on ~/candidates")


def test_a_goal_seed_reproduces_the_trajectory_and_a_fresh_seed_is_reported(client):
    client.publish_image(stamps(), seed=3)
    first = client.run_goal(candidate_count=2, use_seed=True, seed=2**63 + 5)
    again = client.run_goal(candidate_count=2, use_seed=True, seed=2**63 + 5)
    fresh = client.run_goal(candidate_count=2)
    assert first.result.base_seed == again.result.base_seed == 2**63 + 5
    assert list(first.result.trajectory.data) == list(again.result.trajectory.data)
    assert fresh.result.base_seed != first.result.base_seed
    assert list(fresh.result.trajectory.data) != list(first.result.trajectory.data)


def test_published_trajectory_and_joint_trajectory_carry_the_observation_stamp_and_timing(client):
    stamp = stamps()
    client.publish_image(stamp)
    client.clear("trajectory", "joint_trajectory")
    outcome = client.run_goal(candidate_count=2)
    assert outcome.status == GoalStatus.STATUS_SUCCEEDED
    assert stamp_sec(outcome.result.trajectory) == stamp
    published = client.wait(lambda: client.messages("trajectory"), 10, "~/trajectory")[-1]
    assert stamp_sec(published) == stamp and list(published.data) == list(outcome.result.trajectory.data)
    joint = client.wait(lambda: client.messages("joint_trajectory"), 10, "~/joint_trajectory")[-1]
    assert stamp_sec(joint) == stamp and list(joint.joint_names) == JOINTS and len(joint.points) == 8
    times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in joint.points]
    assert times == pytest.approx([(k + 1) / FPS for k in range(8)])
    np.testing.assert_allclose(joint.points[3].positions, outcome.result.trajectory.data[30:40], rtol=1e-6)


def test_a_goal_that_names_its_frame_waits_for_it_and_is_served_from_it(client):
    client.publish_image(stamps())
    wanted = stamps()
    # The goal overtakes its frame (a client that publishes a frame, then asks for a plan from it): the frame is
    # published only once the node executes the goal.
    pending = client.send_goal(candidate_count=2, min_observation_stamp=Time(sec=wanted))
    assert pending.accepted
    client.wait_executing(pending)
    assert not pending.result_future.done()
    client.publish_image(wanted)
    outcome = client.result(pending)
    assert outcome.status == GoalStatus.STATUS_SUCCEEDED, outcome.result.error_message
    assert stamp_sec(outcome.result.trajectory) == wanted
    # A frame already there (or a newer one) serves at once.
    newer = stamps()
    client.publish_image(newer)
    served = succeeded(client.run_goal(candidate_count=2, min_observation_stamp=Time(sec=wanted)))
    assert stamp_sec(served.trajectory) == newer


def test_a_goal_whose_frame_never_comes_ends_with_its_own_code_and_a_cancel_ends_the_wait(client):
    client.publish_image(stamps())
    missing = stamps() + 100
    started = time.monotonic()
    outcome = client.run_goal(candidate_count=2, min_observation_stamp=Time(sec=missing))
    assert outcome.status == GoalStatus.STATUS_ABORTED
    assert outcome.result.error_code == ErrorCode.OBSERVATION_NOT_RECEIVED
    assert f"{missing}.000000000" in outcome.result.error_message and "observation_wait_s=4" in \
        outcome.result.error_message
    # Not refused at once: it waited out observation_wait_s. A lower bound on a wait the node enforces, which a loaded
    # host can only lengthen (while it waits for its frame a goal is neither running nor queued, so /diagnostics
    # have no event to show it by).
    assert time.monotonic() - started >= OBSERVATION_WAIT_S - 0.1
    assert not [f for f in outcome.feedback if f.stage == "denoising"]

    pending = client.send_goal(candidate_count=2, min_observation_stamp=Time(sec=missing))
    client.wait_executing(pending)
    client.cancel(pending)
    canceled = client.result(pending)
    # The cancel ended the wait: had the wait run out first, the goal would have ended OBSERVATION_NOT_RECEIVED.
    assert canceled.status == GoalStatus.STATUS_CANCELED
    assert canceled.result.error_code == ErrorCode.CANCELED
    assert not [f for f in canceled.feedback if f.stage == "denoising"]
    # The node keeps serving.
    client.publish_image(stamps())
    succeeded(client.run_goal(candidate_count=2))


def test_feedback_reports_every_denoising_step(client):
    client.publish_image(stamps())
    outcome = client.run_goal(candidate_count=2)
    # Feedback and the result travel on different DDS channels with no order between them, so the last feedback
    # messages may land just after the result (the harness reads them from the feedback topic for that reason).
    client.wait(lambda: outcome.feedback and outcome.feedback[-1].stage == "done", 5, "the last ('done') feedback")
    denoising = [(f.step, f.total_steps) for f in outcome.feedback if f.stage == "denoising"]
    assert denoising == [(1, 3), (2, 3), (3, 3)]
    assert outcome.feedback[0].stage in ("queued", "encoding") and outcome.feedback[-2].stage == "reducing"
    # The last feedback carries the goal's metrics, as the result does.
    assert {kv.key: kv.value for kv in outcome.feedback[-1].metrics}["candidate_count"] == "2"


def test_result_and_diagnostics_carry_the_engine_metrics_and_the_goal_counters(client):
    client.publish_image(stamps())
    outcome = client.run_goal(candidate_count=3)
    metrics = metrics_dict(outcome.result)
    for key in ("total_ms", "denoise_ms", "encode_ms", "queue_ms", "peak_memory_bytes", "goal_ms",
                "node_overhead_ms"):
        assert float(metrics[key]) >= 0, key
    assert metrics["candidate_count"] == "3" and metrics["physical_forwards"] == "3"
    assert float(metrics["goal_ms"]) >= float(metrics["total_ms"])
    engine, values = client.latest_status("engine", predicate=lambda v: v.get("goal_ms") == metrics["goal_ms"])
    assert engine.level == b"\x00" and "untrained demo weights" in engine.message
    assert values["model_notice"] == "untrained demo weights" and values["weights_version"] == "0"
    assert values["total_ms"] == metrics["total_ms"] and values["peak_memory_bytes"] == metrics["peak_memory_bytes"]
    _, goals = client.latest_status("goals", predicate=lambda v: int(v.get("goals_succeeded", 0)) >= 1)
    assert set(goals) >= {"goals_succeeded", "goals_aborted", "goals_canceled", "goals_preempted", "goals_rejected"}
    _, observations = client.latest_status("observations")
    assert float(observations["observation_age_s"]) >= 0 and "frames_rejected_encoding" in observations


def test_rollout_goal_returns_the_path_of_its_record(client, served):
    client.publish_image(stamps())
    outcome = client.run_goal(candidate_count=2, rollout=True)
    assert outcome.status == GoalStatus.STATUS_SUCCEEDED, outcome.result.error_message
    path = outcome.result.rollout_path
    assert path.endswith(".safetensors") and path.startswith(str(served[0].log_path.parent / "rollouts"))


def test_update_weights_is_disabled_by_default(client):
    response = client.update_weights("anything.safetensors")
    assert not response.success and response.message == "weight updates are disabled (set enable_weight_updates)"


def test_startup_log_names_the_untrained_demo_weights(served):
    startup = [line for line in served[0].log().splitlines() if "loading model" in line or "] ready: " in line]
    assert len(startup) == 2 and all("untrained demo weights" in line for line in startup)
    assert f"action {NS}/generate_trajectory" in startup[1]
