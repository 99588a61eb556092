"""One OpenPI request, from its frame to its reply frame, for every connection of one server on one engine.

:class:`RequestDispatcher` owns what requests share across connections: the admission gate, the decode pool (bounded
decoding off the event loop), the build thread. Co-batching, the queue, disconnects and shutdown: docs/openpi.md,
"Co-batching, queue, order, disconnects". Errors are text frames; no traceback is ever sent.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Callable
from typing import Any

from websockets.asyncio.server import ServerConnection

from ..engine import GroupHandle
from ..errors import AbortReason, EngineShutdownError, TrajectoryEnsembleError
from ..quoting import bound_text
from ..wire import codec
from .extras import EXTRA_KEYS
from .gate import AdmissionGate
from .policy import OpenPIPolicy
from .sessions import Caller

logger = logging.getLogger("trajectory_ensemble.openpi")

DECODE_THREADS = 2
"""Threads decoding frames: a frame never waits for the event loop or the build thread, nor they for it."""


class RequestDispatcher:
    """Serve request frames of any connection on one policy: decode, a slot, build, submit, the wait, the reply.

    Args:
        policy (`OpenPIPolicy`): The service face; its engine must be running.
        max_message_bytes (`int`): Largest incoming message (bounds the decode).
        max_concurrent (`int`): Requests holding a slot (being built or in the engine) at once.
        max_queued (`int`): Requests waiting for a slot beyond ``max_concurrent``.
        counts (`collections.Counter[str]`): The server's counters; requests, replies, error frames and the requests
            a disconnect dropped or canceled are counted here.
    """

    def __init__(self, policy: OpenPIPolicy, *, max_message_bytes: int, max_concurrent: int, max_queued: int,
                 counts: collections.Counter[str]) -> None:
        self.policy, self.counts = policy, counts
        self.decode_limits = codec.DecodeLimits.for_request(
            keys=len(policy.schema.keys()) + len(EXTRA_KEYS), max_message_bytes=max_message_bytes,
            max_image_bytes=policy.params.max_image_bytes)
        self.gate = AdmissionGate(max_concurrent, max_queued)
        self.inflight = 0  # requests between their frame and their reply
        self.in_engine = 0  # groups submitted whose handle has not ended yet
        self.stopping = False
        self.shutting_down: asyncio.Future | None = None  # resolved by stop(); created on the server's loop
        # One thread: the tokenizer and the VAE are used by one thread at a time, in arrival order.
        self._builder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="openpi-build")
        self._decoder = concurrent.futures.ThreadPoolExecutor(max_workers=DECODE_THREADS,
                                                              thread_name_prefix="openpi-decode")

    def start(self) -> None:
        """Bind to the running event loop (the server's, before it accepts a connection)."""
        self.shutting_down = asyncio.get_running_loop().create_future()

    def stop(self) -> None:
        """Refuse what comes next and end what is queued or running with ``SHUTDOWN`` (their frames still go out)."""
        self.stopping = True
        self.gate.close(EngineShutdownError("", "the server is shutting down; nothing was served"))
        assert self.shutting_down is not None
        if not self.shutting_down.done():
            self.shutting_down.set_result(None)

    def close(self) -> None:
        """Drop the decode and build threads' pending work (the loop is ending)."""
        self._builder.shutdown(wait=False, cancel_futures=True)
        self._decoder.shutdown(wait=False, cancel_futures=True)

    async def serve(self, ws: ServerConnection, raw: str | bytes, request_id: str, caller: Caller, started: float,
                    previous_total_ms: float | None) -> str | bytes | None:
        """One request: its reply frame, an error frame, or ``None`` when the client left before the reply.

        Args:
            ws (`ServerConnection`): The connection the frame came on; its closing cancels the request.
            raw (`str` or `bytes`): The request frame, dropped once decoded.
            request_id (`str`): The request's id in logs and in its group.
            caller (`Caller`): Whose sessions the request may continue.
            started (`float`): ``time.monotonic()`` when the frame was read.
            previous_total_ms (`float`, *optional*): The connection's previous request, frame to reply (for
                ``server_timing``).
        """
        self.counts["requests"] += 1
        self.inflight += 1
        closed = asyncio.ensure_future(ws.wait_closed())
        try:
            # Off the loop: even a bounded decode of a large frame must not delay health checks or other clients.
            obs = await asyncio.get_running_loop().run_in_executor(self._decoder, codec.unpack, raw,
                                                                    self.decode_limits)
            del raw  # the frame's bytes go now; the inbound budget counts them until the request is answered
            if obs.get("endpoint") == "reset":
                return codec.pack(self.policy.reset(obs, caller=caller))
            job = self.policy.prepare(obs, request_id=request_id, caller=caller, arrival=started)
            if self.stopping:
                raise EngineShutdownError(request_id, "the server is shutting down; nothing was served")
            if not await until_closed(self.gate.acquire(), closed, release=self.gate.release):
                return None
            assert self.shutting_down is not None
            slot_held = True  # until the group's handle holds it (released when the group ends)
            try:
                build = asyncio.get_running_loop().run_in_executor(self._builder, self.policy.build, job)
                if not await until_closed(build, closed, self.shutting_down):
                    if self.stopping:
                        raise EngineShutdownError(request_id, "the server is shutting down; nothing was served")
                    self.counts["dropped_on_disconnect"] += 1
                    return None
                handle = self.policy.submit(job)
                finished = self._finished(handle)
                slot_held = False
            finally:
                if slot_held:
                    self.gate.release()
            if not await until_closed(finished, closed, self.shutting_down):
                if self.stopping:
                    handle.cancel(AbortReason.CANCELED, f"server shut down during request {request_id}")
                    raise EngineShutdownError(request_id, "the server shut down before the request finished; "
                                                          "its group was canceled")
                handle.cancel(AbortReason.CANCELED, f"client disconnected during request {request_id}")
                self.counts["canceled_on_disconnect"] += 1
                return None
            reply = self.policy.reply(job, handle.result(timeout=0))
            timing = {"infer_ms": (time.monotonic() - started) * 1000.0}
            if previous_total_ms is not None:
                timing["prev_total_ms"] = previous_total_ms
            reply["server_timing"] = timing
            self.counts["replies"] += 1
            return codec.pack(reply)
        except TrajectoryEnsembleError as error:
            self.counts["error_frames"] += 1
            logger.info("openpi: %s refused: %s: %s", request_id, type(error).__name__, bound_text(str(error)))
            return codec.error_frame(error)
        except Exception as error:
            self.counts["error_frames"] += 1
            logger.exception("openpi: %s failed unexpectedly", request_id)
            return codec.error_frame(error)
        finally:
            closed.cancel()
            self.inflight -= 1

    def _finished(self, handle: GroupHandle) -> asyncio.Future:
        # The handle ends on the engine thread; its slot is released and the future resolved on the loop.
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        self.in_engine += 1

        def on_loop() -> None:
            self.in_engine -= 1
            self.gate.release()
            if not future.done():
                future.set_result(None)

        def on_engine(_: GroupHandle) -> None:
            try:
                loop.call_soon_threadsafe(on_loop)
            except RuntimeError:
                pass  # the loop is gone: the process is exiting

        handle.add_done_callback(on_engine)
        return future


async def until_closed(awaitable: Any, *stoppers: asyncio.Future, release: Callable[[], None] | None = None) -> bool:
    """Await ``awaitable`` unless a stopper (the connection closing, the server shutting down) ends first.

    Returns:
        `bool`: True when ``awaitable`` finished (its error is raised), False when a stopper won.

    Args:
        release (`Callable[[], None]`, *optional*): Undo a successful ``awaitable`` that lost the race.
    """
    task = asyncio.ensure_future(awaitable)
    done, _ = await asyncio.wait({task, *stoppers}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
        return True
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, TrajectoryEnsembleError):
        return False
    if release is not None:
        release()  # it completed while being canceled
    return False
