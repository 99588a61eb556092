"""The recorded actions of a bag (``replay --reference-topic``): one time series per channel, read with ``rosbags``.

:class:`ReferenceSeries` holds samples at absolute times (ns), interpolated linearly between them and unknown outside.
Which message types are read and when each sample stands: docs/replay-tests.md, "What is compared with what". Plain
numpy and ``rosbags``; no rclpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import bags

JOINT_STATE_TYPE = bags.STATE_TYPE
JOINT_TRAJECTORY_TYPE = "trajectory_msgs/msg/JointTrajectory"
FLOAT32_ARRAY_TYPE = "std_msgs/msg/Float32MultiArray"
FLOAT64_ARRAY_TYPE = "std_msgs/msg/Float64MultiArray"
REFERENCE_TYPES = (JOINT_STATE_TYPE, JOINT_TRAJECTORY_TYPE, FLOAT32_ARRAY_TYPE, FLOAT64_ARRAY_TYPE,
                   bags.TRAJECTORY_TYPE)
"""Message types a reference topic may carry."""


class ReferenceError(bags.BagError):
    """The reference topic is missing, of a type replay cannot compare with, empty or inconsistent, or it does not
    match the served chunks (width, channel names, time); the message names what and where."""


@dataclass(frozen=True)
class ChannelSeries:
    """The samples of one recorded channel.

    Args:
        times_ns (`np.ndarray` of shape `[T]`, int64): Strictly increasing sample times.
        values (`np.ndarray` of shape `[T]`, float64): The recorded values.
    """

    times_ns: np.ndarray
    values: np.ndarray

    @property
    def first_ns(self) -> int:
        return int(self.times_ns[0])

    @property
    def last_ns(self) -> int:
        return int(self.times_ns[-1])


@dataclass(frozen=True)
class ReferenceSeries:
    """One reference topic as a time series per channel.

    Args:
        topic (`str`), msgtype (`str`): Where it came from.
        names (`tuple[str, ...]`, *optional*): Channel names (joint names); ``None`` for unnamed channels.
        channels (`tuple[ChannelSeries, ...]`): One per channel, in the order of ``names`` (or of the array).
        messages (`int`): Messages read.
    """

    topic: str
    msgtype: str
    names: tuple[str, ...] | None
    channels: tuple[ChannelSeries, ...]
    messages: int

    @property
    def width(self) -> int:
        return len(self.channels)

    def span_ns(self, channels: Sequence[int]) -> tuple[int, int]:
        """``(first, last)`` time at which every one of ``channels`` is recorded (first > last: never together)."""
        return (max(self.channels[c].first_ns for c in channels), min(self.channels[c].last_ns for c in channels))

    def sample(self, channels: Sequence[int], times_ns: np.ndarray) -> np.ndarray:
        """The recording of ``channels`` at ``times_ns``, interpolated linearly: ``[len(times_ns), len(channels)]``.

        Times outside a channel's recording give NaN there; callers leave those rows out (see :meth:`span_ns`).
        """
        times_ns = np.asarray(times_ns, dtype=np.int64)
        out = np.full((len(times_ns), len(channels)), np.nan)
        for j, c in enumerate(channels):
            series = self.channels[c]
            # Relative to the first sample: absolute ns (~1.8e18) lose sub-microsecond precision as float64.
            t = (times_ns - series.first_ns).astype(np.float64)
            known = (times_ns >= series.first_ns) & (times_ns <= series.last_ns)
            out[known, j] = np.interp(t[known], (series.times_ns - series.first_ns).astype(np.float64),
                                      series.values)
        return out

    def describe(self) -> str:
        """``/topic (type, N messages, names or width)`` for messages."""
        what = f"joints {list(self.names)}" if self.names is not None else f"{self.width} unnamed channels"
        return f"{self.topic} ({self.msgtype}, {self.messages} messages, {what})"


def _time_ns(stamp: Any, log_ns: int) -> int:
    ns = int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)
    return ns if ns != 0 else log_ns


def _duration_ns(duration: Any) -> int:
    return int(duration.sec) * 1_000_000_000 + int(duration.nanosec)


class _Collector:
    """Samples per channel as they are read; later splices replace earlier samples from their start on."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.order: list[str] = []
        self.samples: dict[str, list[tuple[int, float]]] = {}

    def add(self, name: str, t_ns: int, value: float) -> None:
        if name not in self.samples:
            self.order.append(name)
            self.samples[name] = []
        self.samples[name].append((int(t_ns), float(value)))

    def splice(self, names: Sequence[str], from_ns: int) -> None:
        """Drop the samples of ``names`` at or after ``from_ns`` (a new trajectory takes over there)."""
        for name in names:
            if name in self.samples:
                self.samples[name] = [(t, v) for t, v in self.samples[name] if t < from_ns]

    def series(self, named: bool) -> tuple[tuple[str, ...] | None, tuple[ChannelSeries, ...]]:
        channels = []
        for name in self.order:
            samples = sorted(self.samples[name], key=lambda s: s[0])  # stable: equal times keep arrival order
            times = np.array([t for t, _ in samples], dtype=np.int64)
            values = np.array([v for _, v in samples], dtype=np.float64)
            if len(times) == 0:
                raise ReferenceError(f"reference topic {self.topic}: channel {name!r} has no samples left after "
                                     "later trajectories replaced its points")
            # At equal times the later sample wins (a re-sent command).
            keep = np.append(times[1:] != times[:-1], True)
            if not np.all(np.isfinite(values)):
                bad = int(np.argmax(~np.isfinite(values)))
                raise ReferenceError(f"reference topic {self.topic}: channel {name!r} has a non-finite value "
                                     f"{values[bad]!r} at {times[bad] / 1e9:.9f} s")
            channels.append(ChannelSeries(times[keep], values[keep]))
        return (tuple(self.order) if named else None), tuple(channels)


def _joint_state(collector: _Collector, log_ns: int, msg: Any, index: int) -> None:
    names, positions = list(msg.name), np.asarray(msg.position, dtype=np.float64)
    if len(names) != len(positions):
        raise ReferenceError(f"reference topic {collector.topic}: message {index} names {len(names)} joints but "
                             f"holds {len(positions)} positions")
    t_ns = _time_ns(msg.header.stamp, log_ns)
    for name, value in zip(names, positions):
        collector.add(str(name), t_ns, value)


def _joint_trajectory(collector: _Collector, log_ns: int, msg: Any, index: int) -> None:
    names = [str(n) for n in msg.joint_names]
    start = _time_ns(msg.header.stamp, log_ns)
    points = list(msg.points)
    if not points:
        return
    for j, point in enumerate(points):
        if len(point.positions) != len(names):
            raise ReferenceError(f"reference topic {collector.topic}: message {index} point {j} has "
                                 f"{len(point.positions)} positions for {len(names)} joint names {names}")
    collector.splice(names, start + _duration_ns(points[0].time_from_start))
    for point in points:
        t_ns = start + _duration_ns(point.time_from_start)
        for name, value in zip(names, np.asarray(point.positions, dtype=np.float64)):
            collector.add(name, t_ns, value)


def _array(collector: _Collector, log_ns: int, msg: Any, index: int) -> None:
    data = np.asarray(msg.data, dtype=np.float64).reshape(-1)
    if collector.order and len(data) != len(collector.order):
        raise ReferenceError(f"reference topic {collector.topic}: message {index} holds {len(data)} values, the "
                             f"first held {len(collector.order)}")
    for c, value in enumerate(data):
        collector.add(str(c), log_ns, value)


def _action_trajectory(collector: _Collector, log_ns: int, msg: Any, index: int) -> None:
    rows = bags.trajectory_array(msg).astype(np.float64)
    if collector.order and rows.shape[1] != len(collector.order):
        raise ReferenceError(f"reference topic {collector.topic}: message {index} has action_dim {rows.shape[1]}, "
                             f"the first had {len(collector.order)}")
    if len(rows) == 0:
        return
    start = _time_ns(msg.header.stamp, log_ns)
    # float32 dt as published, in ns per row; row k at stamp + (k + 1) dt, as the node's ~/joint_trajectory has it.
    times = start + np.rint((np.arange(len(rows)) + 1) * float(msg.dt) * 1e9).astype(np.int64)
    names = [str(c) for c in range(rows.shape[1])]
    collector.splice(names, int(times[0]))
    for k, t_ns in enumerate(times):
        for c, value in enumerate(rows[k]):
            collector.add(names[c], int(t_ns), value)


_READERS = {
    JOINT_STATE_TYPE: (_joint_state, True),
    JOINT_TRAJECTORY_TYPE: (_joint_trajectory, True),
    FLOAT32_ARRAY_TYPE: (_array, False),
    FLOAT64_ARRAY_TYPE: (_array, False),
    bags.TRAJECTORY_TYPE: (_action_trajectory, False),
}


def check_reference_topic(info: bags.BagInfo, topic: str) -> str:
    """The message type of ``topic`` in the bag ``info`` describes.

    Raises:
        ReferenceError: No such topic (the message lists the topics of accepted types), or a type that cannot be
            compared with action chunks.
    """
    found = {t.name: t.msgtype for t in info.topics}
    if topic not in found:
        usable = sorted(name for name, msgtype in found.items() if msgtype in REFERENCE_TYPES)
        raise ReferenceError(f"--reference-topic {topic!r}: no such topic in {info.path} (topics of accepted types: "
                             f"{usable or 'none'})")
    if found[topic] not in REFERENCE_TYPES:
        raise ReferenceError(f"--reference-topic {topic!r} carries {found[topic]}, which replay cannot compare with "
                             f"action chunks; accepted: {', '.join(REFERENCE_TYPES)}")
    return found[topic]


def read_reference(bag: str | Path, topic: str) -> ReferenceSeries:
    """Read ``topic`` of ``bag`` as a :class:`ReferenceSeries` (rules in docs/replay-tests.md).

    Raises:
        ReferenceError: See :func:`check_reference_topic`; also an empty topic, inconsistent widths, or a
            non-finite value (the message names the message or channel).
        BagError: The bag cannot be read.
    """
    info = bags.bag_info(bag)
    msgtype = check_reference_topic(info, topic)
    reader, named = _READERS[msgtype]
    collector = _Collector(topic)
    count = 0
    for index, (_, _, log_ns, data) in enumerate(bags.iter_raw(info.path, [topic])):
        reader(collector, log_ns, bags.deserialize(data, msgtype), index)
        count += 1
    if not collector.order:
        raise ReferenceError(f"--reference-topic {topic!r} in {info.path} holds no samples ({count} messages, "
                             "none with values)")
    names, channels = collector.series(named)
    return ReferenceSeries(topic, msgtype, names, channels, count)
