"""What a goal is served from, and how a message becomes it: the frame, joint state and observation types, and the
decoding of ``sensor_msgs/Image`` and ``sensor_msgs/JointState`` fields (duck-typed: rclpy is never imported).

The buffer that keeps the latest of each is :mod:`.observation_buffer`; waiting on it is :mod:`.observation_wait`.
The pixel codec itself is :mod:`.frames`, the value checks :mod:`.input_limits`.

No model code is imported here, not even through :mod:`.input_limits` (which reads the model's smallest side): the
decoders import it when they first run, in the node. ``replay`` reads stamps through this module right after it
publishes a frame, and seconds of importing the model stack there made the node refuse that frame as stale.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import GoalRequestError
from .frames import image_to_rgb

FUTURE_STAMP_TOLERANCE_S = 0.5
"""How far after "now" (the node's ROS clock) a frame's stamp may lie. Under ``use_sim_time`` the node's clock trails
``/clock`` by up to a ``/clock`` period plus its own update period
(:data:`trajectory_ensemble_node.ros.clock.CLOCK_UPDATE_HZ`), so a frame stamped by the simulator at its current time
can be ahead by tens of milliseconds; a frame from before a reset is ahead by the whole jump."""
FRAME_REJECT_CAUSES = ("encoding", "step", "data_length", "dimensions", "size")
"""Every ``FrameError.cause``; diagnostics report a counter for each."""


@dataclass(frozen=True)
class Frame:
    """One accepted image.

    Args:
        topic (`str`): The resolved topic it came on.
        image (`np.ndarray`): RGB ``uint8`` ``[H, W, 3]``.
        stamp (`Any`): The message's header stamp (``builtin_interfaces/Time``), copied into outputs.
        frame_id (`str`): The message's header frame id.
        received (`float`): ``time.monotonic()`` when it arrived.
    """

    topic: str
    image: np.ndarray
    stamp: Any
    frame_id: str
    received: float


@dataclass(frozen=True)
class JointStateSample:
    """The latest joint state (names, positions) and when it arrived."""

    topic: str
    names: tuple[str, ...]
    positions: np.ndarray
    stamp: Any
    received: float
    velocities: np.ndarray = field(default_factory=lambda: np.zeros(0))
    efforts: np.ndarray = field(default_factory=lambda: np.zeros(0))


def state_positions(state: JointStateSample, names: Sequence[str], width: int) -> tuple[float, ...]:
    """The joint positions, in action order: of ``names`` when given, else the first ``width`` joints.

    Raises:
        GoalRequestError: a named joint is missing from the state message.
    """
    if not names:
        return tuple(float(v) for v in state.positions[:width])
    index = {name: i for i, name in enumerate(state.names)}
    missing = [name for name in names if name not in index]
    if missing:
        raise GoalRequestError(f"~/observation/state has no joint(s) {missing} for max_start_jump (it has "
                               f"{list(state.names)}); set start_jump_joints")
    return tuple(float(state.positions[index[name]]) for name in names)


@dataclass(frozen=True)
class Observation:
    """What a goal is served from.

    Args:
        image (`np.ndarray`): RGB ``uint8``; the composite of every image topic when there are several.
        stamp (`Any`): Header stamp of the oldest frame that went into ``image`` (so a consumer never believes the
            observation is newer than its oldest part).
        frame_id (`str`): Frame id of that frame.
        age_s (`float`): Age of that oldest frame at the time of the call, in seconds.
        state (`JointStateSample`, *optional*): The joint state, when one was asked for: for a model that takes
            state, the one stamped nearest ``stamp``; otherwise the latest.
        state_values (`tuple[float, ...]`, *optional*): For a model that takes state, the positions of its
            ``state_names`` picked by name from ``state``, in the model's order (what the request carries).
        state_skew_s (`float`, *optional*): With ``state_values``: ``state``'s stamp minus ``stamp``, in seconds.
    """

    image: np.ndarray
    stamp: Any
    frame_id: str
    age_s: float
    state: JointStateSample | None = None
    state_values: tuple[float, ...] | None = None
    state_skew_s: float | None = None

    def state_metrics(self) -> dict[str, Any]:
        """What a result reports of the state it was served from: ``state_stamp`` (``sec.nanosec``, exact) and
        ``state_skew_ms`` (its stamp minus the image's); empty when no state was paired with the image."""
        if self.state is None or self.state_skew_s is None:
            return {}
        return {"state_stamp": stamp_text(stamp_ns(self.state.stamp)), "state_skew_ms": self.state_skew_s * 1000.0}


def decode_image(topic: str, msg: Any, received: float, min_image_side: int) -> Frame:
    """A ``sensor_msgs/Image`` as an RGB :class:`Frame`, refused by name when the model could not take it.

    Args:
        topic (`str`): The resolved topic it came on.
        msg (`sensor_msgs.msg.Image`): The message.
        received (`float`): When it arrived, on the buffer's clock.
        min_image_side (`int`): The model's smallest side (``InputLimits.min_image_side``).

    Raises:
        FrameError: an unsupported encoding, a wrong ``step``, truncated data, or a side under ``min_image_side``.
    """
    from .input_limits import check_image_dimensions  # in the node only: see the module docstring

    image = image_to_rgb(msg.encoding, int(msg.height), int(msg.width), int(msg.step), msg.data)
    check_image_dimensions(image.shape[0], image.shape[1], min_image_side, source=f"image on {topic}")
    return Frame(topic, image, msg.header.stamp, msg.header.frame_id, received)


def decode_state(topic: str, msg: Any, clock: Callable[[], float]) -> JointStateSample:
    """A ``sensor_msgs/JointState`` as a :class:`JointStateSample`; a ragged one is refused.

    NaN/Inf values are kept: a goal that uses the state refuses them (``check_state``).

    Args:
        topic (`str`): The resolved state topic.
        msg (`sensor_msgs.msg.JointState`): The message (``velocity`` and ``effort`` may be absent).
        clock (`Callable[[], float]`): Read once the message passed, for its arrival time.

    Raises:
        ObservationArrayError: names, positions, velocities or efforts of different lengths.
    """
    from .input_limits import check_joint_state_shape  # in the node only: see the module docstring

    check_joint_state_shape(msg.name, {"position": msg.position, "velocity": getattr(msg, "velocity", ()),
                                       "effort": getattr(msg, "effort", ())}, topic=topic)
    return JointStateSample(
        topic, tuple(msg.name), np.asarray(msg.position, dtype=np.float64), msg.header.stamp,
        clock(), np.asarray(getattr(msg, "velocity", ()), dtype=np.float64),
        np.asarray(getattr(msg, "effort", ()), dtype=np.float64),
    )


def stamp_ns(stamp: Any) -> int:
    """A ``builtin_interfaces/Time`` (duck-typed) in nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def stamp_text(ns: int) -> str:
    """Nanoseconds as ``sec.nanosec`` (nine digits), as errors quote stamps."""
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"
