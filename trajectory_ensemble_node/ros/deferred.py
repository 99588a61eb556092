"""Work that must not delay a goal's result: run on one background thread, shortly after it was asked for.

rclpy sends a goal's result only after the execute callback returns, one executor spin later. Anything that thread
does before returning sits in front of the result: a log line costs about a millisecond on a small CPU (rcutils
console output plus a ``/rosout`` message), a ``/diagnostics`` array more. So the node hands those to a
:class:`Deferred` worker, which runs them ``delay_s`` later, once the result is on its way.

Log lines go through :meth:`Deferred.log`, never through :meth:`Deferred.call` with a bound logger method. rclpy's
``RcutilsLogger`` remembers the severity of each *call site* (file, line, bytecode offset) and raises
``ValueError: Logger severity cannot be changed between calls`` when one site logs at two severities. With every
severity funnelled through the worker's single ``fn(*args)`` line, the first goal-end line fixed that site's severity
and every later line at another severity was lost. :func:`_emit` gives each severity its own call site.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from typing import Any

from ..quoting import bound_text

LOG_SEVERITIES = ("debug", "info", "warning", "error", "fatal")
"""Severities :meth:`Deferred.log` accepts (the names of rclpy's logger methods)."""


def _emit(logger: Any, severity: str, message: str) -> None:
    # One line per severity on purpose: rclpy keys a call site's severity by (file, line, offset), so two
    # severities from one line raise ValueError instead of logging.
    if severity == "debug":
        logger.debug(message)
    elif severity == "info":
        logger.info(message)
    elif severity == "warning":
        logger.warning(message)
    elif severity == "error":
        logger.error(message)
    else:
        logger.fatal(message)


def _is_logger_method(fn: Callable[..., Any]) -> bool:
    owner = getattr(fn, "__self__", None)
    return type(owner).__name__ == "RcutilsLogger" and getattr(fn, "__name__", "") in (*LOG_SEVERITIES, "warn", "log")


class Deferred:
    """Runs callables on one thread, each ``delay_s`` after :meth:`call`, in order.

    Args:
        delay_s (`float`): How long after the request a call runs.
        name (`str`): The worker thread's name.
        on_error (`Callable[[str], None]`, *optional*): Told about a call that raised (default: one line plus the
            traceback on stderr, which needs no ROS context, so it works while the node shuts down).
    """

    def __init__(self, delay_s: float, name: str = "deferred",
                 on_error: Callable[[str], None] | None = None) -> None:
        self.delay_s = delay_s
        self.name = name
        self._on_error = on_error or _print_error
        self._queue: queue.Queue[tuple[float, Callable[..., Any], tuple[Any, ...], Hashable | None] | None] = (
            queue.Queue()
        )
        self._pending: set[Hashable] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.failures = 0
        """Calls that raised (each reported through ``on_error``)."""
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any, key: Hashable | None = None) -> None:
        """Run ``fn(*args)`` about ``delay_s`` from now.

        Args:
            fn (`Callable`): What to run; if it raises, the error is reported through ``on_error`` and the worker
                goes on with the next call.
            key (`Hashable`, *optional*): Coalesce: while a call with this key is pending, more are dropped.

        Raises:
            TypeError: ``fn`` is a method of an rclpy logger (use :meth:`log`; see the module docstring).
        """
        if _is_logger_method(fn):
            raise TypeError(f"Deferred.call({fn.__name__}) would log every severity from one call site, which "
                            "rclpy refuses; use Deferred.log(logger, severity, message)")
        if self._stopped.is_set():
            return
        if key is not None:
            with self._lock:
                if key in self._pending:
                    return
                self._pending.add(key)
        self._queue.put((time.monotonic() + self.delay_s, fn, args, key))

    def log(self, logger: Any, severity: str, message: str) -> None:
        """Log ``message`` at ``severity`` on ``logger`` about ``delay_s`` from now.

        Args:
            logger (`RcutilsLogger`): The node's logger.
            severity (`str`): One of :data:`LOG_SEVERITIES`.
            message (`str`): The line.

        Raises:
            ValueError: ``severity`` is not one of :data:`LOG_SEVERITIES`.
        """
        if severity not in LOG_SEVERITIES:
            raise ValueError(f"severity {severity!r} is not one of {list(LOG_SEVERITIES)}")
        if self._stopped.is_set():
            return
        self._queue.put((time.monotonic() + self.delay_s, _emit, (logger, severity, bound_text(message)), None))

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
            except Exception as error:  # noqa: BLE001 - side work must not end the worker; it is reported, not hidden
                self.failures += 1
                self._on_error(f"{self.name}: {getattr(fn, '__name__', fn)!s} raised {type(error).__name__}: "
                               f"{error}\n{traceback.format_exc()}")


def _print_error(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
