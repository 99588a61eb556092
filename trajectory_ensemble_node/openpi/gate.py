"""The request gates of the OpenPI server.

:class:`AdmissionGate`: at most ``openpi_max_concurrent`` requests hold a slot, ``openpi_max_queued`` more wait, the
rest get ``CAPACITY``. :class:`InboundBudget`: the bytes of frames read and not yet answered, held to
``openpi_max_inbound_bytes`` by not reading past it (why: docs/security.md, "Frames held: a budget").
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


class InboundBudget:
    """The bytes of request frames read and not yet answered, across every connection, held to ``limit``.

    A connection takes its next frame from websockets only once the total is under the limit (:meth:`wait_for_room`),
    in turn; until then its frames stay in the library's own queue, which holds one (``max_queue``), and then in the
    kernel: the client's writes block (TCP backpressure). A connection that was already waiting on its socket when
    the budget filled may still receive a frame: that one is answered ``CAPACITY`` at once (:meth:`refusal`) and
    dropped. So every frame read is answered, and the frames held pass the limit by one frame at most. Used from the
    event loop only.

    Args:
        limit (`int`): ``openpi_max_inbound_bytes`` (resolved: > 0).
    """

    def __init__(self, limit: int) -> None:
        self.limit = int(limit)
        self.held = 0
        self.peak = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    @property
    def waiting(self) -> int:
        """Connections not read from, for lack of room."""
        return sum(not w.done() for w in self._waiters)

    def refusal(self) -> CapacityError:
        """The error of a frame read while the budget was full (it waited on its socket, not for a turn)."""
        return CapacityError(f"the server holds {self.held} bytes of requests not yet answered "
                             f"(openpi_max_inbound_bytes={self.limit}); retry later")

    @property
    def full(self) -> bool:
        """Whether the frames held have reached the limit."""
        return self.held >= self.limit

    def has_room(self) -> bool:
        """Whether a connection may read now without waiting."""
        return self.held < self.limit and not self.waiting

    async def wait_for_room(self) -> None:
        """Return once the total is under the limit, in arrival order (a connection waiting is not read from)."""
        if self.has_room():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.pass_turn()  # woken just as it went away: the turn goes on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def take(self, size: int) -> None:
        """The connection whose turn it was read a frame of ``size`` bytes; the next one may read if room is left."""
        self.held += int(size)
        self.peak = max(self.peak, self.held)
        self.pass_turn()

    def give_back(self, size: int) -> None:
        """A frame of ``size`` bytes was answered (or its connection went away)."""
        self.held = max(0, self.held - int(size))
        self.pass_turn()

    def pass_turn(self) -> None:
        """Wake the next connection waiting, if there is room: one at a time, so that the frames read while the
        total was under the limit are at most one (a connection woken that had nothing to send passes it on too)."""
        while self._waiters and self.held < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
