"""A synchronous client of an OpenPI server, for a node whose engine runs elsewhere (``engine: openpi``).

One :class:`Connection` per request in flight: the wire answers the requests of one connection in order, and closing
a connection is how a request is canceled (the server cancels the group of a client that left and counts it as
``canceled_on_disconnect``). The codec is the server's own (:mod:`..openpi.wire`), the key goes in ``Authorization:
Api-Key <key>``, and the handshake metadata is checked against the node's parameters (:func:`check_metadata`) before
anything is sent.

Every failure is a named error: the server's own refusals come back as the class and code its error frame names
(:func:`error_from_frame`); the network's are :class:`~..errors.RemoteUnreachableError` (connect or handshake),
:class:`~..errors.RemoteDisconnectedError` (dropped mid-request), :class:`~..errors.RemoteTimeoutError` (no reply in
time) and :class:`~..errors.RemoteSchemaError` (a server whose handshake does not fit). Every wait is bounded.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from ..errors import (
    ErrorCode,
    RemoteDisconnectedError,
    RemoteRefusalError,
    RemoteSchemaError,
    RemoteTimeoutError,
    RemoteUnreachableError,
    TrajectoryEnsembleError,
    rebuild_error,
)
from ..openpi import wire
from ..openpi.schemas import get_schema
from ..serving.params import NodeParams

logger = logging.getLogger(__name__)

REPLY_LIMITS = wire.DecodeLimits(max_map_len=4096, max_array_len=4096, max_str_len=64 * 1024 * 1024,
                                 max_bin_len=256 * 1024 * 1024, max_entries=1 << 20, max_depth=8)
"""Bounds of a reply frame: a reply carries a metrics map, seeds and ``[N, H, D]`` candidates, larger than a
request's, but still from a server this node was configured to trust."""
NEEDED_EXTRAS = ("seed",)
"""Extras every remote must take: the seed (the node plans every group's seeds)."""
BATCH_EXTRAS = ("num_candidates", "reducer", "return_candidates")
"""Extras a server that draws a whole group per request must take."""


def error_from_frame(text: str, request_id: str) -> TrajectoryEnsembleError:
    """The named error a server's text frame reports, as the same class and code where this package has it.

    Args:
        text (`str`): The text frame (:func:`~..openpi.wire.error_frame`'s JSON).
        request_id (`str`): The group it ended (for the group errors, which carry one).
    """
    try:
        frame = wire.parse_error_frame(text)
    except ValueError:
        return RemoteRefusalError(int(ErrorCode.ENGINE_FAILURE), "UnknownFrame", text[:200])
    name, code, message = str(frame["type"]), frame["code"], str(frame["message"])
    if isinstance(code, int):
        error = rebuild_error(name, message, code=code, request_id=request_id)
        if error is not None:
            return error
    return RemoteRefusalError(int(code) if isinstance(code, int) else int(ErrorCode.ENGINE_FAILURE), name, message)


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
        raise RemoteSchemaError(f"the remote engine at {p.engine_url} does not fit this node: {field} is {theirs!r} "
                                f"there but {ours!r} here")

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
    """One websocket to the server, its metadata read. Thread-safe :meth:`close` (a cancel from another thread).

    Args:
        ws (`ClientConnection`): The open websocket. metadata (`dict[str, Any]`): What the server sent first.
        url (`str`): For messages.
    """

    def __init__(self, ws: ClientConnection, metadata: dict[str, Any], url: str) -> None:
        self.ws, self.metadata, self.url = ws, metadata, url
        self._closed_by_us = threading.Event()

    def request(self, obs: Mapping[str, Any], *, timeout_s: float, request_id: str) -> dict[str, Any]:
        """Send one request and wait for its reply.

        Args:
            obs (`Mapping[str, Any]`): The request (observation keys and extras).
            timeout_s (`float`): Seconds the reply may take.
            request_id (`str`): The group (for messages and group errors).

        Raises:
            RemoteTimeoutError: no reply within ``timeout_s`` (the connection is then closed: the server cancels).
            RemoteDisconnectedError: the connection dropped (or was closed by :meth:`close`).
            TrajectoryEnsembleError: the server's error frame, as its named class.
        """
        try:
            self.ws.send(wire.pack(dict(obs)))
            raw = self.ws.recv(timeout=max(timeout_s, 0.0))
        except TimeoutError:
            self.close()
            raise RemoteTimeoutError(f"request {request_id}: no reply from {self.url} within {timeout_s:.3f} s; "
                                     "the request was canceled (connection closed)") from None
        except (ConnectionClosed, OSError) as error:
            if self._closed_by_us.is_set():
                raise RemoteDisconnectedError(f"request {request_id}: its connection to {self.url} was closed "
                                              "(canceled)") from None
            raise RemoteDisconnectedError(f"request {request_id}: the connection to {self.url} dropped mid-request "
                                          f"({type(error).__name__}: {error})") from None
        if isinstance(raw, str):
            raise error_from_frame(raw, request_id)
        return wire.unpack(raw, REPLY_LIMITS)

    def close(self) -> None:
        """Close the websocket (from any thread); a request waiting on it ends with ``RemoteDisconnectedError``."""
        self._closed_by_us.set()
        try:
            self.ws.close()
        except (OSError, WebSocketException):
            pass  # the socket is already broken: closing it is best effort
        except Exception:  # noqa: BLE001 - anything else is a bug to see, not a reason to fail the close
            logger.exception("closing the connection to %s raised", self.url)


def open_connection(url: str, *, api_key: str | None, timeout_s: float) -> Connection:
    """Connect, authenticate and read the metadata, within ``timeout_s``.

    Args:
        url (`str`): ``ws://HOST:PORT`` or ``wss://...``.
        api_key (`str`, *optional*): Sent as ``Authorization: Api-Key <key>``.
        timeout_s (`float`): Bound of the connect, the handshake and the metadata.

    Raises:
        RemoteUnreachableError: no connection, a refused handshake (a wrong key: HTTP 401), or no metadata in time.
    """
    headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
    try:
        ws = connect(url, additional_headers=headers, open_timeout=timeout_s, close_timeout=1.0, compression=None,
                     max_size=None)
        # Held open across calls (closed by Connection.close): entered once, as websockets 17 asks of a connection
        # that is not used in one with-block.
        ws.__enter__()
    except InvalidStatus as error:
        raise RemoteUnreachableError(f"the remote engine at {url} refused the connection: HTTP "
                                     f"{error.response.status_code} {error.response.body[:200]!r}") from None
    except (OSError, InvalidHandshake, TimeoutError) as error:
        raise RemoteUnreachableError(f"the remote engine at {url} is unreachable: {type(error).__name__}: "
                                     f"{error}") from None
    try:
        raw = ws.recv(timeout=timeout_s)
        if isinstance(raw, str):
            raise RemoteUnreachableError(f"the remote engine at {url} sent a text frame instead of its metadata: "
                                         f"{raw[:200]!r}")
        metadata = wire.unpack(raw, REPLY_LIMITS)
    except (TimeoutError, ConnectionClosed, OSError, TrajectoryEnsembleError) as error:
        ws.close()
        if isinstance(error, RemoteUnreachableError):
            raise
        raise RemoteUnreachableError(f"the remote engine at {url} sent no usable metadata: {type(error).__name__}: "
                                     f"{error}") from None
    return Connection(ws, metadata, url)
