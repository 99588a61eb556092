"""When an active node is ready to serve: every image topic has delivered its first frame.

A goal that finds an image topic with no frame yet waits for it up to ``startup_goal_wait_s`` (docs/node.md, "When is
the node ready?"). Each waiting goal holds an executor thread, and the subscriptions that end the wait need one too,
so :class:`FirstObservationGate` lets at most ``max_waiting`` goals wait and ends the others at once. No rclpy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..errors import NoObservationError
from ..serving.observation_buffer import ObservationBuffer

READY = "ready"


def readiness_text(silent: list[str]) -> str:
    """``/diagnostics``' ``readiness`` of an active node: ``ready``, or ``waiting for first frame on <topics>``."""
    return f"waiting for first frame on {', '.join(silent)}" if silent else READY


class FirstObservationGate:
    """Makes goals wait for the first frame on image topics that have delivered nothing yet, a few at a time.

    Args:
        wait_s (`float`): ``startup_goal_wait_s``; 0 refuses at once.
        max_waiting (`int`): Goals that may wait at once (each holds an executor thread).
        log (`Callable[[str], None]`): Told when a goal starts waiting.
    """

    def __init__(self, wait_s: float, max_waiting: int, log: Callable[[str], None]) -> None:
        self.wait_s = wait_s
        self.max_waiting = max_waiting
        self._log = log
        self._lock = threading.Lock()
        self._waiting = 0

    def await_first(self, goal_id: str, observations: ObservationBuffer, *,
                    stopped: Callable[[], BaseException | None]) -> None:
        """Return once no image topic is silent; refuse after ``wait_s``.

        Args:
            goal_id (`str`): The goal (logged).
            observations (`ObservationBuffer`): The node's buffer; its :meth:`~ObservationBuffer.wake_waiters` ends
                the wait early when the goal is stopped.
            stopped (`Callable`): The goal's stop (a cancel, a deactivate, a shutdown), raised when it comes.

        Raises:
            NoObservationError: still nothing on a topic after ``wait_s``, or too many goals wait already.
            GroupAbortedError: the goal was stopped while it waited.
        """
        silent = observations.silent()
        if not silent or self.wait_s <= 0:
            return
        with self._lock:
            full = self._waiting >= self.max_waiting
            if not full:
                self._waiting += 1
        if full:
            raise NoObservationError(f"nothing received yet on {', '.join(silent)}, and {self.max_waiting} goal(s) "
                                     "already wait for it (startup_goal_wait_s)")
        try:
            self._log(f"goal {goal_id}: waiting up to {self.wait_s:g} s (startup_goal_wait_s) for the first frame "
                      f"on {', '.join(silent)}")
            silent = observations.wait_for_first(self.wait_s, stopped)
        finally:
            with self._lock:
                self._waiting -= 1
        if silent:
            raise NoObservationError(f"nothing received yet on {', '.join(silent)} within startup_goal_wait_s="
                                     f"{self.wait_s:g} s of the goal's arrival")
