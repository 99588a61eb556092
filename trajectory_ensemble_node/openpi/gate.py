"""The request gate of the OpenPI server: at most ``openpi_max_concurrent`` requests hold a slot (being built or in the
engine), up to ``openpi_max_queued`` more wait in arrival order, and past that a request is refused with ``CAPACITY``.
"""

from __future__ import annotations

import asyncio
import collections

from ..errors import CapacityError


class AdmissionGate:
    """At most ``max_active`` requests in the engine; ``max_queued`` more wait, first come first served.

    Used from the event loop only.

    Args:
        max_active (`int`): Requests admitted at once.
        max_queued (`int`): Requests that may wait for a slot.
    """

    def __init__(self, max_active: int, max_queued: int) -> None:
        self.max_active, self.max_queued = int(max_active), int(max_queued)
        self.active = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._closed: BaseException | None = None

    @property
    def waiting(self) -> int:
        return sum(not w.done() for w in self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting in line for one.

        Raises:
            CapacityError: ``max_queued`` requests already wait.
            EngineShutdownError: the server is shutting down.
        """
        if self._closed is not None:
            raise self._closed
        if self.active < self.max_active and not self.waiting:
            self.active += 1
            return
        if self.waiting >= self.max_queued:
            raise CapacityError(f"the server is at capacity: {self.active} requests running "
                                f"(openpi_max_concurrent={self.max_active}) and {self.waiting} waiting "
                                f"(openpi_max_queued={self.max_queued}); retry later")
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.release()  # the slot was handed over just as the waiter went away: pass it on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self) -> None:
        """Give a slot back: to the first waiter, or free."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot moves to it; ``active`` is unchanged
                return
        self.active = max(0, self.active - 1)

    def close(self, error: BaseException) -> None:
        """Refuse every waiting and future request with ``error``."""
        self._closed = error
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(error)
