"""A candidate group on the wire and back: the request frames of a group, and its result from the replies.

Two ways to serve a group remotely:

- **batched** (a server that draws a whole group per request, ``serve-openpi``): one request carries the count, the
  reducer, the base seed, the deadline and the continuity context; the reply's reduced action, candidates, seeds and
  metrics become the :class:`~..contract.EnsembleResult` as they are (:func:`result_from_reply`);
- **one sample per request** (vLLM-Omni's route, or ``openpi_samples_per_request: 1``): candidate ``i`` is drawn by
  its own request with ``seed = candidate_seeds(base_seed, N)[i]`` (a count of 1 draws its seed as its only
  candidate, so it is the candidate ``i`` of the batched group), and the group is screened and reduced here with the
  engine's own code (:func:`reduce_samples`: ``screen_candidates``, ``reduce_candidates``, ``check_reduced``). A
  request that failed is a candidate that is not there (NaN, which screening always drops) and is named; a group
  below its ``min_valid_candidates`` quorum fails with the quorum's error, never a partial aggregate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..contract import EnsembleResult
from ..engine import GroupRequest
from ..engine.context import ExecutionContext
from ..engine.reduction import reduce_candidates
from ..engine.validity import DEFAULT_CHECK, check_reduced, screen_candidates, to_model_space, validity_counts
from ..errors import RemoteSchemaError, TooFewValidCandidatesError
from ..uncertainty import group_uncertainty

SERVER_ONLY_METRICS = ("continuity", "latency_estimate_ms", "encode_ahead_ms")
"""Reply metrics about the server's own session bookkeeping; the node reports its own."""


@dataclass(frozen=True)
class RemotePayload:
    """What a remote group is conditioned on (the remote engine's ``GroupRequest.payload``).

    Args:
        prompt (`str`): The instruction.
        image (`np.ndarray` of shape `[H, W, 3]`, uint8): The observation frame.
        num_inference_steps (`int`): The node's steps (the remote's must be the same; checked at the handshake).
    """

    prompt: str
    image: np.ndarray
    num_inference_steps: int


def context_extra(context: ExecutionContext) -> dict[str, Any]:
    """The ``context`` extra of a request continuing ``context`` (see :mod:`..openpi.extras`): its fields."""
    return context.fields()


def request_frame(request: GroupRequest, *, image_key: str, prompt_key: str, extras: Sequence[str],
                  count: int, seed: int, deadline_ms: float) -> dict[str, Any]:
    """One request of ``request``'s group: all of it (``count = N``) or one sample (``count = 1``).

    Args:
        request (`GroupRequest`): The group (payload a :class:`RemotePayload`).
        image_key (`str`), prompt_key (`str`): The schema's keys.
        extras (`Sequence[str]`): The extras the server takes (a key it does not take is not sent).
        count (`int`): Candidates this request draws. seed (`int`): Its base seed.
        deadline_ms (`float`): Milliseconds left (0 = none).
    """
    payload: RemotePayload = request.payload
    frame: dict[str, Any] = {image_key: payload.image, prompt_key: payload.prompt, "seed": int(seed)}
    wanted: dict[str, Any] = {
        "num_candidates": count,
        "reducer": request.spec.reducer if count == request.count else "none",
        "return_candidates": bool(request.spec.return_candidates) and count == request.count,
    }
    if deadline_ms > 0:
        wanted["deadline_ms"] = float(deadline_ms)
    if request.context is not None:
        wanted["context"] = context_extra(request.context)
    frame.update({key: value for key, value in wanted.items() if key in extras})
    return frame


def _tensor(value: Any, name: str, request_id: str) -> torch.Tensor:
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        raise RemoteSchemaError(f"request {request_id}: the reply's {name} is no float array: {type(value).__name__}")
    return torch.from_numpy(np.array(value, dtype=np.float32))


def result_from_reply(request: GroupRequest, reply: Mapping[str, Any], *, extra_metrics: Mapping[str, Any]
                      ) -> EnsembleResult:
    """The result of a batched group from its one reply (the server reduced it with the engine's code).

    Raises:
        RemoteSchemaError: the reply is not the group asked for (other seeds, shapes, or no candidates when asked).
    """
    rid = request.request_id
    seeds = tuple(int(s) for s in reply.get("seeds", ()))
    if seeds != request.seeds:
        raise RemoteSchemaError(f"request {rid}: the remote engine drew seeds {list(seeds)[:4]}... but "
                                f"{list(request.seeds)[:4]}... were asked for (does it honour the seed extra?)")
    candidates = valid = None
    if request.spec.return_candidates:
        if "candidates" not in reply:
            raise RemoteSchemaError(f"request {rid}: return_candidates was asked but the reply has no candidates")
        candidates = _tensor(reply["candidates"], "candidates", rid)
        valid = tuple(bool(v) for v in np.asarray(reply.get("valid", [True] * request.count)).reshape(-1))
    metrics = {k: v for k, v in dict(reply.get("metrics") or {}).items() if k not in SERVER_ONLY_METRICS}
    metrics.update(extra_metrics)
    return EnsembleResult(group=request.group, spec=request.spec, action=_tensor(reply.get("actions"), "actions", rid),
                          candidate_ids=request.group.candidate_ids, seeds=request.seeds, metrics=metrics,
                          candidates=candidates, base_seed=request.base_seed, candidate_valid=valid)


def reduce_samples(request: GroupRequest, samples: Sequence[np.ndarray | BaseException], *,
                   extra_metrics: Mapping[str, Any], reduce_before_denormalize: bool = True) -> EnsembleResult:
    """The result of a group drawn one sample per request, screened and reduced here as the engine does.

    Args:
        request (`GroupRequest`): The group.
        samples (`Sequence[np.ndarray | BaseException]`): Per candidate, its reply's action ``[H, D]`` (published
            units) or the error its request ended with.
        extra_metrics (`Mapping[str, Any]`): Entries added to the result's metrics.
        reduce_before_denormalize (`bool`): The model's declared space for ``"any"`` reducers (Cosmos 3: True).

    Raises:
        TooFewValidCandidatesError: fewer than the quorum passed (failed requests named in the message).
        ReducedTrajectoryInvalidError: the reduced trajectory broke a limit.
    """
    rid = request.request_id
    failed = {i: s for i, s in enumerate(samples) if isinstance(s, BaseException)}
    shape = next((np.asarray(s).shape for s in samples if not isinstance(s, BaseException)), None)
    rows = []
    for sample in samples:
        if isinstance(sample, BaseException) or shape is None:
            rows.append(torch.full(shape or (1, 1), float("nan")))
        else:
            rows.append(torch.from_numpy(np.array(sample, dtype=np.float32)))
    if shape is None:
        raise TooFewValidCandidatesError(rid, f"every one of the {request.count} sample requests failed: "
                                              f"{_named(failed)}")
    published = torch.stack(rows)
    # The engine screens model-space candidates; a reply is in published units.
    normalizer = request.normalizer
    candidates = published if normalizer is None else to_model_space(published, normalizer)
    check = request.validity or DEFAULT_CHECK
    try:
        screening = screen_candidates(candidates, normalizer, check, rid)
    except TooFewValidCandidatesError as error:
        if failed:
            named = type(error)(rid, f"{error}; failed sample requests: {_named(failed)}")
            named.counts = getattr(error, "counts", None)  # type: ignore[attr-defined] - the node reports them
            raise named from None
        raise
    action, reduced_raw = reduce_candidates(screening.survivors, request.spec, request.reducer, normalizer,
                                            reduce_before_denormalize=reduce_before_denormalize,
                                            context=request.context)
    candidates_out = reduced_raw if screening.raw is None else screening.raw
    if request.reducer is None and screening.raw is not None:
        action = screening.raw[0].clone()
    action, action_clamped = check_reduced(action, check, rid)
    reports: list[Any] = [validity_counts(screening.report, action_clamped)]
    if request.context is not None:
        model_action = action if normalizer is None else to_model_space(action, normalizer)
        reports.append(request.context.report(model_action))
    reports.append(group_uncertainty(screening.survivors, request.uncertainty_threshold, None, None))
    metrics = {"remote_sample_requests": request.count, "remote_sample_requests_failed": len(failed),
               **extra_metrics}
    if failed:
        metrics["remote_sample_failures"] = _named(failed)
    return EnsembleResult(
        group=request.group, spec=request.spec, action=action.float().cpu(),
        candidate_ids=request.group.candidate_ids, seeds=request.seeds,
        candidates=candidates_out.float().cpu() if request.spec.return_candidates else None,
        base_seed=request.base_seed, candidate_valid=screening.valid, verdicts=screening.report.verdicts,
        reports=tuple(reports), metrics=metrics)


def _named(failed: Mapping[int, BaseException]) -> str:
    return "; ".join(f"candidate {i}: {type(e).__name__}: {e}" for i, e in sorted(failed.items()))
