"""Request planning, the same for every face: a :class:`PlanRequest` in, a :class:`GoalPlan` out, before model work.

A face turns its own message into a :class:`PlanRequest` (the node's ``GenerateTrajectory`` goal in
:func:`trajectory_ensemble_node.ros.goals.goal_request`, an OpenPI request's extras in
:func:`trajectory_ensemble_node.openpi.extras.plan_request`), and :func:`plan_goal` applies the configured defaults
and every check that needs no model work, so a bad count or reducer gets the same error and text on every face.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..contract import CandidateTrajectorySpec, check_request
from ..engine.context import GUIDANCE_MODES
from ..errors import (
    DelayTooLongError,
    ExecutionContextError,
    GoalRequestError,
    NegativeDelayError,
    UnknownReducerError,
)
from ..quoting import quote_value
from ..seeding import fresh_base_seed
from .input_limits import check_name
from .params import NodeParams


@dataclass(frozen=True)
class PlanRequest:
    """What a request asks for, whatever face it came through (every field at its default = a plain request).

    Args:
        instruction (`str`): The prompt; "" = the face's default instruction.
        candidate_count (`int`): 0 = the ``candidate_count`` parameter.
        reducer (`str`): "" = the ``reducer`` parameter (``continuity_reducer`` when the request continues).
        seed (`int`, *optional*): The base seed; ``None`` = a fresh one.
        return_candidates (`bool`): The result carries every candidate.
        rollout (`bool`): Record an RL rollout.
        continue_previous (`bool`): Continue the chunk served last.
        reset_context (`bool`): Drop the remembered chunk first.
        inference_delay (`int`): Frozen actions; 0 = the latency estimate.
        guidance (`str`): Guidance mode toward the previous chunk; "" = the ``guidance_mode`` parameter.
        deadline_s (`float`): Seconds from acceptance by which the result is due; 0 = none.
        min_observation_stamp (`tuple[int, int]`, *optional*): ``(sec, nanosec)`` the frame served must be stamped at
            or after; ``None`` = the latest frame.
    """

    instruction: str = ""
    candidate_count: int = 0
    reducer: str = ""
    seed: int | None = None
    return_candidates: bool = False
    rollout: bool = False
    continue_previous: bool = False
    reset_context: bool = False
    inference_delay: int = 0
    guidance: str = ""
    deadline_s: float = 0.0
    min_observation_stamp: tuple[int, int] | None = None


@dataclass(frozen=True)
class GoalPlan:
    """A validated request: what the face will ask the engine for.

    Args:
        instruction (`str`): The prompt.
        spec (`CandidateTrajectorySpec`): Count, reducer, whether candidates come back from the engine.
        return_candidates (`bool`): Whether the *result* carries them (``~/candidates`` may want them regardless).
        base_seed (`int`): The goal's seed when ``use_seed``, else a fresh one (reported in the result either way).
        rollout (`bool`): Record an RL rollout.
        continue_previous (`bool`): Continue the chunk served last (the goal's field, or the node's default when
            the goal does not set ``reset_context``).
        reset_context (`bool`): Drop the remembered chunk before this goal.
        inference_delay (`int`): Frozen actions asked for, ``[0, chunk_size)``; 0 = the node's latency estimate.
        guidance (`str`): Guidance mode toward the previous chunk, one of ``GUIDANCE_MODES``.
        deadline_s (`float`): Seconds from acceptance by which the result must be published; 0 = none.
        min_observation_stamp_ns (`int`): Serve from a frame stamped at or after this (ns); 0 = the latest frame.
    """

    instruction: str
    spec: CandidateTrajectorySpec
    return_candidates: bool
    base_seed: int
    rollout: bool
    continue_previous: bool = False
    reset_context: bool = False
    inference_delay: int = 0
    guidance: str = "prefix"
    deadline_s: float = 0.0
    min_observation_stamp_ns: int = 0


def plan_goal(
    request: PlanRequest, params: NodeParams, *, default_instruction: str, valid_reducers: Sequence[str]
) -> GoalPlan:
    """Validate a request against the served configuration, before any model work.

    Args:
        request (`PlanRequest`): The request.
        params (`NodeParams`): The parameters (defaults, ``max_candidates``, action width, rollout folder).
        default_instruction (`str`): Used when ``request.instruction`` is empty (the node: latest ``~/instruction``,
            else the ``instruction`` parameter).
        valid_reducers (`Sequence[str]`): Reducers the model adapter declares valid for its action space.

    Raises:
        GoalRequestError: a rollout without ``rollout_dir``; ``continue_previous`` together with ``reset_context``;
            a negative deadline or ``min_observation_stamp``.
        NegativeDelayError: ``inference_delay < 0``.
        DelayTooLongError: ``inference_delay >= chunk_size``.
        ExecutionContextError: an unknown ``guidance``.
        UnknownReducerError, ExecutionContextError: a ``reducer`` or ``guidance`` longer than any name
            (:func:`~.input_limits.check_name`), quoted by its prefix.
        InvalidSpecError: and its subclasses, from :func:`~trajectory_ensemble_node.contract.check_request`
            (count above ``max_candidates``, unknown reducer, reducer not valid for this model or width, bad seed).
    """
    # Before any lookup: an unknown name is quoted in its refusal, and a client's may be megabytes long.
    check_name(request.reducer, "reducer", UnknownReducerError)
    check_name(request.guidance, "guidance", ExecutionContextError)
    base_seed = request.seed if request.seed is not None else fresh_base_seed()
    continuing, delay, guidance, deadline_s = _plan_continuity(request, params)
    reducer = request.reducer or (params.continuity_reducer if continuing and params.continuity_reducer
                                  and params.continuity_reducer in valid_reducers else params.reducer)
    spec = check_request(
        request.candidate_count or params.candidate_count,
        reducer,
        max_count=params.max_candidates,
        action_dim=params.action_dim,
        valid_reducers=valid_reducers,
        domain_name=params.domain_name,
        # ~/candidates and ~/markers draw the candidates of every goal when asked to, not only the goals' own.
        return_candidates=request.return_candidates or params.publish_candidates or params.publish_markers,
        base_seed=base_seed,
    )
    if request.rollout and not params.rollout_dir:
        raise GoalRequestError("rollout requested but the rollout_dir parameter is not set; nothing was run")
    return GoalPlan(
        instruction=request.instruction or default_instruction,
        spec=spec,
        return_candidates=request.return_candidates,
        base_seed=base_seed,
        rollout=request.rollout,
        continue_previous=continuing,
        reset_context=request.reset_context,
        inference_delay=delay,
        guidance=guidance,
        deadline_s=deadline_s,
        min_observation_stamp_ns=_min_observation_stamp_ns(request.min_observation_stamp),
    )


def _min_observation_stamp_ns(stamp: tuple[int, int] | None) -> int:
    if stamp is None:
        return 0
    sec, nanosec = stamp
    ns = int(sec) * 1_000_000_000 + int(nanosec)
    if ns < 0:
        raise GoalRequestError(f"min_observation_stamp must be >= 0 (0 = the latest frame), got {sec} s "
                               f"{nanosec} ns")
    return ns


def _plan_continuity(request: PlanRequest, params: NodeParams) -> tuple[bool, int, str, float]:
    asked, reset = request.continue_previous, request.reset_context
    if asked and reset:
        raise GoalRequestError("continue_previous and reset_context are both set; a goal continues the previous "
                               "chunk or starts fresh, not both")
    delay = request.inference_delay
    if delay < 0:
        raise NegativeDelayError(f"inference_delay must be >= 0 actions (0 = the node's estimate), got {delay}")
    if delay >= params.chunk_size:
        raise DelayTooLongError(
            f"inference_delay {delay} must be below the chunk length {params.chunk_size}: with that many frozen "
            "actions no action of the new chunk would ever execute"
        )
    guidance = request.guidance or params.guidance_mode
    if guidance not in GUIDANCE_MODES:
        raise ExecutionContextError(f"guidance must be one of {list(GUIDANCE_MODES)} or empty, got "
                                    f"{quote_value(guidance)}")
    deadline_s = request.deadline_s
    if deadline_s < 0:
        raise GoalRequestError(f"deadline must be >= 0 seconds (0 = none), got {quote_value(deadline_s)}")
    return asked or (params.continue_previous and not reset), delay, guidance, deadline_s
