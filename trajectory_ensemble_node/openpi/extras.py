"""The per-request extras of an OpenPI request, checked by the same rule as a ROS goal's fields.

The extras and their defaults are in docs/openpi.md, "Per-request extras". Types are checked here; values go through
:func:`~trajectory_ensemble_node.serving.planning.plan_goal`, so a bad count or reducer gets the same error and text
over the wire as in a goal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.context import DEFAULT_MAX_GUIDANCE_WEIGHT, ExecutionContext
from ..errors import ExecutionContextError, GoalRequestError, InvalidSpecError
from ..quoting import quote_value
from ..serving.params import NodeParams
from ..serving.planning import GoalPlan, PlanRequest, plan_goal

EXTRA_KEYS = ("num_candidates", "reducer", "seed", "return_candidates", "deadline_ms", "session_id",
              "continue_previous", "inference_delay", "stamp", "endpoint", "session_scope", "guidance",
              "context")
"""Request keys that are not observation keys."""
ENDPOINTS = ("infer", "reset")
SESSION_SCOPES = ("connection", "key")
"""``connection``: a session private to its connection (the default); ``key``: shared by the key's connections."""
MAX_SESSION_ID_CHARS = 256
CONTEXT_KEYS = ("previous", "previous_stamp", "stamp", "dt", "frozen", "guidance", "max_guidance_weight")
"""Keys of the ``context`` extra; the last two are optional."""


@dataclass(frozen=True)
class RequestExtras:
    """The extras of one request, type-checked (values not yet checked against the configuration).

    Args:
        endpoint (`str`): ``"infer"`` or ``"reset"``.
        num_candidates (`int`): 0 = the ``candidate_count`` parameter.
        reducer (`str`): "" = the configured default.
        seed (`int`, *optional*): The base seed, when the request brings one.
        return_candidates (`bool`): Send every candidate and its validity back.
        deadline_ms (`float`): 0 = none.
        session_id (`str`, *optional*): The session continued and remembered; ``None`` = the connection's own.
        continue_previous (`bool`): Continue the session's last served chunk.
        inference_delay (`int`): Frozen actions; 0 = the session's latency estimate.
        stamp (`float`, *optional*): The observation's time (seconds); ``None`` = arrival time.
        session_scope (`str`): ``"connection"`` or ``"key"`` (:data:`SESSION_SCOPES`).
        guidance (`str`): Guidance toward the previous chunk ("" = the ``guidance_mode`` parameter).
        context (`ExecutionContext`, *optional*): The chunk the request brings to continue (``context`` extra).
    """

    endpoint: str = "infer"
    num_candidates: int = 0
    reducer: str = ""
    seed: int | None = None
    return_candidates: bool = False
    deadline_ms: float = 0.0
    session_id: str | None = None
    continue_previous: bool = False
    inference_delay: int = 0
    stamp: float | None = None
    session_scope: str = "connection"
    guidance: str = ""
    context: ExecutionContext | None = None


def _int(obs: Mapping[str, Any], key: str, error: type[Exception], default: int = 0) -> int:
    value = obs.get(key, default)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise error(f"{key} must be an integer, got {quote_value(value, typed=True)}")
    return int(value)


def _bool(obs: Mapping[str, Any], key: str, error: type[Exception]) -> bool:
    value = obs.get(key, False)
    if not isinstance(value, (bool, np.bool_)):
        raise error(f"{key} must be true or false, got {quote_value(value, typed=True)}")
    return bool(value)


def _number(obs: Mapping[str, Any], key: str) -> float | None:
    value = obs.get(key)
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise GoalRequestError(f"{key} must be a number, got {quote_value(value, typed=True)}")
    if not np.isfinite(float(value)):
        raise GoalRequestError(f"{key} must be finite, got {quote_value(value)}")
    return float(value)


def _text(obs: Mapping[str, Any], key: str, error: type[Exception], default: str | None) -> str | None:
    value = obs.get(key, default)
    if value is None or value is default:
        return value
    if not isinstance(value, str):
        raise error(f"{key} must be a string, got {quote_value(value, typed=True)}")
    return value


def parse_context(value: Any) -> ExecutionContext:
    """The ``context`` extra as an :class:`ExecutionContext` (its own checks name what is wrong in it).

    Raises:
        ExecutionContextError: not a map, an unknown or missing key, ``previous`` not a 2-D float array, a field of
            the wrong type; and the context's own errors (``NegativeDelayError``, ``DelayTooLongError``, ...).
    """
    if not isinstance(value, Mapping):
        raise ExecutionContextError(f"context must be a map of {list(CONTEXT_KEYS)}, got {type(value).__name__}")
    unknown = sorted(set(value) - set(CONTEXT_KEYS), key=str)
    missing = [key for key in CONTEXT_KEYS[:5] if key not in value]
    if unknown or missing:
        raise ExecutionContextError(f"context keys: unknown {quote_value(unknown)}, missing {missing}; expected "
                                    f"{list(CONTEXT_KEYS)}")
    previous = value["previous"]
    if not isinstance(previous, np.ndarray) or previous.dtype.kind != "f" or previous.ndim != 2:
        kind = f"array {previous.dtype} {list(previous.shape)}" if isinstance(previous, np.ndarray) else \
            type(previous).__name__
        raise ExecutionContextError(f"context previous must be a 2-D float array [H_prev, D], got {kind}")
    frozen = value["frozen"]
    if isinstance(frozen, (bool, np.bool_)) or not isinstance(frozen, (int, np.integer)):
        raise ExecutionContextError(f"context frozen must be an integer, got {quote_value(frozen, typed=True)}")
    guidance = value.get("guidance", "prefix")
    if not isinstance(guidance, str):
        raise ExecutionContextError(f"context guidance must be a string, got {type(guidance).__name__}")

    def number(key: str, default: float | None = None) -> Any:
        # Numbers pass as floats; anything else goes as it is, for the context's own check to name.
        got = value.get(key, default)
        return float(got) if isinstance(got, (int, float, np.integer, np.floating)) and not isinstance(
            got, (bool, np.bool_)) else got

    return ExecutionContext.from_fields({
        "previous": previous, "previous_stamp": number("previous_stamp"), "dt": number("dt"), "frozen": int(frozen),
        "stamp": number("stamp"), "guidance": guidance,
        "max_guidance_weight": number("max_guidance_weight", DEFAULT_MAX_GUIDANCE_WEIGHT)})


def parse_extras(obs: Mapping[str, Any]) -> RequestExtras:
    """Type-check the extras of one decoded request.

    Raises:
        InvalidSpecError: ``num_candidates``, ``reducer``, ``seed`` or ``return_candidates`` of the wrong type.
        GoalRequestError: another extra of the wrong type, an unknown ``endpoint`` or ``session_scope``, a session
            id too long, or ``context`` with ``continue_previous``.
        ExecutionContextError: a malformed ``context`` (and its subclasses, :func:`parse_context`).
    """
    endpoint = _text(obs, "endpoint", GoalRequestError, "infer")
    if endpoint not in ENDPOINTS:
        raise GoalRequestError(f"endpoint must be one of {list(ENDPOINTS)}, got {quote_value(endpoint)}")
    session_id = _text(obs, "session_id", GoalRequestError, None) or None  # "" = no session named
    if session_id is not None and len(session_id) > MAX_SESSION_ID_CHARS:
        raise GoalRequestError(f"session_id must have at most {MAX_SESSION_ID_CHARS} characters, got "
                               f"{quote_value(session_id)}")
    scope = _text(obs, "session_scope", GoalRequestError, "connection")
    if scope not in SESSION_SCOPES:
        raise GoalRequestError(f"session_scope must be one of {list(SESSION_SCOPES)}, got {quote_value(scope)}")
    seed = None if obs.get("seed") is None else _int(obs, "seed", InvalidSpecError)
    deadline_ms = _number(obs, "deadline_ms") or 0.0
    if deadline_ms < 0:
        raise GoalRequestError(f"deadline_ms must be >= 0 (0 = none), got {quote_value(deadline_ms)}")
    continue_previous = _bool(obs, "continue_previous", GoalRequestError)
    context = None if obs.get("context") is None else parse_context(obs["context"])
    if context is not None and continue_previous:
        raise GoalRequestError("context and continue_previous: true cannot be combined; a request brings the chunk "
                               "it continues, or continues its session's")
    return RequestExtras(
        endpoint=str(endpoint),
        num_candidates=_int(obs, "num_candidates", InvalidSpecError),
        reducer=_text(obs, "reducer", InvalidSpecError, "") or "",
        seed=seed,
        return_candidates=_bool(obs, "return_candidates", InvalidSpecError),
        deadline_ms=deadline_ms,
        session_id=session_id,
        continue_previous=continue_previous,
        inference_delay=_int(obs, "inference_delay", GoalRequestError),
        stamp=_number(obs, "stamp"),
        session_scope=str(scope),
        guidance=_text(obs, "guidance", GoalRequestError, "") or "",
        context=context,
    )


def plan_request(extras: RequestExtras, prompt: str, params: NodeParams, *, default_instruction: str,
                 valid_reducers: Sequence[str]) -> GoalPlan:
    """The request as the goal the node would plan for it: defaults applied, every check before model work done.

    Args:
        extras (`RequestExtras`): The request's extras.
        prompt (`str`): Its prompt ("" = ``default_instruction``).
        params (`NodeParams`): The served configuration.
        default_instruction (`str`): The ``instruction`` parameter.
        valid_reducers (`Sequence[str]`): The model's declared reducers.

    Raises:
        InvalidSpecError: and its subclasses, from ``check_request`` (count, reducer, seed).
        NegativeDelayError, DelayTooLongError, GoalRequestError: as for a goal.
    """
    deadline_s = extras.deadline_ms / 1000.0
    request = PlanRequest(
        instruction=prompt, candidate_count=extras.num_candidates, reducer=extras.reducer, seed=extras.seed,
        return_candidates=extras.return_candidates, continue_previous=extras.continue_previous,
        inference_delay=extras.inference_delay, guidance=extras.guidance,
        # The seconds a goal's Duration(sec, nanosec) gives, bit for bit: a goal of the same deadline plans the same.
        # nanosec unrounded: rounding made 1e-9 ms a 0 s deadline, which means none (check_deadline's rule).
        deadline_s=float(int(deadline_s)) + float((deadline_s % 1) * 1e9) * 1e-9,
    )
    return plan_goal(request, params, default_instruction=default_instruction, valid_reducers=valid_reducers)
