"""Waiting on the observation buffer: for a frame stamped late enough, for each image topic's first frame, or for any
condition on the buffer's state, woken by every arrival and by a stop.

:class:`ObservationWaits` is the waiting half of :class:`~.observation_buffer.ObservationBuffer` (its base): the
buffer owns the lock, the condition every arrival notifies, the frames and the per-topic counters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ObservationNotReceivedError
from .observations import Frame, stamp_ns, stamp_text


class ObservationWaits:
    """The waits of :class:`~.observation_buffer.ObservationBuffer`, on the state it keeps under its lock."""

    image_topics: tuple[str, ...]
    _lock: threading.Lock
    _arrived: threading.Condition
    _frames: dict[str, Frame]
    _counters: Mapping[str, Any]
    """Per image topic, its ``_TopicCounters`` (``received``, ``refused_since_good``)."""
    _cleared_because: str

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
            f"no frame on {topic} stamped at or after {stamp_text(min_stamp_ns)} within "
            f"observation_wait_s={timeout_s:g} s (latest: {'none' if latest is None else stamp_text(latest)})"
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
