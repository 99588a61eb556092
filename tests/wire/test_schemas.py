"""Observation schemas (``wire/schemas.py``): the keys each client sends, their layouts, and what is refused."""

from __future__ import annotations

import numpy as np
import pytest

from trajectory_ensemble_node.errors import (
    ImageTooLargeError,
    MissingObservationKeyError,
    ObservationArrayError,
    ObservationSchemaError,
    ParameterError,
    UnknownObservationKeyError,
)
from trajectory_ensemble_node.openpi.extras import EXTRA_KEYS
from trajectory_ensemble_node.serving.input_limits import InputLimits
from trajectory_ensemble_node.wire.schemas import DROID_VIEWS, compose_droid, get_schema

# The layouts are tested on small arrays; the model's minimum side (16) is tested in
# tests/openpi/test_wire_frames_on_arrival.py.
LIMITS = InputLimits(2000, 0, 64 * 1024 * 1024, 4096 * 4096, min_image_side=1)
TOY = get_schema("toy")
DROID = get_schema("droid")


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
