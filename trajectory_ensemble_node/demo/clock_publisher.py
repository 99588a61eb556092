"""``/clock`` from a :class:`~.sim_model.SimClock`: what a simulator publishes, for the sim, the tests and the bench.

:class:`ClockPublisher` publishes the sim clock's time once (:meth:`~ClockPublisher.publish`, the bundled sim's
loop calls it), or on its own thread at a fixed wall rate (:meth:`~ClockPublisher.start`): Gazebo publishes
``/clock`` at 1 kHz by default, and a node under test must keep serving at that rate. The time model (rate,
pause, jumps) is the sim clock's; this module only puts it on the wire.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .sim_model import SimClock

GAZEBO_CLOCK_HZ = 1000.0
"""Gazebo's default ``/clock`` rate (one message per 1 ms physics step at real time)."""


class ClockPublisher:
    """Publishes ``/clock`` on ``node`` from ``clock``.

    Args:
        node (`rclpy.node.Node`): The publishing node (spun elsewhere; publishing needs no spin).
        clock (`SimClock`): The time to publish.
    """

    def __init__(self, node: Any, clock: SimClock) -> None:
        from rclpy.qos import QoSProfile
        from rosgraph_msgs.msg import Clock

        from ..ros.conversions import ns_to_time

        self.clock = clock
        self._msg_type, self._ns_to_time = Clock, ns_to_time
        self._pub = node.create_publisher(Clock, "/clock", QoSProfile(depth=10))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.published = 0
        """Messages published so far."""

    def publish(self, ns: int | None = None) -> int:
        """Publish one message: ``ns``, or the clock's time now. Returns the time published (ns)."""
        now = self.clock.now_ns() if ns is None else int(ns)
        msg = self._msg_type()
        msg.clock = self._ns_to_time(now)
        self._pub.publish(msg)
        self.published += 1
        return now

    def subscribers(self) -> int:
        """Readers matched on ``/clock`` (the node under test's, once discovery is done)."""
        return self._pub.get_subscription_count()

    def start(self, rate_hz: float = GAZEBO_CLOCK_HZ) -> ClockPublisher:
        """Publish at ``rate_hz`` messages per wall second on a daemon thread until :meth:`stop`.

        Ticks are scheduled on absolute times (no drift); a tick that falls behind is skipped, not bunched.
        """
        if not rate_hz > 0:
            raise ValueError(f"rate_hz must be > 0, got {rate_hz!r}")
        if self._thread is not None:
            raise RuntimeError("ClockPublisher already started")
        period = 1.0 / float(rate_hz)

        def run() -> None:
            due = time.monotonic()
            while not self._stop.is_set():
                self.publish()
                due += period
                late = time.monotonic() - due
                if late > period:
                    due += period * int(late // period)  # behind (a loaded CPU): skip ticks
                self._stop.wait(max(0.0, due - time.monotonic()))

        self._stop.clear()
        self._thread = threading.Thread(target=run, name="clock-publisher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the thread started by :meth:`start` (idempotent)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
