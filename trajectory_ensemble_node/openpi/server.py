"""The OpenPI websocket server: handshake, auth, limits, co-batching across connections, bounded shutdown.

Built on ``websockets``' asyncio server, one event loop thread beside the engine's; each request frame goes to the
shared :class:`~.dispatch.RequestDispatcher`. Routes, auth, limits and the shutdown order: docs/openpi.md ("The wire",
"Limits and shutdown", "Security"). Errors are text frames; the connection stays open and no traceback is ever sent.
"""

from __future__ import annotations

import asyncio
import collections
import http
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.protocol import State

from ..errors import AuthenticationError, CapacityError, EngineShutdownError, TrajectoryEnsembleError, describe_error
from ..quoting import bound_text, quote_value
from ..serving.params import NodeParams
from ..wire import codec
from .connections import ConnectionTable, KeyRing
from .dispatch import RequestDispatcher, until_closed
from .gate import InboundBudget
from .policy import OpenPIPolicy

logger = logging.getLogger("trajectory_ensemble.openpi")

ROUTES = ("/", "/v1/realtime/robot/openpi")
"""Paths that serve the wire: openpi's and vLLM-Omni's."""
HEALTH_ROUTES = ("/healthz", "/health")
"""Paths that answer ``OK`` to a plain GET, without auth."""
STATS_ROUTE = "/stats"
"""A plain GET answers :meth:`OpenPIServer.stats` as JSON (with the key, when one is set)."""
SHUTDOWN_FLUSH_S = 1.0
"""How long the error frames of a shutdown may take to go out before the connections are closed, and how long their
closing handshakes may take before the listening socket closes."""
INBOUND_QUEUE = (0, 0)
"""websockets' ``max_queue`` (high, low) for every connection: reading pauses as soon as one whole frame waits in the
library's queue, and resumes once the handler has taken it. With the library's default (16 frames), 12 connections
pipelining 16 frames of 11.4 MB each held 2 GB before the handlers had read any."""
INBOUND_BUDGET_MESSAGES = 4
"""``openpi_max_inbound_bytes`` 0 means this many ``openpi_max_message_bytes``."""
PASS_TURN_S = 0.05
"""A connection whose turn to read comes (:class:`.gate.InboundBudget`) but has nothing to read within this long passes
the turn on, so an idle connection never holds back the others."""


@dataclass(frozen=True)
class ServerLimits:
    """The server's limits (``openpi_*`` parameters).

    Args:
        max_message_bytes (`int`): Largest incoming message.
        idle_timeout_s (`float`): A connection with no request for this long is closed; 0 = never.
        max_connections (`int`): Connections at once.
        max_concurrent (`int`): Requests in the engine at once (co-batched).
        max_queued (`int`): Requests waiting beyond ``max_concurrent``.
        max_connections_per_client (`int`): Connections of one client (key and peer address) at once; 0 = no cap.
        handshake_idle_s (`float`): A connection without a request for this long may be reclaimed when the server is
            full (:mod:`.connections`).
        max_inbound_bytes (`int`): Bytes of request frames read and not yet answered, across connections; 0 =
            :data:`INBOUND_BUDGET_MESSAGES` x ``max_message_bytes`` (:attr:`inbound_budget`).
    """

    max_message_bytes: int = 16 * 1024 * 1024
    idle_timeout_s: float = 30.0
    max_connections: int = 64
    max_concurrent: int = 8
    max_queued: int = 32
    max_connections_per_client: int = 16
    handshake_idle_s: float = 5.0
    max_inbound_bytes: int = 0

    @classmethod
    def from_params(cls, params: NodeParams) -> ServerLimits:
        return cls(params.openpi_max_message_bytes, params.openpi_idle_timeout_s, params.openpi_max_connections,
                   params.openpi_max_concurrent, params.openpi_max_queued, params.openpi_max_connections_per_client,
                   params.openpi_handshake_idle_s, params.openpi_max_inbound_bytes)

    @property
    def inbound_budget(self) -> int:
        """``max_inbound_bytes``, or its default derived from ``max_message_bytes``."""
        return self.max_inbound_bytes or INBOUND_BUDGET_MESSAGES * self.max_message_bytes


def _refusal(error: TrajectoryEnsembleError) -> str:
    """An HTTP refusal's body: ``NAME (code): message``, as every refusal a person reads."""
    return describe_error(error) + "\n"


class OpenPIServer:
    """Serve an :class:`OpenPIPolicy` on the OpenPI websocket wire.

    Args:
        policy (`OpenPIPolicy`): The service face; its engine must be running.
        limits (`ServerLimits`): Message size, idle timeout, connections, concurrency, queue.
        host (`str`): Address to bind (``127.0.0.1`` by default; see ``serve-openpi`` for the rules on others).
        port (`int`): Port; 0 picks a free one (:meth:`run` reports it).
        api_key (`str` or `Sequence[str]`, *optional*): The key, or keys, every connection must carry one of. Each
            key is its own owner: connections with different keys never share a session.
    """

    def __init__(self, policy: OpenPIPolicy, limits: ServerLimits, *, host: str = "127.0.0.1", port: int = 8000,
                 api_key: str | Sequence[str] | None = None) -> None:
        self.policy, self.limits = policy, limits
        self.host, self.port = host, int(port)
        self.keys = KeyRing([api_key] if isinstance(api_key, str) else list(api_key or ()))
        self.connections = ConnectionTable(limits.max_connections, limits.max_connections_per_client,
                                           limits.handshake_idle_s)
        self.counts: collections.Counter[str] = collections.Counter()
        self.dispatcher = RequestDispatcher(policy, max_message_bytes=limits.max_message_bytes,
                                            max_concurrent=limits.max_concurrent, max_queued=limits.max_queued,
                                            counts=self.counts)
        self.inbound = InboundBudget(limits.inbound_budget)
        self._connections: set[ServerConnection] = set()
        self._ids = itertools.count(1)
        self._metadata = codec.pack(policy.metadata(asdict(limits)))

    def stats(self) -> dict[str, Any]:
        """Counts of the server (connections, requests, replies, error frames, refusals) and of the engine's groups.

        ``running``: requests holding a slot (being built or in the engine); ``in_engine``: their groups submitted
        and not ended; ``waiting``: requests queued for a slot.
        """
        return {"server": dict(self.counts), "groups": self.policy.model.outcome_counts(),
                "connections": len(self._connections), "running": self.dispatcher.gate.active,
                "in_engine": self.dispatcher.in_engine, "waiting": self.dispatcher.gate.waiting,
                "inbound_bytes": self.inbound.held, "inbound_peak_bytes": self.inbound.peak,
                "inbound_waiting": self.inbound.waiting}

    async def run(self, stop: asyncio.Event, on_ready: Callable[[int], None] | None = None) -> None:
        """Serve until ``stop`` is set, then shut down (every request still open gets a ``SHUTDOWN`` error frame).

        Args:
            stop (`asyncio.Event`): Set it to stop.
            on_ready (`Callable[[int], None]`, *optional*): Called with the bound port once connections are accepted.
        """
        self.dispatcher.start()
        async with serve(self._handler, self.host, self.port, process_request=self._process_request,
                         max_size=self.limits.max_message_bytes, max_queue=INBOUND_QUEUE, compression=None,
                         # No keepalive pings: a connection held back by the inbound budget is not read from, so
                         # its pong could not arrive and the ping would drop a request already read. Dead peers
                         # are closed by openpi_idle_timeout_s.
                         ping_interval=None, close_timeout=SHUTDOWN_FLUSH_S) as server:
            self.port = int(server.sockets[0].getsockname()[1])
            if on_ready is not None:
                on_ready(self.port)
            try:
                await stop.wait()
                await self._shutdown(server)
            finally:
                self.dispatcher.close()

    @property
    def api_key(self) -> bool:
        """Whether connections need a key (the keys themselves are not exposed)."""
        return bool(self.keys)

    async def _shutdown(self, server: Any) -> None:
        # Running requests cancel their groups and send their SHUTDOWN frames (RequestDispatcher.serve).
        self.dispatcher.stop()
        deadline = time.monotonic() + SHUTDOWN_FLUSH_S
        while self.dispatcher.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        # The connections close first, the listening socket last: until then a new handshake gets 503 SHUTDOWN,
        # as the docs promise, instead of a refused connect.
        closing = [asyncio.ensure_future(ws.close(CloseCode.GOING_AWAY, "server shutting down"))
                   for ws in list(self._connections)]
        if closing:
            await asyncio.wait(closing, timeout=SHUTDOWN_FLUSH_S)
        server.close(close_connections=True, code=CloseCode.GOING_AWAY, reason="server shutting down")
        try:
            await asyncio.wait_for(server.wait_closed(), SHUTDOWN_FLUSH_S)
        except asyncio.TimeoutError:
            logger.warning("openpi: %d connection(s) did not close in time", len(self._connections))
        logger.info("openpi: stopped; %s", self.stats())

    # --- handshake -------------------------------------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path in HEALTH_ROUTES:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if path not in (*ROUTES, STATS_ROUTE):
            return connection.respond(http.HTTPStatus.NOT_FOUND,
                                      f"no route {quote_value(path)}; the OpenPI wire is served at {list(ROUTES)}\n")
        if self.dispatcher.stopping:
            self.counts["refused_shutdown"] += 1
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      _refusal(EngineShutdownError("", "the server is shutting down")))
        owner = self.keys.match(request.headers.get("Authorization")) if self.keys else None
        if self.keys and owner is None:
            self.counts["refused_unauthorized"] += 1
            logger.warning("openpi: refused a connection from %s: missing or wrong key", connection.remote_address)
            refusal = AuthenticationError("missing or wrong key; send 'Authorization: Api-Key <key>' or "
                                          "'Authorization: Bearer <key>'")
            response = connection.respond(http.HTTPStatus.UNAUTHORIZED, _refusal(refusal))
            response.headers["WWW-Authenticate"] = 'Bearer realm="openpi"'
            return response
        if path == STATS_ROUTE:
            response = connection.respond(http.HTTPStatus.OK, json.dumps(self.stats()) + "\n")
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = "application/json"
            return response
        peer = str((connection.remote_address or ("?",))[0])
        try:
            reclaims = self.connections.admit(connection, owner, peer,
                                              is_closed=lambda ws: ws.state is State.CLOSED)
        except CapacityError as refusal:
            self.counts["refused_capacity"] += 1
            logger.warning("openpi: refused a connection from %s: %s", peer, bound_text(str(refusal)))
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, _refusal(refusal))
        for reclaim in reclaims:
            self.counts["closed_reclaimed"] += 1
            logger.info("openpi: closing connection %d of %s to make room: %s", reclaim.state.number,
                        reclaim.state.peer, reclaim.reason)
            asyncio.ensure_future(reclaim.state.connection.close(CloseCode.TRY_AGAIN_LATER, reclaim.reason))
        return None

    # --- one connection --------------------------------------------------------------------------------------------

    async def _handler(self, ws: ServerConnection) -> None:
        conn_id = next(self._ids)
        state = self.connections.start(ws, conn_id)
        caller = state.caller()
        self._connections.add(ws)
        self.counts["connections"] += 1
        try:
            await ws.send(self._metadata)
            previous_total_ms: float | None = None
            for seq in itertools.count(1):
                # Past the budget this connection is not read from: its next frame waits in the library's queue
                # (one at most), then in the kernel, and the client's writes block.
                if not await self._room_to_read(ws):
                    return
                raw = await self._next_message(ws)
                if raw is None:
                    return
                if self.inbound.full:
                    # Read while others filled the budget (it was waiting on its socket): refused at once, so the
                    # frames held stay within one frame of the budget.
                    del raw
                    self.counts["error_frames"] += 1
                    self.counts["refused_inbound"] += 1
                    await ws.send(codec.error_frame(self.inbound.refusal()))
                    continue
                size = len(raw)
                self.inbound.take(size)
                try:
                    state.requests += 1  # from now on a request-serving connection: never reclaimed
                    started = time.monotonic()
                    pending = self.dispatcher.serve(ws, raw, f"openpi-{conn_id}-{seq}", caller, started,
                                                    previous_total_ms)
                    del raw  # serve drops the frame once decoded
                    out = await pending
                    if out is None:
                        return  # the client went away mid-request
                    await ws.send(out)
                finally:
                    self.inbound.give_back(size)
                previous_total_ms = (time.monotonic() - started) * 1000.0
        except ConnectionClosed:
            pass
        finally:
            self._connections.discard(ws)
            self.connections.close(ws)
            self.policy.sessions.forget_connection(caller.owner, conn_id)

    async def _room_to_read(self, ws: ServerConnection) -> bool:
        """Wait for room in the inbound budget; False when the connection or the server closes first."""
        if self.inbound.has_room():
            return True
        assert self.dispatcher.shutting_down is not None
        closed = asyncio.ensure_future(ws.wait_closed())
        try:
            return await until_closed(self.inbound.wait_for_room(), closed, self.dispatcher.shutting_down)
        finally:
            closed.cancel()

    async def _next_message(self, ws: ServerConnection) -> str | bytes | None:
        idle = self.limits.idle_timeout_s or None
        recv = asyncio.ensure_future(ws.recv())
        try:
            done, _ = await asyncio.wait({recv}, timeout=PASS_TURN_S)
            if not done:
                self.inbound.pass_turn()  # nothing to read here yet: another connection may read meanwhile
                # Canceling recv() is safe in websockets: no message is lost.
                return await asyncio.wait_for(recv, None if idle is None else max(0.0, idle - PASS_TURN_S))
            return recv.result()
        except asyncio.TimeoutError:
            self.counts["closed_idle"] += 1
            await ws.close(CloseCode.GOING_AWAY, f"idle for {idle:g} s without a request (openpi_idle_timeout_s)")
        except ConnectionClosed:
            pass
        return None


class ServerThread:
    """An :class:`OpenPIServer` on its own event loop thread (tests and the fleet benchmark).

    Args:
        server (`OpenPIServer`): Bind ``port=0`` to get a free port (:attr:`port` once started).
    """

    def __init__(self, server: OpenPIServer) -> None:
        self.server = server
        self.port: int | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="openpi-server", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await self.server.run(self._stop, on_ready=self._on_ready)

        try:
            asyncio.run(main())
        except BaseException as error:  # noqa: BLE001 - reported by start()
            self._error = error
            self._ready.set()

    def _on_ready(self, port: int) -> None:
        self.port = port
        self._ready.set()

    def start(self, timeout: float = 30.0) -> ServerThread:
        """Start serving; returns once the port accepts connections."""
        self._thread.start()
        if not self._ready.wait(timeout) or self._error is not None:
            raise RuntimeError(f"the OpenPI server did not start: {type(self._error).__name__}: "
                               f"{bound_text(str(self._error))}")
        return self

    @property
    def url(self) -> str:
        return f"ws://{self.server.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down as on SIGINT and wait for the thread."""
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
