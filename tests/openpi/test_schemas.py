"""Observation schemas and per-request extras: the keys each client sends, and the same checks as a ROS goal."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from trajectory_ensemble_node.errors import (
    CandidateCountError,
    DelayTooLongError,
    ExecutionContextError,
    GoalRequestError,
    ImageTooLargeError,
    InvalidSpecError,
    MissingObservationKeyError,
    ObservationArrayError,
    ObservationSchemaError,
    ParameterError,
    UnknownObservationKeyError,
    UnknownReducerError,
)
from trajectory_ensemble_node.openpi.extras import EXTRA_KEYS, parse_extras, plan_request
from trajectory_ensemble_node.wire.schemas import DROID_VIEWS, compose_droid, get_schema
from trajectory_ensemble_node.ros.goals import plan_action_goal
from trajectory_ensemble_node.serving.input_limits import InputLimits
from trajectory_ensemble_node.serving.params import validate

# The layouts are tested on small arrays; the model's minimum side (16) is tested in test_wire_frames_on_arrival.py.
LIMITS = InputLimits(2000, 0, 64 * 1024 * 1024, 4096 * 4096, min_image_side=1)
TOY = get_schema("toy")
DROID = get_schema("droid")
VALID_REDUCERS = ("mean", "median", "medoid", "mode", "backward_coherence", "mode_continuity")


def rgb(height: int = 6, width: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def parse(schema, obs):
    return schema.parse(obs, extras=EXTRA_KEYS, limits=LIMITS)


def test_toy_takes_one_frame_and_an_optional_prompt():
    image = rgb()
    parsed = parse(TOY, {"observation/image": image, "prompt": "go", "seed": 3})
    np.testing.assert_array_equal(parsed.image, image)
    assert parsed.prompt == "go" and parsed.layout == "composite"
    assert parse(TOY, {"observation/image": image}).prompt == ""


def test_droid_takes_robolabs_composite_or_strands_three_views_in_the_same_layout():
    composite = rgb(540, 640)
    assert parse(DROID, {"observation/image": composite, "observation/joint_position": np.zeros(7),
                         "observation/gripper_position": np.zeros(1), "session_id": "ep1"}).image.shape == (540, 640, 3)
    ext1, ext2, wrist = rgb(4, 5, 1), rgb(4, 5, 2), rgb(4, 5, 3)
    parsed = parse(DROID, dict(zip(DROID_VIEWS, (ext1, ext2, wrist))) | {"observation/gripper_position": 0.5})
    assert parsed.layout == "views" and parsed.image.shape == (8, 10, 3)
    # Wrist view on top (resized to the row), the exterior views below, untouched, side by side.
    np.testing.assert_array_equal(parsed.image[4:, :5], ext1)
    np.testing.assert_array_equal(parsed.image[4:, 5:], ext2)
    np.testing.assert_array_equal(parsed.image, compose_droid([ext1, ext2, wrist]))
    assert parsed.state["observation/gripper_position"].shape == ()


def test_a_missing_image_is_named_and_the_error_lists_the_keys_expected():
    with pytest.raises(MissingObservationKeyError) as caught:
        parse(DROID, {"prompt": "x"})
    text = str(caught.value)
    assert "missing ['observation/image']" in text
    for key in ("observation/image", *DROID_VIEWS, "observation/joint_position", "prompt"):
        assert key in text
    with pytest.raises(MissingObservationKeyError, match=r"missing \['observation/wrist_image_left'\]"):
        parse(DROID, {DROID_VIEWS[0]: rgb(), DROID_VIEWS[1]: rgb()})


@pytest.mark.parametrize(("obs", "error", "quoted"), [
    ({"observation/image": rgb().astype(np.float32)}, ObservationArrayError, "dtype float32"),
    ({"observation/image": rgb()[..., :2]}, ObservationArrayError, "[6, 8, 2]"),
    ({"observation/image": [[1, 2, 3]]}, ObservationArrayError, "got list"),
    ({"observation/image": rgb(), "prompt": 7}, ObservationArrayError, "got int 7"),
    ({"observation/image": rgb(), "num_candidate": 2}, UnknownObservationKeyError, "['num_candidate']"),
])
def test_wrong_dtype_shape_type_or_an_unknown_key_is_named(obs, error, quoted):
    with pytest.raises(error) as caught:
        parse(TOY, obs)
    assert quoted in str(caught.value) and "observation/image" in str(caught.value)
    assert isinstance(caught.value, ObservationSchemaError) and caught.value.code == 25


def test_droid_state_and_views_are_checked():
    with pytest.raises(ObservationArrayError, match=r"observation/joint_position must have shape \[7\]"):
        parse(DROID, {"observation/image": rgb(), "observation/joint_position": np.zeros(6)})
    with pytest.raises(ObservationArrayError, match="NaN or Inf"):
        parse(DROID, {"observation/image": rgb(), "observation/gripper_position": np.array([np.nan])})
    with pytest.raises(ObservationArrayError, match="must share one shape"):
        parse(DROID, dict(zip(DROID_VIEWS, (rgb(4, 5), rgb(4, 6), rgb(4, 5)))))
    with pytest.raises(ObservationSchemaError, match="mixes image layouts"):
        parse(DROID, {"observation/image": rgb(), DROID_VIEWS[0]: rgb()})


def test_the_nodes_image_limits_apply_to_every_view():
    small = InputLimits(2000, 0, 10_000, 4096 * 4096, min_image_side=1)
    with pytest.raises(ImageTooLargeError, match="max_image_bytes=10000"):
        TOY.parse({"observation/image": rgb(100, 100)}, extras=EXTRA_KEYS, limits=small)


def test_an_unknown_schema_is_a_parameter_error():
    with pytest.raises(ParameterError, match="openpi_schema: 'aloha'"):
        get_schema("aloha")


# --- extras ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("obs", "error", "quoted"), [
    ({"num_candidates": "4"}, InvalidSpecError, "num_candidates must be an integer, got str '4'"),
    ({"num_candidates": True}, InvalidSpecError, "got bool True"),
    ({"seed": 1.5}, InvalidSpecError, "seed must be an integer"),
    ({"reducer": 3}, InvalidSpecError, "reducer must be a string"),
    ({"return_candidates": 1}, InvalidSpecError, "return_candidates must be true or false"),
    ({"deadline_ms": -1}, GoalRequestError, "deadline_ms must be >= 0"),
    ({"deadline_ms": "soon"}, GoalRequestError, "deadline_ms must be a number"),
    ({"endpoint": "train"}, GoalRequestError, "'train'"),
    ({"stamp": float("nan")}, GoalRequestError, "stamp must be finite"),
    ({"session_id": "x" * 300}, GoalRequestError, "at most 256 characters"),
    ({"guidance": 1}, GoalRequestError, "guidance must be a string, got int 1"),
])
def test_extras_of_the_wrong_type_are_named(obs, error, quoted):
    with pytest.raises(error) as caught:
        parse_extras(obs)
    assert quoted in str(caught.value)


def _goal(**fields):
    defaults = {"candidate_count": 0, "reducer": "", "return_candidates": False, "use_seed": False, "seed": 0,
                "instruction": "", "rollout": False, "continue_previous": False, "reset_context": False,
                "inference_delay": 0, "guidance": "", "deadline": None, "min_observation_stamp": None}
    return SimpleNamespace(**{**defaults, **fields})


@pytest.mark.parametrize(("extras", "goal"), [
    ({"num_candidates": 99}, {"candidate_count": 99}),
    ({"reducer": "nope"}, {"reducer": "nope"}),
    ({"reducer": "pose_gripper"}, {"reducer": "pose_gripper"}),
    ({"num_candidates": 2, "reducer": "none"}, {"candidate_count": 2, "reducer": "none"}),
    ({"inference_delay": 8}, {"inference_delay": 8}),
    ({"inference_delay": -1}, {"inference_delay": -1}),
    ({"continue_previous": True, "guidance": "sideways"}, {"continue_previous": True, "guidance": "sideways"}),
])
def test_an_extra_gets_the_same_error_and_text_as_the_same_goal(extras, goal):
    params = validate({})
    with pytest.raises(Exception) as over_the_wire:
        plan_request(parse_extras(extras), "", params, default_instruction=params.instruction,
                     valid_reducers=VALID_REDUCERS)
    with pytest.raises(Exception) as as_a_goal:
        plan_action_goal(_goal(**goal), params, default_instruction=params.instruction, valid_reducers=VALID_REDUCERS)
    assert type(over_the_wire.value) is type(as_a_goal.value)
    assert str(over_the_wire.value) == str(as_a_goal.value)
    assert isinstance(over_the_wire.value, (CandidateCountError, UnknownReducerError, InvalidSpecError,
                                            DelayTooLongError, ExecutionContextError))


def test_defaults_seed_and_deadline_become_the_goals_plan():
    params = validate({})
    plan = plan_request(parse_extras({"seed": 2**64 - 1, "num_candidates": 3, "deadline_ms": 250,
                                      "return_candidates": True}), "", params,
                        default_instruction=params.instruction, valid_reducers=VALID_REDUCERS)
    assert plan.base_seed == 2**64 - 1 and plan.spec.count == 3 and plan.spec.reducer == params.reducer
    assert plan.deadline_s == pytest.approx(0.25) and plan.return_candidates and plan.instruction == params.instruction
    continued = plan_request(parse_extras({"continue_previous": True}), "go", params,
                             default_instruction=params.instruction, valid_reducers=VALID_REDUCERS)
    assert continued.continue_previous and continued.spec.reducer == params.continuity_reducer
    assert continued.instruction == "go" and continued.spec.count == params.candidate_count
    assert continued.guidance == params.guidance_mode
    unguided = plan_request(parse_extras({"continue_previous": True, "guidance": "none"}), "go", params,
                            default_instruction=params.instruction, valid_reducers=VALID_REDUCERS)
    assert unguided.guidance == "none"  # a request picks its guidance as a goal does (bid: selection only)
