"""A candidate group on the wire and back: the request frames of a group, and its result from the replies.

Batched (one request per group, :func:`result_from_reply`) or one sample per request: candidate ``i`` drawn with its
own seed and the group screened and reduced here by the engine's own completion (:func:`reduce_samples`); a failed
request is a missing candidate, and a group below its quorum fails, never a partial aggregate
(docs/remote-engine.md, "One sample per request").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..contract import EnsembleResult
from ..engine import GroupRequest
from ..engine.completion import finish_group
from ..engine.validity import to_model_space
from ..errors import RemoteSchemaError, TooFewValidCandidatesError
from ..quoting import QUOTE_CHARS, bound_text, quote_value

SERVER_ONLY_METRICS = ("continuity", "latency_estimate_ms", "encode_ahead_ms")
"""Reply metrics about the server's own session bookkeeping; the node reports its own."""


@dataclass(frozen=True)
class RemotePayload:
    """What a remote group is conditioned on (the remote engine's ``GroupRequest.payload``).

    Args:
        prompt (`str`): The instruction.
        image (`np.ndarray` of shape `[H, W, 3]`, uint8): The observation frame.
        num_inference_steps (`int`): The node's steps (the remote's must be the same; checked at the handshake).
        state (`tuple[float, ...]`, *optional*): The robot's state in the order the server's model declares
            (float64); sent only to a server whose model takes state.
    """

    prompt: str
    image: np.ndarray
    num_inference_steps: int
    state: tuple[float, ...] | None = None


def request_frame(request: GroupRequest, *, image_key: str, prompt_key: str, extras: Sequence[str],
                  count: int, seed: int, deadline_ms: float, state_key: str | None = None) -> dict[str, Any]:
    """One request of ``request``'s group: all of it (``count = N``) or one sample (``count = 1``).

    Args:
        request (`GroupRequest`): The group (payload a :class:`RemotePayload`).
        image_key (`str`), prompt_key (`str`): The schema's keys.
        extras (`Sequence[str]`): The extras the server takes (a key it does not take is not sent).
        count (`int`): Candidates this request draws. seed (`int`): Its base seed.
        deadline_ms (`float`): Milliseconds left (0 = none).
        state_key (`str`, *optional*): The key the server's model takes the state under (``None``: it takes none,
            and none is sent). The state goes as a float64 array: the bits the node picked, none lost on the way.
    """
    payload: RemotePayload = request.payload
    frame: dict[str, Any] = {image_key: payload.image, prompt_key: payload.prompt, "seed": int(seed)}
    if state_key is not None and payload.state is not None:
        frame[state_key] = np.asarray(payload.state, dtype=np.float64)
    wanted: dict[str, Any] = {
        "num_candidates": count,
        "reducer": request.spec.reducer if count == request.count else "none",
        "return_candidates": bool(request.spec.return_candidates) and count == request.count,
    }
    if deadline_ms > 0:
        wanted["deadline_ms"] = float(deadline_ms)
    if request.context is not None:
        wanted["context"] = request.context.fields()  # the context extra, as the server parses it
    frame.update({key: value for key, value in wanted.items() if key in extras})
    return frame


MAX_METRIC_TEXT = 256
"""Longest text value of a reply's metric kept (a metric is a number or a short word; the rest is dropped)."""


def _array(value: Any, name: str, shape: tuple[int, ...], request_id: str, *, finite: bool = True) -> np.ndarray:
    """A reply's float array of exactly ``shape`` (and finite, unless ``finite`` is off), else a named error."""
    if not isinstance(value, np.ndarray) or value.dtype.kind != "f":
        kind = f"dtype {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        raise RemoteSchemaError(f"request {request_id}: the reply's {name} is no float array ({kind})")
    if tuple(value.shape) != tuple(shape):
        raise RemoteSchemaError(f"request {request_id}: the reply's {name} has shape {list(value.shape)}, not the "
                                f"{list(shape)} this node's parameters give")
    if finite and not np.isfinite(value).all():
        raise RemoteSchemaError(f"request {request_id}: the reply's {name} holds NaN or Inf; a server never "
                                "returns a non-finite result")
    return value


def check_actions(reply: Mapping[str, Any], shape: tuple[int, int], request_id: str, *,
                  finite: bool = True) -> np.ndarray:
    """The ``actions`` of a reply, checked against the schema the node was configured with.

    Args:
        reply (`Mapping[str, Any]`): The decoded reply.
        shape (`tuple[int, int]`): ``(chunk_size, action_dim)``.
        request_id (`str`): For messages.
        finite (`bool`): Refuse NaN or Inf (off for one sample of a group: screening drops it, as the engine does).

    Raises:
        RemoteSchemaError: no ``actions``, not a float array, another shape, or (``finite``) NaN or Inf.
    """
    return _array(reply.get("actions"), "actions", shape, request_id, finite=finite)


def _metrics(reply: Mapping[str, Any]) -> dict[str, Any]:
    # A server's metrics are reported as they are, but only numbers and short words: they reach logs and results.
    raw = reply.get("metrics")
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and len(k) <= 64 and k not in SERVER_ONLY_METRICS
            and (isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= MAX_METRIC_TEXT))}


def result_from_reply(request: GroupRequest, reply: Mapping[str, Any], *, extra_metrics: Mapping[str, Any],
                      action_shape: tuple[int, int]) -> EnsembleResult:
    """The result of a batched group from its one reply (the server reduced it with the engine's code).

    Args:
        request (`GroupRequest`): The group asked for.
        reply (`Mapping[str, Any]`): Its decoded reply.
        extra_metrics (`Mapping[str, Any]`): Entries added to the result's metrics.
        action_shape (`tuple[int, int]`): ``(chunk_size, action_dim)``: the shape of ``actions``, and of each
            candidate.

    Raises:
        RemoteSchemaError: the reply is not the group asked for (other seeds, shapes or dtypes, NaN, or no
            candidates when asked).
    """
    rid = request.request_id
    try:
        seeds = tuple(int(s) for s in reply.get("seeds", ()))
    except (TypeError, ValueError, OverflowError):
        raise RemoteSchemaError(f"request {rid}: the reply's seeds are not a list of integers: "
                                f"{quote_value(reply.get('seeds'))}") from None
    if seeds != request.seeds:
        raise RemoteSchemaError(f"request {rid}: the remote engine drew seeds {list(seeds)[:4]}... but "
                                f"{list(request.seeds)[:4]}... were asked for (does it honour the seed extra?)")
    candidates = valid = None
    if request.spec.return_candidates:
        if "candidates" not in reply:
            raise RemoteSchemaError(f"request {rid}: return_candidates was asked but the reply has no candidates")
        # A dropped candidate may be NaN (the server screens them out and says so in valid).
        candidates = torch.from_numpy(np.array(_array(reply["candidates"], "candidates",
                                                      (request.count, *action_shape), rid, finite=False),
                                               dtype=np.float32))
        valid = tuple(bool(v) for v in np.asarray(reply.get("valid", [True] * request.count)).reshape(-1))
        if len(valid) != request.count:
            raise RemoteSchemaError(f"request {rid}: the reply's valid has {len(valid)} entries for "
                                    f"{request.count} candidates")
    metrics = _metrics(reply)
    metrics.update(extra_metrics)
    action = torch.from_numpy(np.array(check_actions(reply, action_shape, rid), dtype=np.float32))
    return EnsembleResult(group=request.group, spec=request.spec, action=action,
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
    metrics = {"remote_sample_requests": request.count, "remote_sample_requests_failed": len(failed),
               **extra_metrics}
    if failed:
        metrics["remote_sample_failures"] = _named(failed)
    try:
        return finish_group(request, candidates, reduce_before_denormalize=reduce_before_denormalize, metrics=metrics)
    except TooFewValidCandidatesError as error:
        if failed:
            named = type(error)(rid, f"{error}; failed sample requests: {_named(failed)}")
            named.counts = getattr(error, "counts", None)  # type: ignore[attr-defined] - the node reports them
            raise named from None
        raise


def _named(failed: Mapping[int, BaseException]) -> str:
    # One line per failed candidate, the whole bounded: a group may have dozens, each quoting its server.
    return bound_text("; ".join(f"candidate {i}: {type(e).__name__}: {bound_text(str(e), QUOTE_CHARS * 4)}"
                                for i, e in sorted(failed.items())))
