"""The observation buffer: the latest good frame per image topic, recent joint states, stamps and staleness.

A malformed frame is refused with a named :class:`FrameError`, counted and logged once per cause, and the last good
frame stays. Staleness is measured from arrival on the host's monotonic clock; the stamp rules, state pairing
(:data:`STATE_HISTORY`, ``max_state_skew_s``) and :meth:`clear` on a backward jump: docs/node.md, "Observations". Reads
message fields only (no rclpy); waiting for a frame is :mod:`.observation_wait`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    FrameError,
    NoObservationError,
    ObservationArrayError,
    ObservationSchemaError,
    StaleObservationError,
    StateSkewError,
)
from ..models.cosmos3 import pick_named
from .frames import tile_views
from .input_limits import check_state
from .observation_wait import ObservationWaits
from .observations import (
    FRAME_REJECT_CAUSES,
    FUTURE_STAMP_TOLERANCE_S,
    Frame,
    JointStateSample,
    Observation,
    decode_image,
    decode_state,
    stamp_ns,
    stamp_text,
)

STATE_HISTORY = 256
"""Joint states kept to pair an image with (the one bound on that history): a quarter second of a 1 kHz arm driver,
longer than a camera's latency, so the state of the image's moment is still there when the image arrives."""


@dataclass
class _TopicCounters:
    received: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FRAME_REJECT_CAUSES, 0))
    refused_since_good: int = 0
    """Frames refused since the last good one (the root cause a goal error quotes)."""
    last_refusal: str = ""


def pick_state(state: JointStateSample, names: Sequence[str]) -> tuple[float, ...]:
    """The positions of ``names`` (a model's ``capabilities.state_names``) from a joint state, by joint name, in the
    model's order, by the one rule every face picks by (``models.cosmos3.pick_named``). Non-finite values are the
    caller's to refuse (``check_state``).

    Args:
        state (`JointStateSample`): The joint state paired with the image.
        names (`Sequence[str]`): The joints the model reads, in its order.

    Raises:
        MissingObservationKeyError: the message lacks a joint the model reads (the topic and the joint are named).
        ObservationArrayError: the message names such a joint twice.
    """
    try:
        values = pick_named(names, state.names, state.positions.tolist())
    except ObservationSchemaError as error:
        raise type(error)(f"joint state on {state.topic}: {error}") from None
    return tuple(float(v) for v in values)


class ObservationBuffer(ObservationWaits):
    """Latest good frame per image topic plus the last :data:`STATE_HISTORY` joint states. Thread-safe.

    Args:
        image_topics (`Sequence[str]`): Resolved image topic names, in tiling order.
        state_topic (`str`): Resolved joint state topic name (used in messages).
        clock (`Callable[[], float]`): Seconds frames arrive and age on: the host's monotonic clock, or the node's ROS
            clock under ``use_sim_time``; injectable for tests.
        stamp_clock (`Callable[[], float]`, *optional*): Seconds of the clock header stamps are on (the node's ROS
            clock), for the future-stamp rule; ``None`` skips it.
        min_image_side (`int`): Frames with a side under this are refused (cause ``dimensions``): the model's bound
            (``InputLimits.min_image_side``); 1 takes every frame that decodes.
        state_names (`Sequence[str]`): The joints a model that takes state reads, in its order
            (``capabilities.state_names``); empty for a model without state. With names, every observation pairs the
            image with the joint state stamped nearest it and carries the picked values (``state_values``).
        max_state_skew_s (`float`): With ``state_names``: the most the paired stamps may differ, in seconds.
    """

    def __init__(
        self, image_topics: Sequence[str], state_topic: str = "", clock: Callable[[], float] = time.monotonic,
        stamp_clock: Callable[[], float] | None = None, min_image_side: int = 1, state_names: Sequence[str] = (),
        max_state_skew_s: float = 0.05,
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
        self._states: deque[JointStateSample] = deque(maxlen=STATE_HISTORY)
        self.state_names = tuple(state_names)
        if self.state_names and not max_state_skew_s > 0:
            raise ValueError(f"max_state_skew_s must be > 0, got {max_state_skew_s!r}")
        self.max_state_skew_s = max_state_skew_s
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
            frame = decode_image(topic, msg, received, self._min_image_side)
        except FrameError as error:
            self.count_rejection(topic, error.cause, str(error))
            return error
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
            sample = decode_state(self.state_topic, msg, self._clock)
        except ObservationArrayError as error:
            with self._lock:
                counters = self._state_counters
                counters.rejected["shape"] += 1
                counters.refused_since_good += 1
                counters.last_refusal = str(error)
            return error
        with self._lock:
            self._states.append(sample)
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
            had = bool(self._frames) or bool(self._states)
            self._frames.clear()
            self._states.clear()
            self._cleared_because = reason
        return had

    # --- readers (goals, diagnostics) ----------------------------------------------------------------------------

    def latest(self, max_age_s: float, *, require_state: bool = False) -> Observation:
        """The observation a goal is served from.

        Args:
            max_age_s (`float`): Refuse frames (and the state, when required) that arrived longer ago than this.
            require_state (`bool`): Also require a recent, finite joint state (always, with ``state_names``).

        Raises:
            NoObservationError: a topic has delivered no good frame yet (or no state, when required).
            StaleObservationError: the newest good frame on a topic is older than ``max_age_s``.
            NonFiniteStateError: the required joint state holds NaN or Inf.
            StateSkewError: with ``state_names``, no joint state is stamped within ``max_state_skew_s`` of the image.
            MissingObservationKeyError: with ``state_names``, the paired joint state lacks one of them.
        """
        now = self._clock()
        stamp_now = self._stamp_clock() if self._stamp_clock is not None else None
        with self._lock:
            frames = [self._frames.get(topic) for topic in self.image_topics]
            # Pairing scans the whole history; other models read the newest state only.
            states = tuple(self._states) if self.state_names else (self._states[-1],) if self._states else ()
            state = states[-1] if states else None
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
        oldest = min(frames, key=lambda f: f.received)  # type: ignore[union-attr]
        image = tile_views([f.image for f in frames])  # type: ignore[union-attr]
        if not (require_state or self.state_names):
            return Observation(image, oldest.stamp, oldest.frame_id, now - oldest.received)
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
        # The driver reports a broken joint now: no goal is served, not even from an earlier, finite state.
        check_state(state, self.state_topic)
        if not self.state_names:
            return Observation(image, oldest.stamp, oldest.frame_id, now - oldest.received, state)
        paired, skew_s = self._pair(states, oldest)
        check_state(paired, self.state_topic)
        return Observation(image, oldest.stamp, oldest.frame_id, now - oldest.received, paired,
                           pick_state(paired, self.state_names), skew_s)

    def _pair(self, states: Sequence[JointStateSample], frame: Frame) -> tuple[JointStateSample, float]:
        """The joint state stamped nearest ``frame`` (the later one on a tie) and its stamp minus the frame's, in s.

        Raises:
            StateSkewError: even the nearest is further than ``max_state_skew_s`` from the frame.
        """
        image_ns = stamp_ns(frame.stamp)
        index = min(range(len(states)), key=lambda i: (abs(stamp_ns(states[i].stamp) - image_ns), -i))
        paired = states[index]
        skew_s = (stamp_ns(paired.stamp) - image_ns) * 1e-9
        if abs(skew_s) > self.max_state_skew_s:
            held = sorted(stamp_ns(s.stamp) for s in states)
            unstamped = (" (it is stamped 0: does its publisher stamp its messages?)"
                         if not stamp_ns(paired.stamp) else "")
            raise StateSkewError(
                f"the joint state on {self.state_topic} nearest the image on {frame.topic} (stamped "
                f"{stamp_text(image_ns)}) is stamped {stamp_text(stamp_ns(paired.stamp))}, {abs(skew_s):.3f} s "
                f"{'after' if skew_s > 0 else 'before'} it (max_state_skew_s={self.max_state_skew_s:g}){unstamped}; "
                f"{len(states)} joint state(s) kept, stamped {stamp_text(held[0])} .. {stamp_text(held[-1])}")
        return paired, skew_s

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
                f"latest image on {topic} is stamped {stamp_text(stamp_ns(frame.stamp))}, {ahead:.3f} s after now "
                f"on the node's clock ({stamp_now:.3f} s): a frame from before a clock reset, or a camera clock "
                f"ahead of this host's (tolerance {FUTURE_STAMP_TOLERANCE_S:g} s)")

    def ages(self) -> dict[str, float | None]:
        """Seconds since the last good frame per image topic (and the state topic); ``None`` = never received."""
        now = self._clock()
        with self._lock:
            ages: dict[str, float | None] = {
                topic: (now - self._frames[topic].received) if topic in self._frames else None
                for topic in self.image_topics
            }
            if self.state_topic:
                ages[self.state_topic] = (now - self._states[-1].received) if self._states else None
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
