"""serving/observation_buffer.py: a model that takes state is served the joint state of the image's moment (issue 58,
item 3), with no DDS: the state stamped nearest the image, refused past ``max_state_skew_s`` (``STATE_SKEW``), its
joints picked by name in the model's order, a missing or non-finite joint refused by name, a bounded history."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from sensor_msgs.msg import Image, JointState  # noqa: E402

from trajectory_ensemble_node.errors import (  # noqa: E402
    ErrorCode,
    MissingObservationKeyError,
    NoObservationError,
    NonFiniteStateError,
    StaleObservationError,
    StateSkewError,
)
from trajectory_ensemble_node.serving.observation_buffer import STATE_HISTORY, ObservationBuffer  # noqa: E402

NAMES = ("shoulder", "elbow")
T0_NS = 1_700_000_000 * 1_000_000_000
"""Header stamps on a camera's clock, far from the buffer's arrival clock (so the two cannot be confused)."""


def image(stamp_ns: int) -> Image:
    msg = Image(height=2, width=2, encoding="rgb8", step=6, data=bytes(12))
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    return msg


def joint_state(stamp_ns: int, positions: dict[str, float]) -> JointState:
    msg = JointState(name=list(positions), position=list(positions.values()))
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
    return msg


def ms(value: float) -> int:
    return int(round(value * 1_000_000))


def state_buffer(skew_s: float = 0.05, names=NAMES) -> ObservationBuffer:
    return ObservationBuffer(["/cam"], "/state", clock=lambda: 100.0, state_names=names, max_state_skew_s=skew_s)


def test_the_image_is_paired_with_the_state_stamped_nearest_it_before_or_after():
    buffer = state_buffer()
    for i, offset in enumerate((-40, -12, 9, 30)):  # a 1 kHz-ish driver around a frame stamped T0
        assert buffer.offer_state(joint_state(T0_NS + ms(offset), {"shoulder": float(i), "elbow": -float(i)})) is None
    buffer.offer_image("/cam", image(T0_NS))
    observation = buffer.latest(1.0)
    # 9 ms after beats 12 ms before; the newest state (30 ms after) is not the one of the image's moment.
    assert observation.state_values == (2.0, -2.0)
    assert observation.state_skew_s == pytest.approx(0.009)
    assert observation.state_metrics() == {"state_stamp": "1700000000.009000000",
                                           "state_skew_ms": pytest.approx(9.0)}
    # A frame stamped just after the one before the image pairs with that one: nearest, whichever side.
    buffer.offer_image("/cam", image(T0_NS - ms(11)))
    observation = buffer.latest(1.0)
    assert observation.state_values == (1.0, -1.0) and observation.state_skew_s == pytest.approx(-0.001)
    assert observation.state_metrics()["state_stamp"] == "1699999999.988000000"


def test_equally_near_states_pair_with_the_later_one():
    buffer = state_buffer()
    buffer.offer_state(joint_state(T0_NS - ms(5), {"shoulder": 1.0, "elbow": 1.0}))
    buffer.offer_state(joint_state(T0_NS + ms(5), {"shoulder": 2.0, "elbow": 2.0}))
    buffer.offer_image("/cam", image(T0_NS))
    assert buffer.latest(1.0).state_values == (2.0, 2.0)


def test_a_pair_further_apart_than_max_state_skew_is_refused_with_its_code_then_served_once_a_state_fits():
    buffer = state_buffer(skew_s=0.05)
    buffer.offer_state(joint_state(T0_NS - ms(80), {"shoulder": 0.5, "elbow": 0.25}))
    buffer.offer_image("/cam", image(T0_NS))
    with pytest.raises(StateSkewError) as info:
        buffer.latest(1.0)
    assert info.value.code == ErrorCode.STATE_SKEW == 26
    message = str(info.value)
    assert "1700000000.000000000" in message and "1699999999.920000000" in message
    assert "0.080 s before it (max_state_skew_s=0.05)" in message and "/state" in message and "/cam" in message
    # Exactly at the limit is served: the limit is the most the stamps may differ.
    buffer.offer_state(joint_state(T0_NS + ms(50), {"shoulder": 0.75, "elbow": 0.5}))
    observation = buffer.latest(1.0)
    assert observation.state_values == (0.75, 0.5) and observation.state_skew_s == pytest.approx(0.05)


def test_an_unstamped_state_is_refused_with_a_hint():
    buffer = state_buffer()
    buffer.offer_state(JointState(name=list(NAMES), position=[0.0, 0.0]))
    buffer.offer_image("/cam", image(T0_NS))
    with pytest.raises(StateSkewError, match="stamped 0: does its publisher stamp"):
        buffer.latest(1.0)


def test_joints_are_picked_by_name_in_the_models_order_from_a_shuffled_state():
    buffer = state_buffer(names=("shoulder", "elbow", "gripper"))
    buffer.offer_state(joint_state(T0_NS, {"gripper": 0.04, "wrist": 9.0, "elbow": 1.5, "shoulder": 0.25}))
    buffer.offer_image("/cam", image(T0_NS))
    observation = buffer.latest(1.0)
    assert observation.state_values == (0.25, 1.5, 0.04)
    # The message itself is kept as it came (its order), for what else reads it (max_start_jump).
    assert observation.state.names == ("gripper", "wrist", "elbow", "shoulder")


def test_a_missing_joint_is_refused_by_name():
    buffer = state_buffer()
    buffer.offer_state(joint_state(T0_NS, {"shoulder": 0.25, "wrist": 1.0}))
    buffer.offer_image("/cam", image(T0_NS))
    with pytest.raises(MissingObservationKeyError) as info:
        buffer.latest(1.0)
    assert info.value.code == ErrorCode.OBSERVATION_SCHEMA
    assert "joint state on /state" in str(info.value) and "['elbow']" in str(info.value)


def test_a_non_finite_joint_is_refused_by_name_even_when_an_earlier_state_was_finite():
    buffer = state_buffer()
    buffer.offer_state(joint_state(T0_NS, {"shoulder": 0.25, "elbow": 1.0}))
    buffer.offer_state(joint_state(T0_NS + ms(1), {"shoulder": 0.25, "elbow": float("nan")}))
    buffer.offer_image("/cam", image(T0_NS + ms(1)))
    with pytest.raises(NonFiniteStateError, match="joints elbow") as info:
        buffer.latest(1.0)
    assert info.value.code == ErrorCode.NON_FINITE_STATE
    # The newest state reports NaN: the robot is broken now, so not even the finite state nearest the image serves.
    buffer.offer_image("/cam", image(T0_NS))
    with pytest.raises(NonFiniteStateError, match="joints elbow"):
        buffer.latest(1.0)


def test_the_newest_state_must_still_be_recent():
    now = [100.0]
    buffer = ObservationBuffer(["/cam"], "/state", clock=lambda: now[0], state_names=NAMES, max_state_skew_s=0.05)
    buffer.offer_state(joint_state(T0_NS, {"shoulder": 0.0, "elbow": 0.0}))
    now[0] = 102.0
    buffer.offer_image("/cam", image(T0_NS))
    with pytest.raises(StaleObservationError, match="joint state on /state is 2.00 s old"):
        buffer.latest(1.0)


def test_the_history_is_bounded_and_a_frame_older_than_it_is_refused():
    buffer = state_buffer()
    period = ms(1)
    for i in range(STATE_HISTORY + 10):
        buffer.offer_state(joint_state(T0_NS + i * period, {"shoulder": float(i), "elbow": 0.0}))
    # The first ten are gone: a frame of their moment finds its nearest kept state (state 10) 0.1 s away.
    buffer.offer_image("/cam", image(T0_NS - ms(90)))
    with pytest.raises(StateSkewError, match=f"{STATE_HISTORY} joint state\\(s\\) kept, stamped 1700000000.010000000"):
        buffer.latest(1.0)
    buffer.offer_image("/cam", image(T0_NS + 10 * period))
    assert buffer.latest(1.0).state_values == (10.0, 0.0)
    buffer.clear("the clock jumped back")
    buffer.offer_image("/cam", image(T0_NS))
    with pytest.raises(NoObservationError, match="no joint state"):
        buffer.latest(1.0)


def test_a_model_without_state_reads_the_newest_state_and_pairs_nothing():
    buffer = ObservationBuffer(["/cam"], "/state", clock=lambda: 100.0)
    buffer.offer_state(joint_state(T0_NS - 10_000 * ms(1), {"a": 1.0}))
    buffer.offer_state(joint_state(T0_NS - 5_000 * ms(1), {"a": 2.0}))
    buffer.offer_image("/cam", image(T0_NS))
    assert buffer.latest(1.0).state is None
    observation = buffer.latest(1.0, require_state=True)  # 5 s apart: no skew rule without a state-taking model
    assert observation.state.positions.tolist() == [2.0]
    assert observation.state_values is None and observation.state_skew_s is None
    assert observation.state_metrics() == {}


def test_a_bad_skew_limit_is_refused():
    with pytest.raises(ValueError, match="max_state_skew_s must be > 0, got 0"):
        state_buffer(skew_s=0)
