"""The observation buffer: the latest good frame per image topic, the latest joint state, stamps and staleness.

Subscriptions hand every incoming message to :class:`ObservationBuffer`; a goal asks it for the current
:class:`Observation`. A malformed frame (unsupported encoding, wrong ``step``, truncated data, a side the model cannot
encode) is rejected with a named :class:`FrameError`, counted per cause, logged once per cause, and the last good
frame stays in place: one corrupt message must not blind the robot, nor flood the log at camera rate, nor become the
frame every later goal fails on. A ragged joint state (arrays of different lengths) is dropped the same way.

Staleness is measured on this host's monotonic clock from when the frame *arrived*, not from its header stamp: the
stamp may come from another clock (a camera, a bag, simulation time), but how long ago we last heard from the
camera is what makes an observation stale. The header stamp is kept and copied into every output that the
observation produced. Two rules do read the stamp, on the node's ROS clock (``stamp_clock``):

- a frame stamped more than :data:`FUTURE_STAMP_TOLERANCE_S` after "now" is never fresh (it comes from before a
  clock reset, or from a camera whose clock runs ahead), and neither is one that *arrived* after "now";
- :meth:`clear` drops every frame and the state when the clock jumps back (the node calls it): until new ones
  arrive, goals are refused with ``NO_OBSERVATION`` and the reason.

This module reads message fields only (duck-typed ``sensor_msgs/Image`` and ``sensor_msgs/JointState``); it does
not import rclpy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import (  # noqa: F401 - the observation errors are importable from here too
    FrameDataLengthError,
    FrameDimensionsError,
    FrameError,
    FrameStepError,
    GoalRequestError,
    NoObservationError,
    NonFiniteStateError,
    ObservationArrayError,
    ObservationError,
    ObservationNotReceivedError,
    StaleObservationError,
    UnsupportedEncodingError,
)
from ..serving.frames import BYTES_PER_PIXEL, SUPPORTED_ENCODINGS, image_to_rgb, tile_views  # noqa: F401 - re-exported
from ..serving.input_limits import check_image_dimensions, check_joint_state_shape, check_state  # noqa: F401 - re-exported

FUTURE_STAMP_TOLERANCE_S = 0.5
"""How far after "now" (the node's ROS clock) a frame's stamp may lie. Under ``use_sim_time`` the node's clock trails
``/clock`` by up to a ``/clock`` period plus its own update period (:data:`.clock.CLOCK_UPDATE_HZ`), so a frame
stamped by the simulator at its current time can be ahead by tens of milliseconds; a frame from before a reset is
ahead by the whole jump."""
FRAME_REJECT_CAUSES = ("encoding", "step", "data_length", "dimensions", "size")
"""Every ``FrameError.cause``; diagnostics report a counter for each."""


# --- the buffer -----------------------------------------------------------------------------------------------------


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
        state (`JointStateSample`, *optional*): The latest joint state, when one was asked for.
    """

    image: np.ndarray
    stamp: Any
    frame_id: str
    age_s: float
    state: JointStateSample | None = None


@dataclass
class _TopicCounters:
    received: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FRAME_REJECT_CAUSES, 0))
    refused_since_good: int = 0
    """Frames refused since the last good one (the root cause a goal error quotes)."""
    last_refusal: str = ""


class ObservationBuffer:
    """Latest good frame per image topic plus the latest joint state. Thread-safe.

    Args:
        image_topics (`Sequence[str]`): Resolved image topic names, in tiling order.
        state_topic (`str`): Resolved joint state topic name (used in messages).
        clock (`Callable[[], float]`): Seconds frames arrive and age on: the host's monotonic clock, or the node's ROS
            clock under ``use_sim_time``; injectable for tests.
        stamp_clock (`Callable[[], float]`, *optional*): Seconds of the clock header stamps are on (the node's ROS
            clock), for the future-stamp rule; ``None`` skips it.
        min_image_side (`int`): Frames with a side under this are refused (cause ``dimensions``): the model's bound
            (``InputLimits.min_image_side``); 1 takes every frame that decodes.
    """

    def __init__(
        self, image_topics: Sequence[str], state_topic: str = "", clock: Callable[[], float] = time.monotonic,
        stamp_clock: Callable[[], float] | None = None, min_image_side: int = 1,
    ) -> None:
        if not image_topics:
            raise ValueError("ObservationBuffer needs at least one image topic")
        self.image_topics = tuple(image_topics)
        self.state_topic = state_topic
        self._clock = clock
        self._stamp_clock = stamp_clock
        self._cleared_because = ""
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._frames: dict[str, Frame] = {}
        self._state: JointStateSample | None = None
        self._counters = {topic: _TopicCounters() for topic in self.image_topics}
        self._state_counters = _TopicCounters(rejected={"shape": 0})
        self._min_image_side = min_image_side
        self._logged_causes: set[str] = set()

    # --- writers (subscription callbacks) ------------------------------------------------------------------------

    def offer_image(self, topic: str, msg: Any) -> FrameError | None:
        """Convert and store a ``sensor_msgs/Image``; on a bad frame keep the previous one.

        Args:
            topic (`str`): One of ``image_topics``.
            msg (`sensor_msgs.msg.Image`): The message.

        Returns:
            `FrameError` or `None`: the rejection, if the frame was rejected (already counted).
        """
        received = self._clock()
        counters = self._counters[topic]
        try:
            image = image_to_rgb(msg.encoding, int(msg.height), int(msg.width), int(msg.step), msg.data)
            check_image_dimensions(image.shape[0], image.shape[1], self._min_image_side, source=f"image on {topic}")
        except FrameError as error:
            self.count_rejection(topic, error.cause, str(error))
            return error
        frame = Frame(topic, image, msg.header.stamp, msg.header.frame_id, received)
        with self._lock:
            self._cleared_because = ""
            counters.received += 1
            counters.refused_since_good = 0
            self._frames[topic] = frame
            self._arrived.notify_all()
        return None

    def count_rejection(self, topic: str, cause: str, message: str) -> None:
        """Count a frame refused on ``topic`` (here or by a check before :meth:`offer_image`, e.g. its size).

        Args:
            topic (`str`): One of ``image_topics``.
            cause (`str`): One of :data:`FRAME_REJECT_CAUSES`.
            message (`str`): The refusal, quoted in the errors of goals that then find no usable frame.
        """
        counters = self._counters[topic]
        with self._lock:
            counters.rejected[cause] += 1
            counters.refused_since_good += 1
            counters.last_refusal = message

    def _refusals(self, topic: str) -> str:
        # "; 8 frames refused since: <why>": the root cause a goal error carries (caller holds no lock).
        with self._lock:
            counters = self._counters.get(topic, self._state_counters)
            count, last = counters.refused_since_good, counters.last_refusal
        if not count:
            return ""
        return f"; {count} frame(s) refused on it since, the last because: {last}"

    def first_rejection(self, error: FrameError) -> bool:
        """True the first time a rejection cause is seen (so the node logs each cause once, not at camera rate)."""
        with self._lock:
            if error.cause in self._logged_causes:
                return False
            self._logged_causes.add(error.cause)
            return True

    def offer_state(self, msg: Any) -> ObservationArrayError | None:
        """Store a ``sensor_msgs/JointState``; a ragged one is refused (counted) and the previous one kept.

        NaN/Inf values are stored and refused when a goal uses them (``check_state``): the state is a measurement of
        now, so a goal must not be served from an older one while the driver reports NaN.

        Returns:
            `ObservationArrayError` or `None`: the rejection, if the state was refused (already counted).
        """
        try:
            check_joint_state_shape(msg.name, {"position": msg.position, "velocity": getattr(msg, "velocity", ()),
                                               "effort": getattr(msg, "effort", ())}, topic=self.state_topic)
        except ObservationArrayError as error:
            with self._lock:
                counters = self._state_counters
                counters.rejected["shape"] += 1
                counters.refused_since_good += 1
                counters.last_refusal = str(error)
            return error
        sample = JointStateSample(
            self.state_topic, tuple(msg.name), np.asarray(msg.position, dtype=np.float64), msg.header.stamp,
            self._clock(), np.asarray(getattr(msg, "velocity", ()), dtype=np.float64),
            np.asarray(getattr(msg, "effort", ()), dtype=np.float64),
        )
        with self._lock:
            self._state = sample
            self._state_counters.received += 1
            self._state_counters.refused_since_good = 0
            self._arrived.notify_all()
        return None

    def clear(self, reason: str) -> bool:
        """Drop every frame and the joint state (the clock jumped back: they belong to the old time line).

        Args:
            reason (`str`): Why; goals refused for want of a frame quote it until a new one arrives.

        Returns:
            `bool`: whether anything was dropped.
        """
        with self._lock:
            had = bool(self._frames) or self._state is not None
            self._frames.clear()
            self._state = None
            self._cleared_because = reason
        return had

    # --- readers (goals, diagnostics) ----------------------------------------------------------------------------

    def latest(self, max_age_s: float, *, require_state: bool = False) -> Observation:
        """The observation a goal is served from.

        Args:
            max_age_s (`float`): Refuse frames (and the state, when required) that arrived longer ago than this.
            require_state (`bool`): Also require a recent, finite joint state.

        Raises:
            NoObservationError: a topic has delivered no good frame yet (or no state, when required).
            StaleObservationError: the newest good frame on a topic is older than ``max_age_s``.
            NonFiniteStateError: the required joint state holds NaN or Inf.
        """
        now = self._clock()
        stamp_now = self._stamp_clock() if self._stamp_clock is not None else None
        with self._lock:
            frames = [self._frames.get(topic) for topic in self.image_topics]
            state = self._state
            cleared = self._cleared_because
        for topic, frame in zip(self.image_topics, frames):
            if frame is None:
                why = self._refusals(topic)
                if why:
                    raise NoObservationError(f"no usable image on {topic}{why}")
                if cleared:
                    raise NoObservationError(f"no image on {topic} since {cleared}")
                raise NoObservationError(f"no image received yet on {topic}")
            age = now - frame.received
            if age > max_age_s:
                raise StaleObservationError(
                    f"latest image on {topic} is {age:.2f} s old (max_observation_age_s={max_age_s:g})"
                    + self._refusals(topic)
                )
            self._check_not_future(topic, frame, age, stamp_now)
        if require_state:
            if state is None:
                why = self._refusals(self.state_topic)
                raise NoObservationError(f"no {'usable ' if why else ''}joint state "
                                         f"{'on' if why else 'received yet on'} {self.state_topic}{why}")
            age = now - state.received
            if age > max_age_s or age < 0:
                raise StaleObservationError(
                    f"latest joint state on {self.state_topic} is {age:.2f} s old "
                    f"(max_observation_age_s={max_age_s:g})"
                )
            check_state(state, self.state_topic)
        oldest = min(frames, key=lambda f: f.received)  # type: ignore[union-attr]
        image = tile_views([f.image for f in frames])  # type: ignore[union-attr]
        return Observation(
            image, oldest.stamp, oldest.frame_id, now - oldest.received, state if require_state else None
        )

    @staticmethod
    def _check_not_future(topic: str, frame: Frame, age: float, stamp_now: float | None) -> None:
        # A frame "from the future" comes from before a clock reset (or a camera clock ahead of this host's): its age
        # would read negative and pass the staleness check forever.
        if age < 0:
            raise StaleObservationError(
                f"latest image on {topic} arrived {-age:.3f} s after now on the node's clock: the clock went back "
                "since; waiting for a new frame")
        if stamp_now is None:
            return
        ahead = stamp_ns(frame.stamp) * 1e-9 - stamp_now
        if ahead > FUTURE_STAMP_TOLERANCE_S:
            raise StaleObservationError(
                f"latest image on {topic} is stamped {_stamp_text(stamp_ns(frame.stamp))}, {ahead:.3f} s after now "
                f"on the node's clock ({stamp_now:.3f} s): a frame from before a clock reset, or a camera clock "
                f"ahead of this host's (tolerance {FUTURE_STAMP_TOLERANCE_S:g} s)")

    def has_stamp(self, min_stamp_ns: int) -> bool:
        """Whether every image topic's latest good frame is stamped at or after ``min_stamp_ns``."""
        with self._lock:
            return not self._behind_locked(min_stamp_ns)

    def wait_for_stamp(self, min_stamp_ns: int, timeout_s: float,
                       stopped: Callable[[], BaseException | None] = lambda: None) -> None:
        """Wait until every image topic's latest good frame is stamped at or after ``min_stamp_ns``.

        For a goal that names the frame it is for (``min_observation_stamp``): its client published that frame just
        before the goal, and the two travel on separate DDS readers, so the goal may come first.

        Args:
            min_stamp_ns (`int`): Header stamp, nanoseconds.
            timeout_s (`float`): Seconds to wait on the host's monotonic clock (``observation_wait_s``).
            stopped (`Callable`): Checked whenever the buffer is woken (a frame arrived, or :meth:`wake_waiters`);
                an exception it returns is raised (a cancel, a shutdown).

        Raises:
            ObservationNotReceivedError: no such frame on some topic within ``timeout_s`` (the latest stamp is
                quoted).
        """
        if self.wait_until(lambda: not self._behind_locked(min_stamp_ns), timeout_s, stopped):
            return
        with self._lock:
            topic, latest = self._behind_locked(min_stamp_ns)[0]
        raise ObservationNotReceivedError(
            f"no frame on {topic} stamped at or after {_stamp_text(min_stamp_ns)} within "
            f"observation_wait_s={timeout_s:g} s (latest: {'none' if latest is None else _stamp_text(latest)})"
        )

    def wait_until(self, ready: Callable[[], bool], timeout_s: float,
                   stopped: Callable[[], BaseException | None] = lambda: None) -> bool:
        """Wait until ``ready()`` (called with the buffer's lock held) holds, woken by every arrival.

        Args:
            ready (`Callable[[], bool]`): The condition, on the buffer's state.
            timeout_s (`float`): Seconds to wait on the host's monotonic clock.
            stopped (`Callable`): Checked whenever the buffer is woken (a message arrived, or :meth:`wake_waiters`);
                an exception it returns is raised (a cancel, a shutdown).

        Returns:
            `bool`: whether ``ready()`` held before ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                done = ready()
                left = deadline - time.monotonic()
                # stopped() is read under the lock wake_waiters() takes, so a stop is seen here or wakes the wait.
                if not done and left > 0 and stopped() is None:
                    self._arrived.wait(left)
                    done = ready()
            if done:
                return True
            stop = stopped()
            if stop is not None:
                raise stop
            if time.monotonic() >= deadline:
                return False

    def wake_waiters(self) -> None:
        """Wake every :meth:`wait_for_stamp` now, so a goal stopped while it waits for its frame ends at once."""
        with self._lock:
            self._arrived.notify_all()

    def _behind_locked(self, min_stamp_ns: int) -> list[tuple[str, int | None]]:
        """``(topic, latest stamp in ns or None)`` for every image topic whose latest frame is older."""
        behind = []
        for topic in self.image_topics:
            frame = self._frames.get(topic)
            stamp = None if frame is None else stamp_ns(frame.stamp)
            if stamp is None or stamp < min_stamp_ns:
                behind.append((topic, stamp))
        return behind

    def ages(self) -> dict[str, float | None]:
        """Seconds since the last good frame per image topic (and the state topic); ``None`` = never received."""
        now = self._clock()
        with self._lock:
            ages: dict[str, float | None] = {
                topic: (now - self._frames[topic].received) if topic in self._frames else None
                for topic in self.image_topics
            }
            if self.state_topic:
                ages[self.state_topic] = (now - self._state.received) if self._state is not None else None
        return ages

    def rejected_counts(self) -> dict[str, int]:
        """Frames rejected per cause, summed over image topics (every cause present, zeros included)."""
        with self._lock:
            totals = dict.fromkeys(FRAME_REJECT_CAUSES, 0)
            for counters in self._counters.values():
                for cause, count in counters.rejected.items():
                    totals[cause] += count
        return totals

    def received_count(self) -> int:
        """Good frames accepted, summed over image topics."""
        with self._lock:
            return sum(c.received for c in self._counters.values())

    def states_rejected(self) -> int:
        """Joint states refused on arrival (ragged)."""
        with self._lock:
            return self._state_counters.rejected["shape"]

    def silent(self) -> list[str]:
        """Image topics that have delivered nothing yet: no frame, good or refused, and no clock reset since.

        A goal may wait for their first frame (``startup_goal_wait_s``); none is returned while a goal has a reason to
        be refused at once instead: a clock reset, or an image topic whose frames were all refused.
        """
        with self._lock:
            return self._silent_locked()

    def wait_for_first(self, timeout_s: float, stopped: Callable[[], BaseException | None] = lambda: None
                       ) -> list[str]:
        """Wait up to ``timeout_s`` until no image topic is :meth:`silent` (a node just activated, a camera starting).

        Returns:
            `list[str]`: the topics still silent (empty once each has delivered a frame).

        Raises:
            BaseException: what ``stopped`` returns (a cancel, a shutdown), as :meth:`wait_until`.
        """
        self.wait_until(lambda: not self._silent_locked(), timeout_s, stopped)
        return self.silent()

    def _silent_locked(self) -> list[str]:
        # A clock reset, or a topic whose every frame was refused, is a reason a goal gives at once: no waiting.
        refused = any(c.refused_since_good for topic, c in self._counters.items() if topic not in self._frames)
        if self._cleared_because or refused:
            return []
        return [topic for topic in self.image_topics
                if topic not in self._frames and not self._counters[topic].received]


def stamp_ns(stamp: Any) -> int:
    """A ``builtin_interfaces/Time`` (duck-typed) in nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def _stamp_text(ns: int) -> str:
    return f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"
