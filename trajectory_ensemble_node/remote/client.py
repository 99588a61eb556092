"""A synchronous client of an OpenPI server, for a node whose engine runs elsewhere (``engine: openpi``).

One :class:`Connection` per request in flight; aborting it is how a request is canceled, and it is never closed
politely (a frozen server would add its close timeout to every wait). Every failure is a named error and every wait
and reply is bounded (:data:`REPLY_TRANSFER_S`, :func:`max_reply_bytes`): docs/remote-engine.md, "Network faults".
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, WebSocketException
from websockets.frames import CloseCode
from websockets.protocol import State
from websockets.sync.client import ClientConnection, connect

from ..errors import (
    ErrorCode,
    InvalidMessageError,
    RemoteDisconnectedError,
    RemoteRefusalError,
    RemoteSchemaError,
    RemoteTimeoutError,
    RemoteUnreachableError,
    TrajectoryEnsembleError,
    rebuild_error,
)
from ..quoting import QUOTE_CHARS, bound_text, quote_value
from ..serving.params import NodeParams
from ..wire import codec
from ..wire.schemas import STATE_KEY, get_schema

logger = logging.getLogger(__name__)

REPLY_LIMITS = codec.DecodeLimits(max_map_len=4096, max_array_len=4096, max_str_len=64 * 1024 * 1024,
                                  max_bin_len=256 * 1024 * 1024, max_entries=1 << 20, max_depth=8)
"""Bounds of a reply frame: a reply carries a metrics map, seeds and ``[N, H, D]`` candidates, larger than a
request's, but still from a server this node was configured to trust."""
MAX_REPLY_BYTES = 16 * 1024 * 1024
"""The largest frame a server may send when the caller derives none (:func:`max_reply_bytes`)."""
REPLY_OVERHEAD_BYTES = 1024 * 1024
"""Room in a reply beside its arrays: seeds, validity, metrics, timing, an error frame's message."""
REPLY_TRANSFER_S = 2.0
"""Seconds a reply may take to arrive once its first bytes have: a whole reply is a few hundred KiB at most, so a
reply still arriving after this is a trickle, not a slow network."""
REPLY_POLL_S = 0.05
"""How often a wait for a reply looks whether one has started (and bounds how late a timeout is noticed)."""
CLOSE_TIMEOUT_S = 0.2
"""The websocket's close timeout: it only bounds a protocol failure's own close (the client aborts, never closes
politely)."""
NEEDED_EXTRAS = ("seed",)
"""Extras every remote must take: the seed (the node plans every group's seeds)."""
BATCH_EXTRAS = ("num_candidates", "reducer", "return_candidates")
"""Extras a server that draws a whole group per request must take."""


def error_from_frame(text: str, request_id: str) -> TrajectoryEnsembleError:
    """The named error a server's text frame reports, as the same class and code where this package has it.

    Args:
        text (`str`): The text frame (:func:`~..wire.codec.error_frame`'s JSON).
        request_id (`str`): The group it ended (for the group errors, which carry one).
    """
    try:
        frame = codec.parse_error_frame(text)
    except ValueError:
        return RemoteRefusalError(int(ErrorCode.ENGINE_FAILURE), "UnknownFrame", quote_value(text, 200))
    # The server's words, bounded: a hostile one may send megabytes.
    name, code, message = (bound_text(str(frame["type"]), QUOTE_CHARS), frame["code"],
                           bound_text(str(frame["message"])))
    if isinstance(code, int):
        error = rebuild_error(name, message, code=code, request_id=request_id)
        if error is not None:
            return error
    return RemoteRefusalError(int(code) if isinstance(code, int) else int(ErrorCode.ENGINE_FAILURE), name, message)


def max_reply_bytes(params: NodeParams) -> int:
    """The largest reply frame the node accepts: its arrays at their largest, in float64, plus
    :data:`REPLY_OVERHEAD_BYTES`.

    A reply holds the reduced action ``[H, D]`` and, when asked, the candidates ``[N, H, D]`` (and may carry the same
    again as a ``chunk``); anything larger is no reply to this node's requests.

    Args:
        params (`NodeParams`): ``max_candidates``, ``chunk_size``, ``action_dim``.
    """
    arrays = (params.max_candidates + 1) * params.chunk_size * params.action_dim * 8
    return REPLY_OVERHEAD_BYTES + 2 * arrays


def check_metadata(meta: Mapping[str, Any], params: NodeParams, *, batched: bool) -> None:
    """Refuse a server whose handshake does not fit the node's parameters.

    Fields a server does not send (vLLM-Omni sends fewer) are not checked; those it sends must agree.

    Args:
        meta (`Mapping[str, Any]`): The decoded metadata.
        params (`NodeParams`): The node's parameters.
        batched (`bool`): Whether the node will send whole groups (then the candidate extras are needed too).

    Raises:
        RemoteSchemaError: naming the field, the server's value and the node's.
    """
    p = params

    def differ(field: str, theirs: Any, ours: Any) -> None:
        raise RemoteSchemaError(f"the remote engine at {p.engine_url} does not fit this node: {field} is "
                                f"{quote_value(theirs)} there but {quote_value(ours)} here")

    for field, ours in (("embodiment", p.domain_name), ("action_shape", [p.chunk_size, p.action_dim]),
                        ("action_horizon", p.chunk_size), ("action_dim", p.action_dim)):
        if field in meta and meta[field] != ours:
            differ(field, meta[field], ours)
    if "dt" in meta and not (isinstance(meta["dt"], (int, float)) and math.isclose(meta["dt"], p.dt, rel_tol=1e-9)):
        differ("dt", meta["dt"], p.dt)
    schema = get_schema(p.openpi_schema)
    theirs = meta.get("observation_schema")
    if isinstance(theirs, Mapping):
        image_keys = (theirs.get("images") or {}).get("composite")
        if image_keys != list(schema.layouts[0].keys):
            differ("observation_schema.images.composite", image_keys, list(schema.layouts[0].keys))
        if theirs.get("prompt") != schema.prompt_key:
            differ("observation_schema.prompt", theirs.get("prompt"), schema.prompt_key)
    extras = meta.get("extras")
    if isinstance(extras, Mapping):
        keys = list(extras.get("keys") or ())
        needed = NEEDED_EXTRAS + (BATCH_EXTRAS if batched else ())
        missing = [key for key in needed if key not in keys]
        if missing:
            differ("extras.keys", keys, f"a list with {missing}")
        steps = extras.get("num_inference_steps")
        if steps is not None and steps != p.num_inference_steps:
            differ("extras.num_inference_steps", steps, p.num_inference_steps)
    served_state_names(meta)  # a malformed state block refuses the server here, before anything is sent


def served_state_names(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The robot-state channels the server's model takes, in its order (its handshake's ``state``; empty: none).

    A server whose model takes state advertises ``{"key": "observation/state", "width": S, "names": [...]}``; the
    node then sends its state, picked by these names, under that key with every request.

    Raises:
        RemoteSchemaError: a ``state`` block that is not that (another key, names that are not strings, a width
            that is not their count).
    """
    state = meta.get("state")
    if state is None:
        return ()
    names = state.get("names") if isinstance(state, Mapping) else None
    if (not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names)
            or state.get("key") != STATE_KEY or state.get("width") != len(names)):
        raise RemoteSchemaError(f"the remote engine's handshake has a state block this node cannot read: "
                                f"{quote_value(state)}; expected {{'key': '{STATE_KEY}', 'width': S, 'names': [S "
                                f"names]}}")
    return tuple(names)


def samples_per_request(meta: Mapping[str, Any]) -> int | None:
    """How many candidates one request of this server may draw: ``None`` = a whole group (up to its maximum).

    A server that advertises ``policy_server_config.samples_per_request`` 1, or takes no ``num_candidates`` extra at
    all (vLLM-Omni), draws one sample per request.
    """
    config = meta.get("policy_server_config")
    advertised = config.get("samples_per_request") if isinstance(config, Mapping) else None
    extras = meta.get("extras")
    takes_count = isinstance(extras, Mapping) and isinstance(extras.get("num_candidates"), Mapping)
    if not takes_count:
        return 1
    if isinstance(advertised, int) and advertised >= 1:
        return advertised
    limit = extras["num_candidates"].get("max")
    return int(limit) if isinstance(limit, int) and limit >= 1 else None


class Connection:
    """One websocket to the server, its metadata read. Thread-safe :meth:`close` and :meth:`abort` (a cancel from
    another thread).

    Args:
        ws (`ClientConnection`): The open websocket. metadata (`dict[str, Any]`): What the server sent first.
        url (`str`): For messages.
        max_reply_bytes (`int`): The largest frame accepted (the websocket's ``max_size``), for messages.
    """

    def __init__(self, ws: ClientConnection, metadata: dict[str, Any], url: str,
                 max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        self.ws, self.metadata, self.url = ws, metadata, url
        self.max_reply_bytes = int(max_reply_bytes)
        self._closed_by_us = threading.Event()

    def request(self, obs: Mapping[str, Any], *, timeout_s: float, request_id: str) -> dict[str, Any]:
        """Send one request and wait for its reply; on any failure the connection is aborted (no close handshake).

        Args:
            obs (`Mapping[str, Any]`): The request (observation keys and extras).
            timeout_s (`float`): Seconds the reply may take.
            request_id (`str`): The group (for messages and group errors).

        Raises:
            RemoteTimeoutError: no reply within ``timeout_s`` (the connection is aborted: the server cancels).
            RemoteDisconnectedError: the connection dropped, was closed by :meth:`close` or :meth:`abort`, or a
                reply that had started did not finish within :data:`REPLY_TRANSFER_S`.
            RemoteSchemaError: a reply frame above ``max_reply_bytes``, or one that is not a msgpack map.
            TrajectoryEnsembleError: the server's error frame, as its named class.
        """
        deadline = time.monotonic() + max(timeout_s, 0.0)
        try:
            self.ws.send(codec.pack(dict(obs)))
            raw = self._receive(deadline, timeout_s, request_id)
        except TrajectoryEnsembleError:
            raise  # named already (RemoteTimeoutError is an OSError too)
        except (ConnectionClosed, OSError) as error:
            self.abort()
            raise self._closed_error(error, request_id) from None
        if isinstance(raw, str):
            raise error_from_frame(raw, request_id)
        try:
            return codec.unpack(raw, REPLY_LIMITS)
        except InvalidMessageError as error:
            raise RemoteSchemaError(f"request {request_id}: the reply of {self.url} is no reply frame: "
                                    f"{bound_text(str(error))}") from None

    def _receive(self, deadline: float, timeout_s: float, request_id: str) -> str | bytes:
        """The next message, waiting in short slices so that a reply that started but trickles is caught."""
        started: float | None = None
        while True:
            now = time.monotonic()
            try:
                return self.ws.recv(timeout=max(0.0, min(REPLY_POLL_S, deadline - now)))
            except TimeoutError:
                pass
            now = time.monotonic()
            if self.ws.state is not State.OPEN:
                self.abort()  # the protocol failed (an oversized frame): end now, not after a close handshake
                continue  # the next recv raises ConnectionClosed, named by _closed_error
            if started is None and self._reply_started():
                started = now
            if started is not None and now - started > REPLY_TRANSFER_S:
                self.abort()
                raise RemoteDisconnectedError(
                    f"request {request_id}: the reply of {self.url} started but did not finish within "
                    f"{REPLY_TRANSFER_S:g} s (a trickle); the connection was aborted")
            if now >= deadline:
                self.abort()
                raise RemoteTimeoutError(f"request {request_id}: no reply from {self.url} within {timeout_s:.3f} s; "
                                         "the request was canceled (connection aborted)")

    def _reply_started(self) -> bool:
        # Bytes of a frame not yet whole, or fragments of a message not yet whole: a reply is arriving.
        reader = getattr(self.ws.protocol, "reader", None)
        frames = getattr(getattr(self.ws, "recv_messages", None), "frames", None)
        return bool(getattr(reader, "buffer", b"")) or (frames is not None and not frames.empty())

    def _closed_error(self, error: BaseException, request_id: str) -> TrajectoryEnsembleError:
        sent = getattr(error, "sent", None) or getattr(self.ws.protocol, "close_sent", None)
        if sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG:
            return RemoteSchemaError(f"request {request_id}: the reply of {self.url} is above the limit of "
                                     f"{self.max_reply_bytes} bytes a reply may have; the connection was aborted")
        if self._closed_by_us.is_set():
            return RemoteDisconnectedError(f"request {request_id}: its connection to {self.url} was closed "
                                           "(canceled)")
        return RemoteDisconnectedError(f"request {request_id}: the connection to {self.url} dropped mid-request "
                                       f"({type(error).__name__}: {bound_text(str(error), QUOTE_CHARS * 4)})")

    def close(self) -> None:
        """End the connection at once (from any thread): a cancel. A request waiting on it ends with
        ``RemoteDisconnectedError``; the server sees its client leave and cancels the group."""
        self._closed_by_us.set()
        self.abort()

    def abort(self) -> None:
        """Drop the TCP connection without a close handshake: an unresponsive server adds no wait."""
        try:
            self.ws.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed or never connected: nothing to abort
        try:
            self.ws.close_socket()  # websockets' own teardown: wakes a waiting recv with ConnectionClosed
        except (OSError, WebSocketException):
            pass
        except Exception:  # noqa: BLE001 - anything else is a bug to see, not a reason to fail the abort
            logger.exception("aborting the connection to %s raised", self.url)


def open_connection(url: str, *, api_key: str | None, timeout_s: float,
                    max_reply_bytes: int = MAX_REPLY_BYTES) -> Connection:
    """Connect, authenticate and read the metadata, within ``timeout_s``.

    Args:
        url (`str`): ``ws://HOST:PORT`` or ``wss://...``.
        api_key (`str`, *optional*): Sent as ``Authorization: Api-Key <key>``.
        timeout_s (`float`): Bound of the connect, the handshake and the metadata.
        max_reply_bytes (`int`): The largest frame the server may send (:func:`max_reply_bytes`).

    Raises:
        RemoteUnreachableError: no connection, a refused handshake (a wrong key: HTTP 401), or no metadata in time.
    """
    headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
    try:
        ws = connect(url, additional_headers=headers, open_timeout=timeout_s, close_timeout=CLOSE_TIMEOUT_S,
                     compression=None, max_size=max_reply_bytes)
        # Held open across calls (closed by Connection.close): entered once, as websockets 17 asks of a connection
        # that is not used in one with-block.
        ws.__enter__()
    except InvalidStatus as error:
        raise RemoteUnreachableError(f"the remote engine at {url} refused the connection: HTTP "
                                     f"{error.response.status_code} {quote_value(error.response.body, 200)}"
                                     ) from None
    except (OSError, InvalidHandshake, TimeoutError) as error:
        raise RemoteUnreachableError(f"the remote engine at {url} is unreachable: {type(error).__name__}: "
                                     f"{bound_text(str(error), QUOTE_CHARS * 4)}") from None
    try:
        raw = ws.recv(timeout=timeout_s)
        if isinstance(raw, str):
            raise RemoteUnreachableError(f"the remote engine at {url} sent a text frame instead of its metadata: "
                                         f"{quote_value(raw, 200)}")
        metadata = codec.unpack(raw, REPLY_LIMITS)
    except (TimeoutError, ConnectionClosed, OSError, TrajectoryEnsembleError) as error:
        connection = Connection(ws, {}, url, max_reply_bytes)
        connection.abort()
        if isinstance(error, RemoteUnreachableError):
            raise
        raise RemoteUnreachableError(f"the remote engine at {url} sent no usable metadata: {type(error).__name__}: "
                                     f"{bound_text(str(error), QUOTE_CHARS * 4)}") from None
    return Connection(ws, metadata, url, max_reply_bytes)
