"""The node over real DDS serves a model that takes the robot's state (issue 58, item 3).

One node process serves the module: a tiny checkpoint written here, whose ``action_stats.json`` declares a state input
(``shoulder``, ``elbow``, ``gripper``), fed from an image topic and a ``JointState`` topic. What a user checks: the
state changes the actions, the same frame, state and seed give the same bits, the joints are picked by name from a
shuffled message, the node's result is the in-process model's bit for bit, a stale pair (``STATE_SKEW``), a missing joint (``OBSERVATION_SCHEMA``) and a NaN
(``NON_FINITE_STATE``) are refused by name, the result says which state it was served from (``state_stamp``), and
``/diagnostics`` shows the state's age and the joints the model reads.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import (  # noqa: E402
    BASE_PARAMS,
    NS,
    Stamps,
    image_msg,
    metrics_dict,
    serve_node,
    succeeded,
    write_state_checkpoint,
)
from action_msgs.msg import GoalStatus  # noqa: E402
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402

from trajectory_ensemble_node.catalog import load_pipeline  # noqa: E402
from trajectory_ensemble_node.contract import CandidateTrajectorySpec  # noqa: E402
from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

NAMES = ("shoulder", "elbow", "gripper")
LOW, HIGH = [-1.0, 0.0, 0.0], [1.0, 2.0, 0.08]
STATE = {"shoulder": 0.25, "elbow": 1.5, "gripper": 0.04}
OTHER = {"shoulder": -0.75, "elbow": 0.2, "gripper": 0.01}
SEED = 17
SKEW_S = 0.05
STATE_TOPIC = f"{NS}/observation/state"
SERVED = {"candidate_count": 2, "num_inference_steps": 2, "max_state_skew_s": SKEW_S,
          # Generous staleness: goals on two busy cores take seconds, and only the pairing rule is under test here.
          "max_observation_age_s": 120.0}
stamps = Stamps(5000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_state")
    checkpoint = write_state_checkpoint(tmp / "state_model", NAMES, LOW, HIGH)
    for served in serve_node(tmp, ros_domain_id, {"model": str(checkpoint), **SERVED}):
        yield (*served, checkpoint)


@pytest.fixture
def client(served):
    return served[1]


def joint_state(stamp_s: float, positions: dict[str, float]) -> JointState:
    msg = JointState(name=list(positions), position=list(positions.values()))
    total = int(round(stamp_s * 1e9))
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(total, 1_000_000_000)
    return msg


def observe(client, positions: dict[str, float], *, state_offset_s: float = 0.0) -> int:
    """The same camera frame (pixels of seed 0) stamped anew, and a joint state stamped ``state_offset_s`` from it,
    each published until the node reports it; returns the frame's stamp (seconds)."""
    stamp = stamps()
    client.publish_joint_state(joint_state(stamp + state_offset_s, positions))
    client.publish_image(stamp)
    return stamp


def actions(result) -> bytes:
    return np.asarray(result.trajectory.data, dtype=np.float32).tobytes()


def assert_refused(outcome, code: ErrorCode, *fragments: str) -> None:
    assert outcome.status == GoalStatus.STATUS_ABORTED, (outcome.status, outcome.result.error_message)
    assert outcome.result.error_code == code, outcome.result.error_message
    for fragment in fragments:
        assert fragment in outcome.result.error_message, outcome.result.error_message
    assert len(outcome.result.trajectory.data) == 0


def test_the_state_changes_the_actions_and_the_same_frame_state_and_seed_give_the_same_bits(client):
    # Joints in another order than the model's, and one it does not read: picked by name.
    shuffled = {"wrist": 9.0, "gripper": STATE["gripper"], "shoulder": STATE["shoulder"], "elbow": STATE["elbow"]}
    first_stamp = observe(client, shuffled)
    first = succeeded(client.run_goal(use_seed=True, seed=SEED))
    metrics = metrics_dict(first)
    assert metrics["state_stamp"] == f"{first_stamp}.000000000" and metrics["state_skew_ms"] == "0.000"
    assert first.trajectory.horizon == 8 and len(first.trajectory.data) == 8 * 10

    observe(client, OTHER)
    other = succeeded(client.run_goal(use_seed=True, seed=SEED))
    assert other.base_seed == first.base_seed == SEED
    assert actions(other) != actions(first)
    assert np.abs(np.asarray(other.trajectory.data) - np.asarray(first.trajectory.data)).max() > 1e-4

    again_stamp = observe(client, STATE, state_offset_s=0.02)  # the model's order now, 20 ms after the frame
    again = succeeded(client.run_goal(use_seed=True, seed=SEED))
    assert actions(again) == actions(first)
    metrics = metrics_dict(again)
    assert metrics["state_stamp"] == f"{again_stamp}.020000000" and metrics["state_skew_ms"] == "20.000"


def test_the_nodes_result_is_the_in_process_models_for_the_same_frame_state_and_seed(served):
    _node, client, checkpoint = served
    observe(client, STATE)
    goal = succeeded(client.run_goal(use_seed=True, seed=SEED))
    # The same checkpoint, frame (the harness's pixels of seed 0), state and seed, in this process, with the node's
    # settings (BASE_PARAMS and this module's).
    settings = {**BASE_PARAMS, **SERVED}
    frame = image_msg(0)
    rgb = np.frombuffer(bytes(frame.data), dtype=np.uint8).reshape(frame.height, frame.width, 3)
    pipe, _ = load_pipeline(str(checkpoint), "cpu", "float32")
    local = Cosmos3ActionModel(pipe, max_batch_candidates=settings["max_batch_candidates"]).generate(
        prompt=settings["instruction"], num_inference_steps=settings["num_inference_steps"], guidance_scale=1.0,
        fps=settings["fps"], action=CosmosActionCondition(
            mode="policy", chunk_size=settings["chunk_size"], domain_name=settings["domain_name"],
            resolution_tier=256, image=rgb, view_point="ego_view"),
        spec=CandidateTrajectorySpec(count=2, reducer=settings["reducer"]), base_seed=SEED,
        state=[STATE[name] for name in NAMES])
    np.testing.assert_array_equal(np.asarray(goal.trajectory.data, dtype=np.float32).reshape(8, 10),
                                  local.action.numpy())


def test_a_pair_further_apart_than_max_state_skew_is_refused_with_state_skew(client):
    stamp = observe(client, STATE, state_offset_s=-0.2)
    assert_refused(client.run_goal(use_seed=True, seed=SEED), ErrorCode.STATE_SKEW, STATE_TOPIC,
                   f"{stamp}.000000000", f"{stamp - 1}.800000000", f"max_state_skew_s={SKEW_S:g}")
    # The state of the frame's moment arrives: the same frame is served.
    client.publish_joint_state(joint_state(stamp, STATE))
    assert metrics_dict(succeeded(client.run_goal(use_seed=True, seed=SEED)))["state_stamp"] == f"{stamp}.000000000"


def test_a_missing_joint_and_a_nan_are_refused_by_name_and_the_node_keeps_serving(client):
    observe(client, {"shoulder": 0.25, "gripper": 0.04})
    assert_refused(client.run_goal(), ErrorCode.OBSERVATION_SCHEMA, STATE_TOPIC, "['elbow']")
    observe(client, {**STATE, "elbow": float("nan")})
    assert_refused(client.run_goal(), ErrorCode.NON_FINITE_STATE, "NaN", "joints elbow")
    observe(client, STATE)
    succeeded(client.run_goal())


def test_diagnostics_show_the_states_age_and_the_joints_the_model_reads(client):
    observe(client, STATE)
    values = client.observation_values()
    assert values["state_names"] == "shoulder, elbow, gripper"
    assert float(values["state_age_s"]) >= 0.0 and values["state_age_s"] == values[f"age_s {STATE_TOPIC}"]
