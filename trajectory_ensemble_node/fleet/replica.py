"""The engine replica: one model, its engine started, serving the group descriptions the ingress routes to it.

Up to ``max_ongoing_requests`` descriptions at once become groups of the one engine, co-batched; a canceled Serve
request cancels its group. The replica holds no session (each request brings its continuity context), so any replica
continues any session (docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from typing import Any

import torch

from ..contract import EnsembleResult
from ..engine import GroupHandle
from ..errors import AbortReason, TrajectoryEnsembleError
from ..serving import model_factory
from ..serving import params as node_params
from .protocol import REPLICA_ACTOR, REPLICA_ID, REPLICA_PID, error_payload, request_from_description, result_payload


class EngineReplica:
    """One model and its engine, as a Ray Serve deployment's replica (wrapped by :func:`.app.engine_deployment`).

    Args:
        raw_params (`dict[str, Any]`): The node's parameters as read from the params file (validated here with the
            node's own table, so every replica serves what ``serve-openpi`` would with that file).
    """

    def __init__(self, raw_params: dict[str, Any]) -> None:
        import ray
        from ray import serve

        self.params = node_params.validate(raw_params)
        self.model = model_factory.build_model(self.params)
        # Only a test run (TRAJECTORY_ENSEMBLE_TESTING=1) wraps the adapter (step pacing), by the node's rule.
        self.faults = model_factory.fault_hook(self.model)
        self.model.start()
        # One thread encodes the conditioning ahead, in arrival order, while the engine denoises the others.
        self._encoder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="replica-encode")
        # Requests canceled while their conditioning was encoded: they end canceled without reaching the engine.
        self._canceled_before_engine = 0
        self.identity = {REPLICA_PID: os.getpid(), REPLICA_ID: serve.get_replica_context().replica_id.unique_id,
                         REPLICA_ACTOR: ray.get_runtime_context().get_actor_name()}

    def _encode(self, request: Any) -> None:
        with torch.no_grad():
            self.model.adapter.encode(request.payload)

    async def __call__(self, description: dict[str, Any]) -> dict[str, Any]:
        """Serve one group description (:func:`.protocol.describe`).

        Returns:
            `dict[str, Any]`: :func:`.protocol.result_payload` or :func:`.protocol.error_payload`.
        """
        loop = asyncio.get_running_loop()
        try:
            request = request_from_description(self.model, self.params, description)
            await loop.run_in_executor(self._encoder, self._encode, request)
            handle = self.model.submit_request(request)
        except TrajectoryEnsembleError as error:
            return error_payload(error)
        except asyncio.CancelledError:
            self._canceled_before_engine += 1
            raise
        ended: asyncio.Future[None] = loop.create_future()

        def on_end(_: GroupHandle) -> None:
            loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(None))

        handle.add_done_callback(on_end)
        try:
            await ended
        except asyncio.CancelledError:
            handle.cancel(AbortReason.CANCELED, f"request {handle.request_id} was canceled at the ingress")
            raise
        try:
            result: EnsembleResult = handle.result(timeout=0)
        except Exception as error:  # noqa: BLE001 - named or not, it goes back as a payload, never a traceback
            return error_payload(error)
        return result_payload(result, self.identity)

    def identify(self) -> dict[str, Any]:
        """Who this replica is (:data:`.protocol.REPLICA_PID`, ``REPLICA_ID``, ``REPLICA_ACTOR``) and how its groups
        ended so far (``outcomes``: the engine's ``outcome_counts()``, with the requests canceled before their group
        reached the engine counted ``canceled``), and ``in_engine``: its groups queued or running now."""
        outcomes = self.model.outcome_counts()
        if self._canceled_before_engine:
            outcomes["canceled"] = outcomes.get("canceled", 0) + self._canceled_before_engine
        return {**self.identity, "outcomes": outcomes, "in_engine": self.model.num_queued + self.model.num_running}

    def pace(self, step_delay_s: float) -> dict[str, Any]:
        """TEST ONLY: sleep ``step_delay_s`` before every physical forward from now on (the node's test-run pacing,
        :mod:`~trajectory_ensemble_node.serving.faults`), so a test lands a kill while groups are in this replica.

        Raises:
            RuntimeError: not a test run (``TRAJECTORY_ENSEMBLE_TESTING=1``): production replicas carry no hook.
        """
        if self.faults is None:
            raise RuntimeError("pace() needs a test run (TRAJECTORY_ENSEMBLE_TESTING=1)")
        self.faults.step_delay_s = float(step_delay_s)
        return self.identify()

    def check_health(self) -> None:
        """Ray Serve's health check: a replica whose engine thread died is restarted.

        Raises:
            RuntimeError: the engine thread is not running.
        """
        if not self.model.is_alive:
            raise RuntimeError("the engine thread is not running")

    def __del__(self) -> None:
        model = getattr(self, "model", None)
        if model is not None:
            model.stop(1.0)
