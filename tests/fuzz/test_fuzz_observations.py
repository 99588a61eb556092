"""Fuzz the node's image and state decoding (``serving/frames.py``, ``serving/observation_buffer.py``), with duck-typed messages.

The functions under test read ``sensor_msgs/Image`` and ``sensor_msgs/JointState`` field by field and never import
rclpy, so the messages here are ``SimpleNamespace`` objects with the same field names, holding what rclpy can hand
over: ``uint32`` sizes, a string encoding, bytes, ``array.array('B')`` or a list of bytes for ``data``, float lists
(NaN and Inf included) of any lengths for the joint state. A frame is converted to RGB of its declared size or
refused with a named ``FrameError``; a refused frame never replaces the buffer's last good one; a goal is served a
finite state or refused with a named observation error.
"""

from __future__ import annotations

import array
import math
import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from _fuzz import TIMEOUT_S, check_named, fuzz_settings, record
from hypothesis import event, example, given
from hypothesis import strategies as st

from trajectory_ensemble_node.errors import ErrorCode, FrameError
from trajectory_ensemble_node.serving.frames import SUPPORTED_ENCODINGS, image_to_rgb
from trajectory_ensemble_node.serving.observation_buffer import ObservationBuffer

pytestmark = pytest.mark.timeout(TIMEOUT_S)

TOPIC, STATE_TOPIC = "/camera/image_raw", "/joint_states"
UINT32 = 2**32 - 1
BYTES_PER_PIXEL = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}
OBSERVATION_CODES = {ErrorCode.NO_OBSERVATION, ErrorCode.STALE_OBSERVATION, ErrorCode.NON_FINITE_STATE,
                     ErrorCode.INVALID_FRAME, ErrorCode.OBSERVATION_SCHEMA, ErrorCode.IMAGE_TOO_LARGE}

encodings = st.one_of(st.sampled_from(SUPPORTED_ENCODINGS), st.sampled_from(SUPPORTED_ENCODINGS),
                      st.sampled_from(["", "RGB8", "rgb16", "16UC1", "yuv422", "bayer_rggb8", "32FC1", "rgb8 ",
                                       "jpeg"]), st.text(max_size=8))
sizes = st.one_of(st.integers(0, 40), st.sampled_from([0, 1, 2**16, 2**31, UINT32]))


def _stamp(sec: int = 10, nanosec: int = 0) -> SimpleNamespace:
    return SimpleNamespace(sec=sec, nanosec=nanosec)


@st.composite
def image_messages(draw: st.DrawFn) -> SimpleNamespace:
    """An Image: usually consistent fields (so conversion runs), often one field off, sometimes anything."""
    encoding = draw(encodings)
    height, width = draw(sizes), draw(sizes)
    channels = BYTES_PER_PIXEL.get(encoding, draw(st.integers(1, 4)))
    step = width * channels + draw(st.sampled_from([0, 0, 0, 1, 3, -1, -channels]))
    if draw(st.integers(0, 4)) == 0:
        step = draw(sizes)  # anything
    step = min(max(step, 0), UINT32)
    length = step * height
    if length > 16_384 or draw(st.integers(0, 3)) == 0:
        length = draw(st.integers(0, 2048))  # truncated or padded (or the size could never be real)
    elif draw(st.integers(0, 5)) == 0:
        length = max(0, length + draw(st.sampled_from([-1, 1, -step, step])))
    length = min(length, 20_000)  # +step may be 2**32: the data stays small whatever the header claims
    # Bytes from a drawn seed: cheaper to draw and replay than st.binary(min_size=length) of up to 20 KB.
    raw = random.Random(draw(st.integers(0, 2**32))).randbytes(length)
    container = draw(st.sampled_from(["bytes", "array", "list"]))
    data: Any = raw if container == "bytes" else array.array("B", raw) if container == "array" else list(raw)
    return SimpleNamespace(encoding=encoding, height=height, width=width, step=step, is_bigendian=0, data=data,
                           header=SimpleNamespace(stamp=_stamp(), frame_id="cam"))


floats = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def state_messages(draw: st.DrawFn) -> SimpleNamespace:
    """A JointState: usually equal-length arrays (or empty velocity/effort), sometimes ragged, NaN/Inf often."""
    count = draw(st.integers(0, 9))
    names = draw(st.lists(st.text(max_size=6), min_size=count, max_size=count))

    def values(length: int) -> list[float]:
        return draw(st.lists(st.one_of(st.floats(-10, 10), floats), min_size=length, max_size=length))

    lengths = [count if draw(st.integers(0, 4)) else draw(st.integers(0, 9)) for _ in range(3)]
    return SimpleNamespace(name=names, position=values(lengths[0]),
                           velocity=values(lengths[1] if draw(st.booleans()) else 0),
                           effort=values(lengths[2] if draw(st.booleans()) else 0),
                           header=SimpleNamespace(stamp=_stamp(), frame_id=""))


def _expected_rgb(msg: SimpleNamespace) -> np.ndarray:
    # The conversion, written out independently: rows of `step` bytes, the first width*channels of each, to RGB.
    channels = BYTES_PER_PIXEL[msg.encoding]
    rows = np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height, msg.step)[:, :msg.width * channels]
    pixels = rows.reshape(msg.height, msg.width, channels)
    if msg.encoding == "mono8":
        return np.repeat(pixels, 3, axis=2)
    rgb = pixels[..., :3]
    return rgb[..., ::-1] if msg.encoding.startswith("bgr") else rgb


GOOD = SimpleNamespace(encoding="rgb8", height=16, width=16, step=48, is_bigendian=0, data=bytes(range(256)) * 3,
                       header=SimpleNamespace(stamp=_stamp(), frame_id="cam"))


@fuzz_settings("observations")
@given(image_messages())
@example(SimpleNamespace(encoding="rgb8", height=UINT32, width=UINT32, step=UINT32, data=b"", header=GOOD.header))
@example(SimpleNamespace(encoding="mono8", height=2**31, width=1, step=1, data=b"\x00" * 2, header=GOOD.header))
def test_any_image_message_converts_to_its_declared_size_or_is_refused_by_name(msg: SimpleNamespace) -> None:
    record("observations")
    try:
        rgb = image_to_rgb(msg.encoding, int(msg.height), int(msg.width), int(msg.step), msg.data)
    except Exception as error:  # noqa: BLE001 - the property: only named errors
        assert isinstance(error, FrameError), f"unnamed {type(error).__name__}: {error!r}"
        check_named(error, {ErrorCode.INVALID_FRAME})
        event(f"refused: {error.cause}")
        return
    event(f"converted: {msg.encoding}")
    assert rgb.dtype == np.uint8 and rgb.shape == (msg.height, msg.width, 3) and rgb.flags.c_contiguous
    assert np.array_equal(rgb, _expected_rgb(msg))
    assert not np.shares_memory(rgb, np.frombuffer(msg.data, np.uint8)) if not isinstance(msg.data, list) else True


@fuzz_settings("observation_buffer")
@given(st.lists(st.one_of(image_messages(), state_messages()), min_size=1, max_size=6))
def test_a_refused_frame_never_replaces_the_last_good_one_and_goals_get_finite_state_or_a_named_error(
        messages: list[SimpleNamespace]) -> None:
    record("observation_buffer")
    buffer = ObservationBuffer([TOPIC], STATE_TOPIC, clock=lambda: 100.0)
    assert buffer.offer_image(TOPIC, GOOD) is None
    served = buffer.latest(1.0).image
    for msg in messages:
        if hasattr(msg, "encoding"):
            try:
                refused = buffer.offer_image(TOPIC, msg)
            except Exception as error:  # noqa: BLE001 - offer_image returns its refusal, it never raises
                pytest.fail(f"offer_image raised {type(error).__name__}: {error!r}")
            now = buffer.latest(1.0).image
            if refused is not None:
                check_named(refused, {ErrorCode.INVALID_FRAME, ErrorCode.IMAGE_TOO_LARGE})
                assert now is served or np.array_equal(now, served), "a refused frame replaced the last good one"
            else:
                assert np.array_equal(now, _expected_rgb(msg))
                served = now
        else:
            try:
                refused = buffer.offer_state(msg)
            except Exception as error:  # noqa: BLE001 - a ragged state is refused by name, never raised
                pytest.fail(f"offer_state raised {type(error).__name__}: {error!r}")
            if refused is not None:
                check_named(refused, OBSERVATION_CODES)
        try:
            observation = buffer.latest(1.0, require_state=True)
        except Exception as error:  # noqa: BLE001 - the property: only named errors
            event(f"goal refused: {ErrorCode(check_named(error, OBSERVATION_CODES)).name}")
            continue
        event("goal served")
        state = observation.state
        assert state is not None and len(state.positions) > 0
        for values in (state.positions, state.velocities, state.efforts):
            assert all(math.isfinite(v) for v in np.asarray(values, np.float64).tolist()), state
