""":class:`RemoteModel`: the node's served model on a remote OpenPI server (``engine: openpi``).

The node keeps everything about the robot; the server runs the model. A group is one request (or N, against a server
that draws one sample per request; :mod:`.groups`), each on its own connection, so a cancel aborts them. Every wait is
bounded and a background prober keeps the remote's state for ``/diagnostics``: docs/remote-engine.md. No rclpy.
"""

from __future__ import annotations

import logging
import collections
import http.client
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from ..contract import CandidateTrajectorySpec, EnsembleResult, allowed_reducers
from ..engine import GroupHandle, GroupRequest, ValidityPolicy
from ..engine.context import ExecutionContext
from ..engine.request import new_group
from ..engine.validity import request_check
from ..errors import (
    AbortReason,
    GroupFailedError,
    MissingObservationKeyError,
    RemoteDisconnectedError,
    RemoteEngineError,
    RemoteTimeoutError,
    RemoteUnreachableError,
    TrajectoryEnsembleError,
)
from ..quoting import bound_text
from ..models.cosmos3 import MIN_IMAGE_SIDE
from ..reducers import available_reducers, check_mode_threshold
from ..serving import model_factory
from ..serving.params import NodeParams
from ..uncertainty import AlarmRule, alarm_in_force
from ..wire.schemas import STATE_KEY, get_schema
from .client import (
    Connection,
    check_metadata,
    max_reply_bytes,
    open_connection,
    samples_per_request,
    served_state_names,
)
from .groups import RemotePayload, check_actions, reduce_samples, request_frame, result_from_reply

logger = logging.getLogger(__name__)

BACKOFF_S = (0.5, 30.0)
"""First and longest wait between probes of a server that does not answer (doubling in between)."""
PROBE_EVERY_S = 5.0
"""Seconds between probes of a server that answers."""
UNREACHABLE_AFTER = 3
"""Failed probes in a row after which the state is ``unreachable`` (before: ``reconnecting``)."""


@dataclass(frozen=True)
class RemoteCapabilities:
    """What the node asks of a model's capabilities (the remote's own are its business)."""

    uses_state: bool = False
    state_names: tuple[str, ...] = ()
    context_guidance: bool = True
    reduce_before_denormalize: bool = True


class RemoteHandle(GroupHandle):
    """A group served remotely: canceling it also closes its connections (the server then cancels its group)."""

    def __init__(self, request: GroupRequest, on_cancel: Callable[[], None]) -> None:
        super().__init__(request)
        self._on_cancel = on_cancel

    def cancel(self, reason: AbortReason = AbortReason.CANCELED, message: str = "") -> bool:
        accepted = super().cancel(reason, message)
        if accepted:
            self._on_cancel()
        return accepted

    def finish(self, result: EnsembleResult | None, error: BaseException | None) -> None:
        """End the group (worker side): its result, or its named error."""
        self._finish(result, error)


class RemoteModel:
    """The node's served model when ``engine`` is ``openpi`` (a ``serving.request_path.ServedModel``).

    Args:
        params (`NodeParams`): The node's parameters (``engine_url``, ``engine_timeout_s``, the files read here).
        api_key (`str`, *optional*): The key; defaults to the variable ``engine_api_key_env`` names.

    Raises:
        StatsFileError, LimitsFileError: a configured file is unusable (read here, as the model factory would).
    """

    min_image_side = MIN_IMAGE_SIDE
    """The Cosmos 3 bound: the server's model refuses a smaller frame (checked here, on arrival, as locally)."""
    count_tokens = None
    """No tokenizer runs here: the server counts an instruction's tokens (``max_instruction_tokens``)."""

    def __init__(self, params: NodeParams, *, api_key: str | None = None) -> None:
        p = self.params = params
        self.url = p.engine_url
        self.api_key = api_key if api_key is not None else (os.environ.get(p.engine_api_key_env) or None
                                                            if p.engine_api_key_env else None)
        self.timeout_s = float(p.engine_timeout_s)
        self.max_reply_bytes = max_reply_bytes(p)
        # The files the local model would read, by the same factory; the groups reduced here (one sample per
        # request) use its mode cut.
        limits, self.normalizer, self.uncertainty_threshold, mode_cut = model_factory.served_files(p)
        self.validity = ValidityPolicy(limits=limits, min_valid_candidates=p.min_valid_candidates,
                                       position_policy=p.position_limit_policy)
        self.mode_threshold = check_mode_threshold(mode_cut)
        schema = get_schema(p.openpi_schema)
        self.image_key, self.prompt_key = schema.layouts[0].keys[0], schema.prompt_key
        self.metadata: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._open: dict[str, list[Connection]] = collections.defaultdict(list)
        self._canceled: set[str] = set()  # groups canceled: a connection still being opened sends nothing
        self._running = 0
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._prober: threading.Thread | None = None
        self._state = {"state": "unknown", "round_trip_ms": None, "failures": 0, "last_error": ""}

    # --- what the node reads of a model ----------------------------------------------------------------------------

    @property
    def capabilities(self) -> RemoteCapabilities:
        """What the node asks of a model; whether it takes the robot's state, and by which names, is the server's
        model's (its latest handshake's ``state``: none before the first)."""
        names = served_state_names(self.metadata)
        return RemoteCapabilities(uses_state=bool(names), state_names=names)

    @property
    def weights_version(self) -> int:
        return int(self.metadata.get("weights_version", 0) or 0)

    def valid_reducers(self) -> tuple[str, ...]:
        """The server's reducers for this width (its handshake), else every registered one."""
        extras = self.metadata.get("extras")
        declared = extras.get("reducer", {}).get("valid") if isinstance(extras, dict) else None
        return allowed_reducers(declared) if declared else available_reducers()

    def normalizer_for(self, domain_name: str) -> Any:
        return self.normalizer

    @property
    def alarm(self) -> AlarmRule | None:
        """``spread`` on the threshold, else none: no novelty scorer runs here."""
        return alarm_in_force(None, self.uncertainty_threshold)

    def instrument(self, wrap: Callable[[Any], Any]) -> None:
        """TEST ONLY: nothing to wrap, no adapter runs in this process (the server has its own hooks)."""
        return None

    @property
    def samples_per_request(self) -> int | None:
        """Candidates one request draws (``None``: a whole group)."""
        return samples_per_request(self.metadata)

    # --- lifecycle ---------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Handshake once (refusing a server that does not fit), then start the prober.

        Raises:
            RemoteUnreachableError: no server at ``engine_url``. RemoteSchemaError: one that does not fit.
        """
        self._handshake()
        self._stop.clear()
        self._prober = threading.Thread(target=self._probe_loop, name="remote-engine-prober", daemon=True)
        self._prober.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the prober and cancel every request in flight (their groups end ``SHUTDOWN``-like: canceled)."""
        self._stop.set()
        with self._lock:
            connections = [c for group in self._open.values() for c in group]
        for connection in connections:
            connection.close()
        if self._prober is not None:
            self._prober.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._prober is not None and self._prober.is_alive()

    @property
    def num_running(self) -> int:
        return self._running

    @property
    def num_queued(self) -> int:
        return 0

    def outcome_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._outcomes)

    def measured_costs(self, *, forget: bool = False, provisional: bool = False
                       ) -> tuple[float | None, float | None, float | None]:
        """Nothing is measured here: the remote's costs are its own (a deadline bounds the wait instead)."""
        return None, None, None

    def remote_status(self) -> dict[str, Any]:
        """For ``/diagnostics``: state, last round trip (ms), failures in a row, the server and its version."""
        with self._lock:
            state = dict(self._state)
        meta = self.metadata
        state.update(url=self.url, server=meta.get("server", ""), model=meta.get("model", ""),
                     weights_version=self.weights_version, samples_per_request=self.samples_per_request or 0)
        return state

    # --- groups ----------------------------------------------------------------------------------------------------

    def make_request(self, *, prompt: str, action: Any, num_inference_steps: int = 10, guidance_scale: float = 1.0,
                     fps: float = 8.0, spec: CandidateTrajectorySpec | None = None, base_seed: int | None = None,
                     request_id: str | None = None, on_progress: Callable[..., None] | None = None,
                     deadline_s: float | None = None, context: ExecutionContext | None = None,
                     current_state: tuple[float, ...] | None = None, rollout: Any = None,
                     state: Sequence[float] | None = None, **_: Any) -> GroupRequest:
        """A group request as the local model's ``make_request`` builds it (same checks, same seeds).

        Args:
            action (`CosmosActionCondition`): Its ``image`` is sent; the rest is the node's parameters.
            state (`Sequence[float]`, *optional*): The robot's state in the server's model's declared order, sent as
                float64 to a server whose model takes state; that server checks it (width, finite) by its rule.
            (others): As ``Cosmos3ActionModel.make_request``.

        Raises:
            InvalidSpecError: as the local model (count, reducer, seed); a rollout (not served remotely).
            MissingObservationKeyError: the server's model takes state and ``state`` is ``None`` (as a local model
                with a state input refuses it, before anything is sent).
        """
        p = self.params
        if rollout is not None:
            raise TrajectoryEnsembleError("rollout goals are not served on a remote engine (engine: openpi)")
        spec, seeds, group, reducer = new_group(
            spec, base_seed=base_seed, request_id=request_id, max_count=p.max_candidates, action_dim=p.action_dim,
            valid_reducers=self.valid_reducers(), domain_name=p.domain_name, mode_threshold=self.mode_threshold)
        validity = request_check(self.validity, p.action_dim, fps, current_state)
        names = self.capabilities.state_names
        if names and state is None:
            raise MissingObservationKeyError(f"missing ['{STATE_KEY}']: the remote engine's model takes the robot's "
                                             f"state ({list(names)}), and the request has none")
        payload = RemotePayload(prompt=prompt, image=np.ascontiguousarray(action.image),
                                num_inference_steps=num_inference_steps,
                                state=None if state is None else tuple(float(v) for v in state))
        return GroupRequest(group=group, spec=spec, seeds=seeds, payload=payload, reducer=reducer,
                            normalizer=self.normalizer, on_progress=on_progress, validity=validity,
                            deadline_s=deadline_s, uncertainty_threshold=self.uncertainty_threshold, context=context)

    def check_request(self, request: GroupRequest, *, refuse_cold: bool = False) -> None:
        """Nothing to refuse ahead: the remote's costs are unknown here, so a deadline bounds the wait instead."""

    def submit_request(self, request: GroupRequest) -> RemoteHandle:
        """Send the group on a worker thread; returns its handle (cancel closes its connections)."""
        rid = request.request_id
        handle = RemoteHandle(request, lambda: self._close_group(rid))
        with self._lock:
            self._running += 1
        threading.Thread(target=self._serve, args=(handle, time.monotonic()), name=f"remote-{rid}",
                         daemon=True).start()
        return handle

    def wait(self, handle: GroupHandle, timeout: float | None = None) -> EnsembleResult:
        return handle.result(timeout)

    def _serve(self, handle: RemoteHandle, submitted: float) -> None:
        request = handle.request
        steps = request.payload.num_inference_steps
        result: EnsembleResult | None = None
        error: BaseException | None = None
        try:
            request.report_progress("queued", 0, steps)
            # The first connection's handshake says how this server draws (it may have restarted as another).
            first = self._connect(request, submitted)
            request.report_progress("denoising", 0, steps)  # sent: the remote reports no steps, only its reply
            per_request = samples_per_request(first.metadata)
            if per_request is not None and per_request < request.count:
                if per_request != 1:
                    first.close()
                    raise RemoteEngineError(f"the remote engine draws {per_request} samples per request; a group of "
                                            f"{request.count} is served whole or one sample per request only")
                result = self._serve_samples(request, submitted, first)
            else:
                result = self._serve_batched(request, submitted, first)
        except BaseException as caught:  # noqa: BLE001 - every outcome ends the handle
            error = caught
        if error is None:
            request.report_progress("reducing", steps, steps)
        canceled = handle.cancel_requested
        if canceled is not None:
            result, error = None, canceled
        elif error is not None and not isinstance(error, TrajectoryEnsembleError):
            logger.error("group %s failed on the remote engine", request.request_id, exc_info=error)
            error = GroupFailedError(request.request_id,
                                     bound_text(f"remote engine: {type(error).__name__}: {error}"))
        with self._lock:
            self._running -= 1
            self._open.pop(request.request_id, None)
            self._canceled.discard(request.request_id)
            self._outcomes["succeeded" if error is None else type(error).__name__] += 1
        handle.finish(result, error)

    def _budget(self, request: GroupRequest, submitted: float) -> tuple[float, float]:
        """Seconds left for the reply, and the deadline to send (ms, 0 = none)."""
        if request.deadline_s:
            left = request.deadline_s - (time.monotonic() - submitted)
            if left <= 0:
                raise RemoteTimeoutError(f"request {request.request_id}: its deadline {request.deadline_s:.3f} s "
                                         "passed before it could be sent")
            return left, left * 1000.0
        left = self.timeout_s - (time.monotonic() - submitted)
        if left <= 0:
            raise RemoteTimeoutError(f"request {request.request_id}: no reply within engine_timeout_s "
                                     f"{self.timeout_s:g} s (it has no deadline)")
        return left, 0.0

    def _connect(self, request: GroupRequest, submitted: float) -> Connection:
        """A connection for one of ``request``'s requests, registered so a cancel closes it."""
        left, _ = self._budget(request, submitted)
        connection = open_connection(self.url, api_key=self.api_key, timeout_s=min(self.timeout_s, left),
                                     max_reply_bytes=self.max_reply_bytes)
        with self._lock:
            self._open[request.request_id].append(connection)
            canceled = request.request_id in self._canceled
        if canceled:  # canceled while this connection was being opened: nothing is sent
            connection.close()
            raise RemoteDisconnectedError(f"request {request.request_id}: canceled before it was sent")
        self.metadata = connection.metadata  # the latest version the server reports
        return connection

    def _request(self, request: GroupRequest, submitted: float, *, count: int, seed: int,
                 connection: Connection | None = None) -> dict[str, Any]:
        """One request of ``request``'s group on ``connection`` (else a new one), closed after its reply."""
        try:
            connection = connection or self._connect(request, submitted)
            check_metadata(connection.metadata, self.params, batched=count > 1)
            extras = list((connection.metadata.get("extras") or {}).get("keys") or ("seed",))
            left, deadline_ms = self._budget(request, submitted)
            frame = request_frame(request, image_key=self.image_key, prompt_key=self.prompt_key, extras=extras,
                                  count=count, seed=seed, deadline_ms=deadline_ms,
                                  state_key=STATE_KEY if served_state_names(connection.metadata) else None)
            started = time.monotonic()
            reply = connection.request(frame, timeout_s=left, request_id=request.request_id)
            self._observe(ok=True, round_trip_ms=(time.monotonic() - started) * 1000.0)
            return reply
        finally:
            if connection is not None:
                connection.close()

    def _serve_batched(self, request: GroupRequest, submitted: float, connection: Connection) -> EnsembleResult:
        started = time.monotonic()
        reply = self._request(request, submitted, count=request.count, seed=request.base_seed, connection=connection)
        return result_from_reply(request, reply, extra_metrics=self._metrics(started, 1),
                                 action_shape=(self.params.chunk_size, self.params.action_dim))

    def _serve_samples(self, request: GroupRequest, submitted: float, first: Connection) -> EnsembleResult:
        started = time.monotonic()
        samples: list[Any] = [None] * request.count

        def draw(i: int) -> None:
            try:
                reply = self._request(request, submitted, count=1, seed=request.seeds[i],
                                      connection=first if i == 0 else None)
                samples[i] = check_actions(reply, (self.params.chunk_size, self.params.action_dim),
                                           request.request_id, finite=False)
            except BaseException as error:  # noqa: BLE001 - named per candidate
                samples[i] = error

        threads = [threading.Thread(target=draw, args=(i,), daemon=True) for i in range(request.count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()  # each bounded by its own connect and reply timeouts
        network = next((s for s in samples if isinstance(s, RemoteEngineError)), None)
        if network is not None:
            raise network  # the network failed, not the candidates: the group fails whole with its code
        return reduce_samples(request, samples, extra_metrics=self._metrics(started, request.count),
                              reduce_before_denormalize=self.capabilities.reduce_before_denormalize)

    def _metrics(self, started: float, requests: int) -> dict[str, Any]:
        return {"remote_ms": (time.monotonic() - started) * 1000.0, "remote_requests": requests,
                "weights_version": self.weights_version}

    def _close_group(self, request_id: str) -> None:
        with self._lock:
            self._canceled.add(request_id)
            connections = list(self._open.get(request_id, ()))
        for connection in connections:
            connection.close()

    # --- health ----------------------------------------------------------------------------------------------------

    def _observe(self, *, ok: bool, round_trip_ms: float | None = None, error: str = "") -> None:
        with self._lock:
            if ok:
                self._state.update(state="connected", failures=0, last_error="")
                if round_trip_ms is not None:
                    self._state["round_trip_ms"] = round_trip_ms
            else:
                failures = int(self._state["failures"]) + 1
                self._state.update(failures=failures, last_error=error,
                                   state="unreachable" if failures >= UNREACHABLE_AFTER else "reconnecting")

    def _handshake(self) -> None:
        started = time.monotonic()
        try:
            connection = open_connection(self.url, api_key=self.api_key, timeout_s=self.timeout_s,
                                         max_reply_bytes=self.max_reply_bytes)
        except RemoteUnreachableError as error:
            self._observe(ok=False, error=str(error))
            raise
        try:
            batched = samples_per_request(connection.metadata) != 1
            check_metadata(connection.metadata, self.params, batched=batched)
            self.metadata = connection.metadata
        finally:
            connection.close()
        self._observe(ok=True, round_trip_ms=(time.monotonic() - started) * 1000.0)

    def _healthz(self) -> float:
        """``GET /healthz`` (no key needed); its round trip in ms. Raises OSError when the server does not answer."""
        parts = urlsplit(self.url)
        cls = http.client.HTTPSConnection if parts.scheme == "wss" else http.client.HTTPConnection
        conn = cls(parts.hostname, parts.port or (443 if parts.scheme == "wss" else 80), timeout=self.timeout_s)
        started = time.monotonic()
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise OSError(f"GET /healthz answered HTTP {response.status}")
        finally:
            conn.close()
        return (time.monotonic() - started) * 1000.0

    def _probe_loop(self) -> None:
        wait = PROBE_EVERY_S
        while not self._stop.wait(wait):
            was_down = self._state["state"] != "connected"
            try:
                round_trip = self._healthz()
                if was_down:
                    self._handshake()  # back: read its (maybe new) version and check it still fits
                self._observe(ok=True, round_trip_ms=round_trip)
                wait = PROBE_EVERY_S
            except (OSError, http.client.HTTPException, TrajectoryEnsembleError) as error:
                self._observe(ok=False, error=f"{type(error).__name__}: {error}")
                wait = BACKOFF_S[0] if not was_down else min(wait * 2, BACKOFF_S[1])
