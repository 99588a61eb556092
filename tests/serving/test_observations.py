"""serving/observations.py, frames.py, observation_buffer.py: image decoding, frame rejection, tiling, staleness and joint-state checks (no DDS)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("rclpy")

from sensor_msgs.msg import Image, JointState  # noqa: E402

from trajectory_ensemble_node.errors import (  # noqa: E402
    ErrorCode, FrameDataLengthError, FrameDimensionsError, FrameStepError, NoObservationError, NonFiniteStateError,
    ObservationNotReceivedError, StaleObservationError, UnsupportedEncodingError,
)
from trajectory_ensemble_node.serving.frames import BYTES_PER_PIXEL, image_to_rgb  # noqa: E402
from trajectory_ensemble_node.serving.observation_buffer import ObservationBuffer  # noqa: E402


def image(encoding: str, height: int = 2, width: int = 3, *, step: int | None = None, data: bytes | None = None,
          sec: int = 7, nanosec: int = 0) -> Image:
    channels = BYTES_PER_PIXEL.get(encoding, 3)
    step = width * channels if step is None else step
    if data is None:
        data = bytes(range(step * height))
    msg = Image(height=height, width=width, encoding=encoding, step=step, data=data)
    msg.header.stamp.sec, msg.header.stamp.nanosec = sec, nanosec
    msg.header.frame_id = "cam"
    return msg


def test_every_supported_encoding_becomes_rgb_uint8():
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    cases = {
        "rgb8": rgb.tobytes(),
        "bgr8": rgb[..., ::-1].tobytes(),
        "rgba8": np.concatenate([rgb, np.full((2, 3, 1), 255, np.uint8)], axis=-1).tobytes(),
        "bgra8": np.concatenate([rgb[..., ::-1], np.full((2, 3, 1), 9, np.uint8)], axis=-1).tobytes(),
    }
    for encoding, data in cases.items():
        out = image_to_rgb(encoding, 2, 3, len(data) // 2, data)
        assert out.dtype == np.uint8 and out.shape == (2, 3, 3), encoding
        np.testing.assert_array_equal(out, rgb, err_msg=encoding)
    mono = image_to_rgb("mono8", 2, 3, 3, bytes(range(6)))
    np.testing.assert_array_equal(mono[..., 0], mono[..., 2])
    np.testing.assert_array_equal(mono[..., 1], np.arange(6).reshape(2, 3))


def test_padded_rows_are_cropped_and_array_data_is_read_without_copy_errors():
    data = bytes([1, 2, 3, 4, 5, 6, 0, 0, 7, 8, 9, 10, 11, 12, 0, 0])  # two 2-pixel rows padded to 8 bytes
    out = image_to_rgb("rgb8", 2, 2, 8, data)
    assert out.reshape(-1).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    msg = image("rgb8", step=8, data=data, width=2)  # rclpy stores uint8[] as array.array
    assert image_to_rgb(msg.encoding, 2, 2, 8, msg.data).shape == (2, 2, 3)


@pytest.mark.parametrize(
    ("msg", "error", "cause"),
    [
        (image("32FC1"), UnsupportedEncodingError, "encoding"),
        (image("rgb8", step=5), FrameStepError, "step"),
        (image("rgb8", data=bytes(17)), FrameDataLengthError, "data_length"),
        (image("rgb8", height=0, data=b""), FrameDimensionsError, "dimensions"),
    ],
)
def test_bad_frames_are_rejected_by_name_counted_and_the_last_good_frame_stays(msg, error, cause):
    clock = [100.0]
    buffer = ObservationBuffer(["/img"], "/state", clock=lambda: clock[0])
    assert buffer.offer_image("/img", image("rgb8", sec=1)) is None
    rejection = buffer.offer_image("/img", msg)
    assert isinstance(rejection, error) and rejection.cause == cause
    assert buffer.first_rejection(rejection) and not buffer.first_rejection(rejection)
    assert buffer.offer_image("/img", msg).cause == cause
    assert buffer.rejected_counts()[cause] == 2 and sum(buffer.rejected_counts().values()) == 2
    assert buffer.latest(1.0).stamp.sec == 1  # the good frame is still served
    assert buffer.received_count() == 1


def test_missing_stale_and_nan_state_are_refused_with_topic_and_age():
    clock = [10.0]
    buffer = ObservationBuffer(["/a", "/b"], "/state", clock=lambda: clock[0])
    with pytest.raises(NoObservationError, match="/a"):
        buffer.latest(1.0)
    buffer.offer_image("/a", image("rgb8", sec=5))
    with pytest.raises(NoObservationError, match="/b") as info:
        buffer.latest(1.0)
    assert info.value.code == ErrorCode.NO_OBSERVATION
    clock[0] = 10.5
    buffer.offer_image("/b", image("rgb8", sec=6, width=2, height=1))
    clock[0] = 10.9
    obs = buffer.latest(1.0)
    # Tiled left to right, padded to the tallest; stamped with (and as old as) the oldest part.
    assert obs.image.shape == (2, 5, 3) and obs.stamp.sec == 5 and obs.age_s == pytest.approx(0.9)
    assert (obs.image[1, 3:] == 0).all()
    clock[0] = 11.2
    with pytest.raises(StaleObservationError, match=r"/a is 1\.20 s old") as info:
        buffer.latest(1.0)
    assert info.value.code == ErrorCode.STALE_OBSERVATION
    clock[0] = 10.9
    with pytest.raises(NoObservationError, match="joint state"):
        buffer.latest(1.0, require_state=True)
    buffer.offer_state(JointState(name=["a", "b"], position=[0.0, float("nan")]))
    with pytest.raises(NonFiniteStateError, match="joints b") as info:
        buffer.latest(1.0, require_state=True)
    assert info.value.code == ErrorCode.NON_FINITE_STATE
    buffer.offer_state(JointState(name=["a", "b"], position=[0.0, 1.0]))
    assert buffer.latest(1.0, require_state=True).state.positions.tolist() == [0.0, 1.0]
    assert set(buffer.ages()) == {"/a", "/b", "/state"}


def test_a_goal_waits_for_a_frame_stamped_at_or_after_the_one_it_names_on_every_topic():
    buffer = ObservationBuffer(["/a", "/b"])
    wanted = 7 * 1_000_000_000
    assert not buffer.has_stamp(wanted)
    buffer.offer_image("/a", image("rgb8", sec=7))
    buffer.offer_image("/b", image("rgb8", sec=6))
    assert not buffer.has_stamp(wanted)  # the observation is as new as its oldest part
    # Arrives while the goal waits (from the subscription's thread): offered only once the wait has begun, which the
    # wait shows by asking whether it was stopped. It returns on that frame, not on its timeout (which would raise).
    waiting = threading.Event()

    def offer_once_waiting() -> None:
        assert waiting.wait(60.0)
        buffer.offer_image("/b", image("rgb8", sec=8))

    threading.Thread(target=offer_once_waiting, daemon=True).start()
    buffer.wait_for_stamp(wanted, timeout_s=60.0, stopped=lambda: waiting.set())
    assert waiting.is_set() and buffer.has_stamp(wanted)
    buffer.wait_for_stamp(wanted, timeout_s=0.0)  # already there: returns at once, even with no time to wait


def test_a_frame_that_never_comes_is_a_named_error_and_a_stop_ends_the_wait():
    buffer = ObservationBuffer(["/a"])
    buffer.offer_image("/a", image("rgb8", sec=7))
    with pytest.raises(ObservationNotReceivedError,
                       match=r"no frame on /a stamped at or after 9\.000000000 within observation_wait_s=0\.2 s "
                             r"\(latest: 7\.000000000\)") as info:
        buffer.wait_for_stamp(9 * 1_000_000_000, timeout_s=0.2)
    assert info.value.code == ErrorCode.OBSERVATION_NOT_RECEIVED
    with pytest.raises(ObservationNotReceivedError, match=r"latest: none"):
        ObservationBuffer(["/b"]).wait_for_stamp(1, timeout_s=0.0)

    class Canceled(Exception):
        pass

    stop: list[Exception] = []
    # A stop is announced by wake_waiters(): the wait is on an event, not a poll. Were it not woken, it would sit out
    # its 600 s (and the test's timeout would fail it); the frame never comes, so only the stop can end it.
    threading.Timer(0.2, lambda: (stop.append(Canceled()), buffer.wake_waiters())).start()
    with pytest.raises(Canceled):
        buffer.wait_for_stamp(9 * 1_000_000_000, timeout_s=600.0, stopped=lambda: stop[0] if stop else None)


def test_a_backward_clock_jump_clears_the_buffer_and_goals_hear_why_until_a_new_frame():
    clock = [1000.0]
    buffer = ObservationBuffer(["/a"], "/state", clock=lambda: clock[0], stamp_clock=lambda: clock[0])
    buffer.offer_image("/a", image("rgb8", sec=1000))
    buffer.offer_state(JointState(name=["a"], position=[0.0]))
    clock[0] = 10.0  # the simulator was reset
    assert buffer.clear("the clock jumped back 990.000 s")
    with pytest.raises(NoObservationError, match="no image on /a since the clock jumped back") as info:
        buffer.latest(1.0)
    assert info.value.code == ErrorCode.NO_OBSERVATION
    assert buffer.ages()["/a"] is None and buffer.ages()["/state"] is None
    buffer.offer_image("/a", image("rgb8", sec=10))
    assert buffer.latest(1.0).stamp.sec == 10
    with pytest.raises(NoObservationError, match="no joint state received yet on /state"):
        buffer.latest(1.0, require_state=True)


def test_a_frame_stamped_after_now_is_never_fresh():
    clock = [10.0]
    buffer = ObservationBuffer(["/a"], clock=lambda: clock[0], stamp_clock=lambda: clock[0])
    # In flight across a reset: stamped at the old time, received on the new one.
    buffer.offer_image("/a", image("rgb8", sec=1000))
    with pytest.raises(StaleObservationError, match=r"stamped 1000\.000000000, 990\.000 s after now"):
        buffer.latest(5.0)
    # A stamp a little ahead (the node's clock trails /clock) is served.
    buffer.offer_image("/a", image("rgb8", sec=10, nanosec=int(0.4e9)))
    assert buffer.latest(5.0).stamp.sec == 10
    # A frame that arrived "after now" (the arrival clock went back without a clear) is not served either.
    clock[0] = 9.0
    with pytest.raises(StaleObservationError, match="arrived 1.000 s after now"):
        buffer.latest(5.0)
