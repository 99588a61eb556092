"""The OpenPI face of the service: one request dict in, one group submitted, one reply dict out.

:class:`OpenPIPolicy` holds the same served model the node builds from the same parameters and takes a request
through :meth:`~OpenPIPolicy.prepare` (checks without the model, on the event loop), :meth:`~OpenPIPolicy.build` (on
the one build thread: continuity, the group, its conditioning encoded ahead) and :meth:`~OpenPIPolicy.submit`, down
the serving layer's one request path. The reply's fields: docs/openpi.md, "The wire". No websockets, no rclpy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from ..catalog import model_notice
from ..contract import EnsembleResult, check_count, reducers_for_width
from ..engine import GroupHandle, GroupRequest
from ..engine.deadline import StepsReport
from ..metrics import wire_metrics
from ..models.cosmos3 import Cosmos3ActionModel
from ..normalization import STAT_KEYS
from ..serving import model_factory
from ..serving import params as node_params
from ..serving.continuity import ContinuityDecision
from ..serving.faults import FaultInjector
from ..serving.input_limits import InputLimits, TokenCounter, check_instruction
from ..serving.planning import GoalPlan
from ..serving.request_path import build_request, deadline_left, decide, remember, submit
from ..uncertainty import UncertaintyReport
from ..wire.schemas import STATE_KEY, ObservationSchema, ParsedObservation, get_schema
from .extras import EXTRA_KEYS, RequestExtras, parse_extras, plan_request
from .sessions import Caller, SessionKey, SessionStore, session_key

SERVER_NAME = "trajectory_ensemble"


@dataclass
class Job:
    """One request on its way through the service.

    Args:
        request_id (`str`): The group's id (``openpi-<connection>-<n>``).
        session (`SessionKey`): The session it continues and is remembered in (its caller's).
        extras (`RequestExtras`), plan (`GoalPlan`), observation (`ParsedObservation`): The checked request.
        arrival (`float`): ``time.monotonic()`` when it arrived.
        stamp (`float`): Its time for alignment: the request's ``stamp``, else ``arrival``.
    """

    request_id: str
    session: SessionKey
    extras: RequestExtras
    plan: GoalPlan
    observation: ParsedObservation
    arrival: float
    stamp: float
    decision: ContinuityDecision | None = None
    request: GroupRequest | None = None
    encode_ms: float = 0.0
    handle: GroupHandle | None = None


class Backend(Protocol):
    """Where a built group runs: :class:`LocalBackend` (this process's engine) or the fleet's replicas
    (``trajectory_ensemble_node.fleet``)."""

    encodes_ahead: bool
    """Whether :meth:`OpenPIPolicy.build` encodes the conditioning on this process's model (the local engine then
    finds it done); a remote backend's replica encodes it itself."""

    def start(self) -> None: ...

    def stop(self, timeout: float) -> None: ...

    def submit(self, job: Job) -> GroupHandle: ...


class LocalBackend:
    """The group runs in this process's engine (``serve-openpi``).

    Args:
        model (`Cosmos3ActionModel`): The model whose engine runs the groups.
    """

    encodes_ahead = True

    def __init__(self, model: Cosmos3ActionModel) -> None:
        self.model = model

    def start(self) -> None:
        self.model.start()

    def stop(self, timeout: float) -> None:
        self.model.stop(timeout)

    def submit(self, job: Job) -> GroupHandle:
        assert job.request is not None, "build() first"
        return self.model.submit_request(job.request)


class OpenPIPolicy:
    """Serve OpenPI requests from one model with the node's rules.

    Args:
        model (`Cosmos3ActionModel`): The service; its engine is started by :meth:`start`.
        params (`NodeParams`): The configuration (the node's parameters).
        notice (`str`): What the weights are (``catalog.model_notice``), sent in the metadata.
        schema (`ObservationSchema`, *optional*): Defaults to ``params.openpi_schema``.
        count_tokens (`TokenCounter`, *optional*): The pipeline's token counter (``max_instruction_tokens``);
            defaults to the model's tokenizer.
        backend (`Backend`, *optional*): Where built groups run; defaults to :class:`LocalBackend` on ``model``.
    """

    def __init__(self, model: Cosmos3ActionModel, params: node_params.NodeParams, *, notice: str,
                 schema: ObservationSchema | None = None, count_tokens: TokenCounter | None = None,
                 backend: Backend | None = None) -> None:
        self.model = model
        self.backend: Backend = backend if backend is not None else LocalBackend(model)
        self.params = params
        self.notice = notice
        # A checkpoint that declares a state input makes observation/state a required key of its width.
        state_input = model.state_input
        self.schema = (schema or get_schema(params.openpi_schema)).for_model(
            state_input.names if state_input is not None else ())
        self.limits = InputLimits(params.max_instruction_chars, params.max_instruction_tokens,
                                  params.max_image_bytes, params.max_image_pixels, model.min_image_side)
        self.count_tokens = count_tokens if count_tokens is not None else model.count_tokens
        self.sessions = SessionStore()
        # Only a test run (TRAJECTORY_ENSEMBLE_TESTING=1) wraps the adapter, by the node's rule.
        self.faults: FaultInjector | None = model_factory.fault_hook(model)

    @classmethod
    def from_params(cls, params: node_params.NodeParams) -> OpenPIPolicy:
        """Load the model ``params`` names and wrap it (the engine is not started yet)."""
        schema = get_schema(params.openpi_schema)  # refused before the model is loaded
        return cls(model_factory.build_model(params), params, notice=model_notice(params.model), schema=schema)

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the backend (the local engine's thread)."""
        self.backend.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the backend; groups still running end with ``EngineShutdownError``."""
        self.backend.stop(timeout)

    # --- the wire's content ----------------------------------------------------------------------------------------

    def metadata(self, limits: dict[str, Any] | None = None) -> dict[str, Any]:
        """The dict sent first on every connection: model, action shape, ``dt``, schema, extras and limits.

        Args:
            limits (`dict[str, Any]`, *optional*): The server's own limits, added as ``limits``.
        """
        p = self.params
        units = "robot units" if self.model.normalizer_for(p.domain_name) is not None else "normalized [-1, 1]"
        return {
            "server": SERVER_NAME,
            "model": p.model,
            "weights": self.notice,
            "weights_version": int(self.model.weights_version),
            "embodiment": p.domain_name,
            "action_shape": [p.chunk_size, p.action_dim],
            "action_horizon": p.chunk_size,
            "action_dim": p.action_dim,
            "dt": p.dt,
            "fps": p.fps,
            "action_units": units,
            "observation_schema": self.schema.describe(),
            **self._state_advertised(),
            "extras": {
                "keys": list(EXTRA_KEYS),
                "num_candidates": {"default": p.candidate_count, "max": self.samples_per_request},
                "reducer": {"default": p.reducer, "continuity_default": p.continuity_reducer,
                            "valid": list(reducers_for_width(self.model.valid_reducers(), p.action_dim))},
                "num_inference_steps": p.num_inference_steps,
            },
            "limits": dict(limits or {}),
            # vLLM-Omni's handshake fields, for its clients.
            "policy_server_config": {**self.schema.server_config, "needs_session_id": False,
                                     "action_space": p.domain_name, **self._samples_advertised()},
        }

    @property
    def samples_per_request(self) -> int:
        """Most candidates one request may draw: ``openpi_samples_per_request``, else ``max_candidates``."""
        return min(self.params.openpi_samples_per_request or self.params.max_candidates, self.params.max_candidates)

    def _state_advertised(self) -> dict[str, Any]:
        # Only for a model that takes state: the handshake of a model without one keeps its bytes.
        state_input = self.model.state_input
        if state_input is None:
            return {}
        stats = state_input.normalizer.stats
        low, high = (stats[key] for key in STAT_KEYS[state_input.normalizer.method])
        return {"state": {"key": STATE_KEY, "width": state_input.width, "names": list(state_input.names),
                          "range": [[float(v) for v in low], [float(v) for v in high]], "out_of_range": "clipped"}}

    def _samples_advertised(self) -> dict[str, int]:
        # Only when set: the handshake of a server that leaves it at 0 keeps its bytes.
        return {"samples_per_request": self.samples_per_request} if self.params.openpi_samples_per_request else {}

    def prepare(self, obs: dict[str, Any], *, request_id: str, caller: Caller, arrival: float) -> Job:
        """Check one decoded request, before any model work.

        Args:
            obs (`dict[str, Any]`): The request.
            request_id (`str`): The group id to use.
            caller (`Caller`): Who sent it: its sessions are looked up in this caller's namespace only.
            arrival (`float`): ``time.monotonic()`` at arrival.

        Raises:
            TrajectoryEnsembleError: a named error (schema, instruction length, extras, count, reducer, ...).
        """
        extras = parse_extras(obs)
        observation = self.schema.parse(obs, extras=EXTRA_KEYS, limits=self.limits)
        # Size limits first: O(1) on characters, so a hostile prompt costs nothing further (tokens: in build).
        check_instruction(observation.prompt, self.limits, None, source="prompt")
        plan = plan_request(extras, observation.prompt, self.params, default_instruction=self.params.instruction,
                            valid_reducers=self.model.valid_reducers())
        if self.params.openpi_samples_per_request:
            check_count(plan.spec.count, self.samples_per_request)  # the count error, at this server's own cap
        session = session_key(caller, extras.session_id, extras.session_scope)
        stamp = extras.stamp if extras.stamp is not None else arrival
        return Job(request_id, session, extras, plan, observation, arrival, stamp)

    def reset(self, obs: dict[str, Any], *, caller: Caller) -> dict[str, Any]:
        """``{"endpoint": "reset"}``: drop the caller's session's chunk; the reply says whether there was one.

        ``had_chunk`` is about the caller's own namespace: a name another owner uses answers ``False``, exactly as a
        name never used.
        """
        extras = parse_extras(obs)
        session = session_key(caller, extras.session_id, extras.session_scope)
        return {"reset": True, "session_id": extras.session_id, "had_chunk": self.sessions.reset(session)}

    def build(self, job: Job) -> None:
        """Count the prompt's tokens, decide continuity, build the group as the node builds a goal's, and encode its
        conditioning ahead. Blocking: the server runs it on its build thread.

        Raises:
            TrajectoryEnsembleError: too many tokens, a context this request cannot continue, ...
        """
        plan = job.plan
        check_instruction(job.observation.prompt, self.limits, self.count_tokens, source="prompt")
        # The client's own chunk (the context extra) is continued as it is; else the session's, by the node's rules.
        memory = None if job.extras.context is not None else self.sessions.memory(job.session)
        job.decision = decide(memory, plan, stamp=job.stamp, weights_version=self.model.weights_version,
                              given=job.extras.context)
        # A passed deadline, and one the measured costs cannot meet, are refused here, before the encode.
        request = build_request(self.model, self.params, prompt=plan.instruction, spec=plan.spec,
                                base_seed=plan.base_seed, image=job.observation.image, request_id=job.request_id,
                                context=job.decision.context,
                                deadline_s=deadline_left(plan.deadline_s, job.arrival, who=f"request {job.request_id}"),
                                state=job.observation.model_state)
        if plan.deadline_s:
            self.model.check_request(request)
        if self.backend.encodes_ahead:
            started = time.perf_counter()
            with torch.no_grad():
                self.model.adapter.encode(request.payload)
            job.encode_ms = (time.perf_counter() - started) * 1000.0
        job.request = request

    def submit(self, job: Job) -> GroupHandle:
        """Queue the built group in the backend's engine (its deadline, if any, counted from the request's arrival).

        Raises:
            TrajectoryEnsembleError: a deadline no step can meet, ...
        """
        assert job.request is not None, "build() first"
        job.handle = submit(lambda _: self.backend.submit(job), job.request, job.plan.deadline_s, job.arrival,
                            who=f"request {job.request_id}")
        return job.handle

    def reply(self, job: Job, result: EnsembleResult) -> dict[str, Any]:
        """The reply dict for a finished group; remembers the chunk in the job's session."""
        memory = self.sessions.memory(job.session)
        remember(memory, result, instruction=job.plan.instruction, stamp=job.stamp, dt=self.params.dt,
                 normalizer=self.model.normalizer_for(self.params.domain_name),
                 latency_s=time.monotonic() - job.arrival)
        estimate = memory.estimator.estimate
        metrics = wire_metrics(result.metrics)
        uncertainty = UncertaintyReport.from_metrics(result.metrics)
        status = job.decision.status if job.decision is not None else ""
        metrics["continuity"] = status
        metrics["latency_estimate_ms"] = None if estimate is None else estimate * 1000.0
        metrics["encode_ahead_ms"] = job.encode_ms
        actions = result.action.detach().cpu().numpy().astype(np.float32)
        reply: dict[str, Any] = {
            "actions": actions,
            "action": actions,
            "base_seed": int(result.base_seed),
            "seeds": [int(s) for s in result.seeds],
            "metrics": metrics,
            "uncertain": uncertainty.uncertain,
            # Observation novelty (novelty_scorer_file), as the node's result.uncertainty carries it; None without.
            "novelty_score": uncertainty.novelty_score,
            "novel": uncertainty.novel,
            "uncertainty_rule": uncertainty.rule,
            "steps_used": StepsReport.from_metrics(result.metrics).used,
            "continuity": status,
            "session_id": job.extras.session_id,
        }
        if job.plan.return_candidates and result.candidates is not None:
            reply["candidates"] = result.candidates.detach().cpu().numpy().astype(np.float32)
            valid = result.candidate_valid or (True,) * result.candidates.shape[0]
            reply["valid"] = np.asarray(valid, dtype=bool)
        return reply
