"""Frames and joint states checked where they arrive (issue 45, row 7): one rule in ``serving/input_limits.py``, applied
by ``serving/observation_buffer.py``.

A frame under the model's minimum side (16 pixels for Cosmos 3: the pipeline rounds each side down to a multiple of
its VAE's factor, so a smaller one became 0 and the group failed as ``ENGINE_FAILURE``) is dropped on arrival,
counted under ``frames_rejected_dimensions``, and the last good frame serves the next goal. A ragged joint state is
dropped the same way (``states_rejected``). No DDS: the node does the same over DDS in
tests/ros/test_node_frames_on_arrival.py, the OpenPI server in tests/openpi/test_wire_frames_on_arrival.py.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sensor_msgs")

from sensor_msgs.msg import Image, JointState  # noqa: E402

from trajectory_ensemble_node.errors import (  # noqa: E402
    ErrorCode, FrameDimensionsError, NoObservationError, ObservationArrayError,
)
from trajectory_ensemble_node.models.cosmos3 import MIN_IMAGE_SIDE, build_pipeline, min_image_side  # noqa: E402
from trajectory_ensemble_node.serving.observation_buffer import ObservationBuffer  # noqa: E402
from trajectory_ensemble_node.serving.input_limits import (  # noqa: E402
    check_image_dimensions,
    check_joint_state_shape,
    state_values,
)


def rgb_image(height: int, width: int, sec: int) -> Image:
    msg = Image(height=height, width=width, encoding="rgb8", step=width * 3, data=bytes(height * width * 3))
    msg.header.stamp.sec = sec
    return msg


# --- the rule ------------------------------------------------------------------------------------------------------


def test_the_minimum_side_is_the_pipelines_vae_factor():
    assert MIN_IMAGE_SIDE == 16
    assert min_image_side(build_pipeline("tiny", seed=0)) == 16
    assert min_image_side(object()) == MIN_IMAGE_SIDE  # no video processor: the Cosmos 3 bound


@pytest.mark.parametrize(("height", "width"), [(1, 1), (15, 15), (2, 256), (256, 2), (15, 4096)])
def test_a_side_under_the_minimum_is_refused_with_the_size_quoted(height, width):
    with pytest.raises(FrameDimensionsError) as caught:
        check_image_dimensions(height, width, 16, source="image on /cam")
    assert caught.value.code == ErrorCode.INVALID_FRAME and caught.value.cause == "dimensions"
    assert f"image on /cam is {width}x{height}" in str(caught.value) and "at least 16 pixels" in str(caught.value)


@pytest.mark.parametrize(("height", "width"), [(16, 16), (16, 16000), (16000, 16), (480, 640)])
def test_any_aspect_with_both_sides_at_the_minimum_passes(height, width):
    check_image_dimensions(height, width, 16)


@pytest.mark.parametrize(("value", "quoted"), [
    ([0.0] * 6 + [[1.0, 2.0]], "ragged"),
    ([[0.0, 1.0], [2.0]], "ragged"),
    (["a"] * 7, "must be numbers"),
    ([True] * 7, "must be numbers"),
    (True, "must be numbers"),
    ([0.0] * 6 + [float("nan")], "NaN or Inf"),
    (np.array([np.inf]), "NaN or Inf"),
])
def test_state_values_refuse_ragged_non_numeric_and_non_finite(value, quoted):
    with pytest.raises(ObservationArrayError) as caught:
        state_values(value, what="observation/joint_position")
    assert caught.value.code == ErrorCode.OBSERVATION_SCHEMA
    assert quoted in str(caught.value) and "observation/joint_position" in str(caught.value)


def test_state_values_take_numbers_lists_and_arrays():
    assert state_values(0.5, what="g").shape == ()
    np.testing.assert_array_equal(state_values([1, 2, 3], what="j"), [1.0, 2.0, 3.0])
    assert state_values(np.zeros(7, np.float32), what="j").dtype == np.float64


def test_a_joint_state_with_arrays_of_different_lengths_is_ragged():
    check_joint_state_shape(["a", "b"], {"position": [0.0, 1.0], "velocity": [], "effort": []}, topic="/s")
    check_joint_state_shape([], {"position": [0.0, 1.0], "velocity": [0.0, 0.0], "effort": []}, topic="/s")
    with pytest.raises(ObservationArrayError, match="name 3, position 2"):
        check_joint_state_shape(["a", "b", "c"], {"position": [0.0, 1.0], "velocity": [], "effort": []}, topic="/s")
    with pytest.raises(ObservationArrayError, match="position 2, velocity 1"):
        check_joint_state_shape([], {"position": [0.0, 1.0], "velocity": [0.0], "effort": []}, topic="/s")


# --- the buffer ------------------------------------------------------------------------------------------------------


def test_a_tiny_frame_after_a_good_one_is_dropped_counted_and_the_good_one_serves():
    buffer = ObservationBuffer(["/cam"], min_image_side=16)
    assert buffer.offer_image("/cam", rgb_image(16, 16, sec=1)) is None
    for height, width in ((1, 1), (15, 15), (2, 256)):
        rejection = buffer.offer_image("/cam", rgb_image(height, width, sec=2))
        assert isinstance(rejection, FrameDimensionsError) and rejection.cause == "dimensions"
    assert buffer.rejected_counts()["dimensions"] == 3 and buffer.received_count() == 1
    observation = buffer.latest(60.0)
    assert observation.stamp.sec == 1 and observation.image.shape == (16, 16, 3)


def test_the_first_frame_being_tiny_names_it_in_the_goals_error():
    buffer = ObservationBuffer(["/cam"], min_image_side=16)
    buffer.offer_image("/cam", rgb_image(1, 1, sec=1))
    with pytest.raises(NoObservationError, match=r"no usable image on /cam; 1 frame\(s\) refused") as info:
        buffer.latest(60.0)
    assert "1x1" in str(info.value) and info.value.code == ErrorCode.NO_OBSERVATION


def test_a_ragged_joint_state_is_dropped_and_the_last_good_one_kept():
    buffer = ObservationBuffer(["/cam"], "/state", min_image_side=16)
    buffer.offer_image("/cam", rgb_image(16, 16, sec=1))
    assert buffer.offer_state(JointState(name=["a", "b"], position=[0.1, 0.2])) is None
    rejection = buffer.offer_state(JointState(name=["a", "b", "c"], position=[0.5, 0.6]))
    assert isinstance(rejection, ObservationArrayError) and "ragged" in str(rejection)
    assert buffer.states_rejected() == 1
    state = buffer.latest(60.0, require_state=True).state
    assert state is not None and state.positions.tolist() == [0.1, 0.2]


def test_a_ragged_first_joint_state_is_the_reason_a_goal_gets():
    buffer = ObservationBuffer(["/cam"], "/state")
    buffer.offer_image("/cam", rgb_image(2, 2, sec=1))
    buffer.offer_state(JointState(name=["a"], position=[0.1, 0.2]))
    with pytest.raises(NoObservationError, match="no usable joint state on /state; 1 frame") as info:
        buffer.latest(60.0, require_state=True)
    assert "name 1, position 2" in str(info.value)
