"""The node over real DDS, bad input: every case ends in a named error, and the node keeps serving.

One node process serves the module: two tiled cameras (``image_topics``), ``require_state``, two concurrent goals,
weight updates enabled under a temporary ``weights_dir``, and the test-only ``fault_injection`` hook
(``TRAJECTORY_ENSEMBLE_TESTING=1``). Tests run in file order: the first two rely on topics not having been
published yet.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import (  # noqa: E402
    NS,
    Stamps,
    image_msg,
    metrics_dict,
    published_through,
    serve_node,
    stamp_sec,
    wait_until_stale,
)
from action_msgs.msg import GoalStatus  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

CAMERA_A, CAMERA_B = f"{NS}/camera_a", f"{NS}/camera_b"
MAX_AGE_S = 4.0
stamps = Stamps(3000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_bad_inputs")
    (tmp / "weights").mkdir()
    yield from serve_node(
        tmp, ros_domain_id,
        {"image_topics": ["~/camera_a", "~/camera_b"], "view_point": "concat_view", "require_state": True,
         "max_concurrent_goals": 2, "enable_weight_updates": True, "weights_dir": str(tmp / "weights"),
         "max_observation_age_s": MAX_AGE_S},
        image_topics=(CAMERA_A, CAMERA_B),
    )


@pytest.fixture
def client(served):
    return served[1]


def fresh_observation(client, stamp: int | None = None) -> int:
    stamp = stamps() if stamp is None else stamp
    client.publish_observation(stamp, [0.1] * 7)
    return stamp


def assert_aborted(outcome, code: ErrorCode, *fragments: str) -> None:
    assert outcome.status == GoalStatus.STATUS_ABORTED, (outcome.status, outcome.result.error_message)
    assert outcome.result.error_code == code, outcome.result.error_message
    for fragment in fragments:
        assert fragment in outcome.result.error_message
    assert outcome.result.trajectory.horizon == 0 and len(outcome.result.trajectory.data) == 0


def test_no_observation_yet_names_the_silent_topic(client):
    client.publish_image(stamps(), topics=[CAMERA_A])
    assert_aborted(client.run_goal(), ErrorCode.NO_OBSERVATION, CAMERA_B)


def test_the_joint_state_is_required_and_nan_in_it_aborts(client):
    client.publish_image(stamps())
    assert_aborted(client.run_goal(), ErrorCode.NO_OBSERVATION, f"{NS}/observation/state")
    client.publish_state([0.0, float("nan"), 0.0], names=["a", "b", "c"])
    client.clear("trajectory")
    assert_aborted(client.run_goal(), ErrorCode.NON_FINITE_STATE, "NaN", "joints b")
    good = fresh_observation(client)
    outcome = client.run_goal(candidate_count=2)
    assert outcome.status == GoalStatus.STATUS_SUCCEEDED, outcome.result.error_message
    assert (outcome.result.trajectory.horizon, outcome.result.trajectory.action_dim) == (8, 10)
    # Only the good goal published: its trajectory is the first to land.
    assert len(published_through(client, "trajectory", good)) == 1


def test_a_stale_observation_names_the_topic_and_its_age(client):
    fresh_observation(client)
    wait_until_stale(client, MAX_AGE_S)
    outcome = client.run_goal()
    assert_aborted(outcome, ErrorCode.STALE_OBSERVATION, CAMERA_A, "s old", f"max_observation_age_s={MAX_AGE_S:g}")


def test_bad_frames_are_rejected_counted_logged_once_and_the_last_good_frame_stays(client, served):
    good = fresh_observation(client)
    bad = {
        "encoding": image_msg(stamps(), encoding="32FC1", width=4, height=4, step=16),
        "step": image_msg(stamps(), step=10),
        "data_length": image_msg(stamps(), data=bytes(100)),
    }
    # Each until the node counts it under its cause.
    client.publish_frames(CAMERA_A, {f"frames_rejected_{cause}": msg for cause, msg in bad.items()})
    outcome = client.run_goal(candidate_count=2)
    assert outcome.status == GoalStatus.STATUS_SUCCEEDED, outcome.result.error_message
    assert stamp_sec(outcome.result.trajectory) == good
    _, values = client.latest_status(
        "observations", predicate=lambda v: all(int(v.get(f"frames_rejected_{c}", 0)) >= 1 for c in bad))
    assert int(values["frames_rejected_dimensions"]) == 0
    log = served[0].log()
    for cause in bad:
        assert log.count(f"rejected a frame on {CAMERA_A} ({cause})") == 1, cause


def test_candidate_count_above_max_and_unknown_reducer_are_refused_before_any_model_work(client):
    fresh_observation(client)
    too_many = client.run_goal(candidate_count=9)
    assert_aborted(too_many, ErrorCode.CANDIDATE_COUNT_ABOVE_MAX, "candidate_count 9", "max_candidates=8")
    unknown = client.run_goal(reducer="majority_vote")
    assert_aborted(unknown, ErrorCode.UNKNOWN_REDUCER, "majority_vote", "mean")
    assert too_many.feedback == [] and unknown.feedback == []


def test_an_8_mib_goal_string_is_quoted_briefly_in_the_result_and_the_log(client, served):
    # Issue 61, row 3: an 8 MiB reducer got code 12 with an 8.4 MB error_message and an 8.4 MB log line.
    node = served[0]
    fresh_observation(client)
    for field, code in (("reducer", ErrorCode.UNKNOWN_REDUCER), ("guidance", ErrorCode.INVALID_CONTEXT)):
        logged = node.log_path.stat().st_size
        refused = client.run_goal(**{field: "r" * (8 * 1024 * 1024)})
        assert_aborted(refused, code, f"unknown {field} str of 8388608 characters, starting 'rrrr")
        assert len(refused.result.error_message.encode()) < 4096
        client.wait(lambda: f"aborted ({code.name})" in node.log()[logged:], 30, "the goal's log line")
        assert node.log_path.stat().st_size - logged < 4096, f"{field}: the log grew by more than 4 KiB"


@pytest.mark.parametrize(
    ("fault", "code"),
    [("engine_exception", ErrorCode.ENGINE_FAILURE), ("out_of_memory", ErrorCode.OUT_OF_MEMORY),
     # Non-finite candidates are dropped before reduction; with none left the group fails for too few valid ones.
     ("nan_candidates", ErrorCode.TOO_FEW_VALID_CANDIDATES)],
)
def test_an_engine_failure_aborts_that_goal_only_and_publishes_nothing(client, fault, code):
    assert client.set_parameter("fault_injection", fault).successful
    fresh_observation(client)
    client.clear("trajectory")
    failed = client.run_goal(candidate_count=2)
    assert_aborted(failed, code)
    engine, values = client.latest_status("engine", predicate=lambda v: "last_error" in v)
    assert engine.level == b"\x01" and ErrorCode(code).name in values["last_error"]
    later = fresh_observation(client)
    recovered = client.run_goal(candidate_count=2)
    assert recovered.status == GoalStatus.STATUS_SUCCEEDED, recovered.result.error_message
    # The failed goal published nothing: the recovered goal's trajectory is the first to land.
    assert [stamp_sec(m) for m in published_through(client, "trajectory", later)] == [later]
    # Nothing is left behind: no goal and no engine group still holds a slot.
    _, engine = client.latest_status("engine", predicate=lambda v: "last_error" not in v)
    assert engine["groups_running"] == engine["groups_queued"] == "0"
    _, goals = client.latest_status("goals", predicate=lambda v: v.get("goals_running") == "0")
    assert goals["goals_waiting"] == "0"


def test_update_weights_reads_only_safetensors_inside_weights_dir(client, served):
    from trajectory_ensemble_node.models.cosmos3 import build_pipeline

    weights = served[0].log_path.parent / "weights"
    name = "layers.0.mlp.up_proj.weight"
    shape = build_pipeline("tiny").transformer.state_dict()[name].shape
    save_file({name: torch.zeros(shape)}, str(weights / "update.safetensors"))
    outside = weights.parent / "outside.safetensors"
    save_file({name: torch.zeros(shape)}, str(outside))
    torch.save({name: torch.zeros(shape)}, str(weights / "update.pt"))

    for path, fragment in (("../outside.safetensors", "'..'"), (str(outside), "outside weights_dir"),
                           ("update.pt", "pickle"), ("missing.safetensors", "does not exist")):
        response = client.update_weights(path)
        assert not response.success and fragment in response.message, (path, response.message)
        assert response.weights_version == 0
    response = client.update_weights("update.safetensors")
    assert response.success, response.message
    assert response.weights_version == 1 and "weights_version 1" in response.message
    fresh_observation(client)
    outcome = client.run_goal(candidate_count=2)
    assert outcome.result.weights_version == 1 and metrics_dict(outcome.result)["weights_version"] == "1"
