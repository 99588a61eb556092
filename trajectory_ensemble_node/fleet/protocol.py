"""What travels between the ingress and an engine replica: plain, picklable dicts, no ray import.

A group goes out as a *description* (:func:`describe`) and the replica rebuilds the very group the ingress built
(:func:`request_from_description`, through the same ``build_request``), so its bits are the local engine's. A reply
comes back as a *payload*: the result's tensors as numpy with its metrics, or a named error's class, code and message
(never a traceback), turned back by :func:`result_from_payload` / :func:`error_from_payload`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..contract import CandidateTrajectorySpec, EnsembleResult
from ..engine import GroupRequest
from ..engine.context import ExecutionContext
from ..errors import ErrorCode, TrajectoryEnsembleError, rebuild_error
from ..models.cosmos3 import Cosmos3ActionModel
from ..openpi.policy import Job
from ..serving.params import NodeParams
from ..serving.request_path import build_request

REPLICA_PID = "replica_pid"
"""Metrics key: the process id of the replica that served the group (the ingress's replies carry it)."""
REPLICA_ID = "replica_id"
"""Metrics key: the Serve replica's id (``serve.get_replica_context().replica_id.unique_id``)."""
REPLICA_ACTOR = "replica_actor"
"""Metrics key: the replica's actor name in the ``serve`` namespace (what ``ray.get_actor`` takes)."""


def _plain(value: Any) -> bool:
    if isinstance(value, (bool, int, float, str)) or value is None:
        return True
    return isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float, str)) or v is None
                                                    for v in value)


def describe(job: Job) -> dict[str, Any]:
    """The plain description of a built job's group.

    Args:
        job (`Job`): Built (:meth:`OpenPIPolicy.build`): its request is set.

    Returns:
        `dict[str, Any]`: ``prompt``, ``image`` ``[H, W, 3]`` uint8, ``state`` (a tuple of floats in the model's
        declared order, or ``None`` for a model without a state input), ``spec`` (count, reducer, return_candidates,
        seed_policy, max_count), ``base_seed``, ``deadline_s``, ``context`` (the ExecutionContext's fields with
        ``previous`` ``[H, D]`` as numpy, or ``None``) and ``request_id``.
    """
    request = job.request
    assert request is not None, "build() first"
    spec = request.spec
    context = request.context  # what the group was built with, however the ingress decided it
    return {
        "prompt": job.plan.instruction,
        "image": np.ascontiguousarray(job.observation.image, dtype=np.uint8),
        "state": job.observation.model_state,
        "spec": {"count": spec.count, "reducer": spec.reducer, "return_candidates": spec.return_candidates,
                 "seed_policy": spec.seed_policy, "max_count": spec.max_count},
        "base_seed": int(request.base_seed),
        "deadline_s": request.deadline_s,
        "context": None if context is None else context.fields(),
        "request_id": request.request_id,
    }


def request_from_description(model: Cosmos3ActionModel, params: NodeParams, description: dict[str, Any]) \
        -> GroupRequest:
    """The group a description stands for, built on the replica's model exactly as the ingress built it.

    Raises:
        TrajectoryEnsembleError: what ``make_request`` refuses.
    """
    spec = CandidateTrajectorySpec(**description["spec"])
    fields = description["context"]
    context = None if fields is None else ExecutionContext.from_fields(fields)
    request = build_request(model, params, prompt=description["prompt"], spec=spec,
                            base_seed=description["base_seed"], image=np.array(description["image"]),
                            request_id=description["request_id"], context=context, state=description["state"])
    if description["deadline_s"]:
        request.deadline_s = description["deadline_s"]
    return request


def result_payload(result: EnsembleResult, replica: dict[str, Any]) -> dict[str, Any]:
    """A finished group as the replica sends it back.

    Args:
        result (`EnsembleResult`): The engine's result.
        replica (`dict[str, Any]`): Who served it (:data:`REPLICA_PID`, :data:`REPLICA_ID`, :data:`REPLICA_ACTOR`),
            added to the metrics.

    Returns:
        `dict[str, Any]`: ``action`` ``[H, D]``, ``candidates`` ``[N, H, D]`` or ``None`` (numpy, their dtypes
        kept), ``candidate_valid``, ``seeds``, ``base_seed`` and ``metrics`` (the plain ones: tensors stay behind).
    """
    return {
        "action": result.action.detach().cpu().numpy(),
        "candidates": None if result.candidates is None else result.candidates.detach().cpu().numpy(),
        "candidate_valid": None if result.candidate_valid is None else tuple(bool(v) for v in result.candidate_valid),
        "seeds": tuple(int(s) for s in result.seeds),
        "base_seed": int(result.base_seed if result.base_seed is not None else result.seeds[0]),
        "metrics": {**{k: v for k, v in result.metrics.items() if _plain(v)}, **replica},
    }


def result_from_payload(request: GroupRequest, payload: dict[str, Any]) -> EnsembleResult:
    """The :class:`EnsembleResult` a replica's payload holds, for the ingress's request.

    Raises:
        PartialGroupError: the payload does not describe the whole group.
    """
    candidates = payload["candidates"]
    return EnsembleResult(
        group=request.group, spec=request.spec, action=torch.from_numpy(np.array(payload["action"])),
        candidate_ids=request.group.candidate_ids, seeds=tuple(payload["seeds"]), metrics=dict(payload["metrics"]),
        candidates=None if candidates is None else torch.from_numpy(np.array(candidates)),
        base_seed=payload["base_seed"], candidate_valid=payload["candidate_valid"],
    )


def error_payload(error: BaseException) -> dict[str, Any]:
    """A failed group as the replica sends it back: ``{"error": {"type", "code", "message"}}``, never a traceback.
    Anything but a named error is reported without detail, as the wire does."""
    if isinstance(error, TrajectoryEnsembleError):
        return {"error": {"type": type(error).__name__, "code": int(error.code), "message": str(error)}}
    return {"error": {"type": "InternalError", "code": int(ErrorCode.ENGINE_FAILURE), "message": ""}}


def error_from_payload(payload: dict[str, Any], request_id: str = "") -> BaseException:
    """The named error a replica reported, rebuilt as the same class with the same message (so the ingress's error
    frame is the one ``serve-openpi`` sends); an unnamed failure is a plain ``RuntimeError`` (the wire's
    ``InternalError`` frame)."""
    info = payload["error"]
    code = info.get("code")
    error = rebuild_error(str(info.get("type")), str(info.get("message", "")), code=code,
                          request_id=request_id) if isinstance(code, int) else None
    return error if error is not None else RuntimeError("the replica failed")
