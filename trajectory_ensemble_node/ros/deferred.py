"""Work that must not delay a goal's result: run on one background thread, shortly after it was asked for.

rclpy sends a goal's result only after the execute callback returns, one executor spin later. Anything that thread
does before returning sits in front of the result: a log line costs about a millisecond on a small CPU (rcutils
console output plus a ``/rosout`` message), a ``/diagnostics`` array more. So the node hands those to a
:class:`Deferred` worker, which runs them ``delay_s`` later, once the result is on its way.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any


class Deferred:
    """Runs callables on one thread, each ``delay_s`` after :meth:`call`, in order.

    Args:
        delay_s (`float`): How long after the request a call runs.
        name (`str`): The worker thread's name.
    """

    def __init__(self, delay_s: float, name: str = "deferred") -> None:
        self.delay_s = delay_s
        self._queue: queue.Queue[tuple[float, Callable[..., Any], tuple[Any, ...], Hashable | None] | None] = (
            queue.Queue()
        )
        self._pending: set[Hashable] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any, key: Hashable | None = None) -> None:
        """Run ``fn(*args)`` about ``delay_s`` from now.

        Args:
            fn (`Callable`): Exceptions it raises are swallowed (this is for best-effort side work).
            key (`Hashable`, *optional*): Coalesce: while a call with this key is pending, more are dropped.
        """
        if self._stopped.is_set():
            return
        if key is not None:
            with self._lock:
                if key in self._pending:
                    return
                self._pending.add(key)
        self._queue.put((time.monotonic() + self.delay_s, fn, args, key))

    def stop(self, timeout_s: float = 1.0) -> None:
        """Run what is already queued (without waiting out its delay), then end the thread."""
        self._stopped.set()
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            due, fn, args, key = item
            self._stopped.wait(max(0.0, due - time.monotonic()))
            if key is not None:
                with self._lock:
                    self._pending.discard(key)
            try:
                fn(*args)
            except Exception:  # noqa: BLE001 - side work; the next request tries again
                pass
