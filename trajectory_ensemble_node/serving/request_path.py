"""The one request path behind every face: decide the continuity, build the group, apply the deadline rule, submit,
remember the chunk.

A face decodes its input into a :class:`~.planning.GoalPlan`, a frame and a stamp, then: :func:`decide` (continuity),
:func:`build_request` (the group, on the model's one ``CosmosActionCondition``), :func:`deadline_left` (the one rule:
counted from arrival, what is left goes to the engine, one already past is ``DeadlineUnmeetableError``),
:func:`submit`, :func:`remember`. :class:`ServedModel` is what a face serves, local or remote; a face never asks which.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from ..contract import CandidateTrajectorySpec, EnsembleResult
from ..engine import GroupHandle, GroupRequest, ProgressEvent, ValidityPolicy
from ..engine.context import ExecutionContext
from ..engine.validity import to_model_space
from ..errors import DeadlineUnmeetableError
from ..metrics import GroupCounters
from ..models.cosmos3 import policy_condition
from ..normalization import ActionNormalizer
from ..uncertainty import AlarmRule
from .continuity import CONTINUED, FRESH_REASONS, NO_PREVIOUS, ChunkMemory, ContinuityDecision, ServedChunk
from .input_limits import TokenCounter
from .params import NodeParams
from .planning import GoalPlan


class ServedModel(Protocol):
    """What a face serves, local or remote: requests in, handles out, and what the face's checks read of it.

    ``alarm``: the rule a result is ``uncertain`` by (the novelty scorer's, else ``spread`` on the threshold, else
    none); ``min_image_side``: the fewest pixels a side of a frame may have; ``count_tokens``: an instruction's token
    count by the model's tokenizer (``None`` where none runs in this process); ``remote_status``: the remote server's
    state and version for ``/diagnostics`` (``None`` in this process); ``instrument``: TEST ONLY, wrap the adapter the
    engine calls (``None`` where none runs in this process).
    """

    capabilities: Any  # uses_state, state_names, context_guidance, reduce_before_denormalize
    validity: ValidityPolicy
    uncertainty_threshold: float | None
    alarm: AlarmRule | None
    min_image_side: int
    count_tokens: TokenCounter | None

    @property
    def weights_version(self) -> int: ...

    def valid_reducers(self) -> tuple[str, ...]: ...

    def normalizer_for(self, domain_name: str) -> ActionNormalizer | None: ...

    def make_request(self, **kwargs: Any) -> GroupRequest: ...

    def check_request(self, request: GroupRequest, *, refuse_cold: bool = False) -> None: ...

    def submit_request(self, request: GroupRequest) -> GroupHandle: ...

    def wait(self, handle: GroupHandle, timeout: float | None = None) -> EnsembleResult: ...

    def measured_costs(self, *, forget: bool = False,
                       provisional: bool = False) -> tuple[float | None, float | None, float | None]: ...

    def start(self) -> None: ...

    def stop(self, timeout: float | None = 10.0) -> None: ...

    @property
    def is_alive(self) -> bool: ...

    @property
    def num_running(self) -> int: ...

    @property
    def num_queued(self) -> int: ...

    def outcome_counts(self) -> dict[str, int]: ...

    def remote_status(self) -> dict[str, Any] | None: ...

    def instrument(self, wrap: Callable[[Any], Any]) -> Any: ...


def decide(memory: ChunkMemory | None, plan: GoalPlan, *, stamp: float, weights_version: int, elapsed_s: float = 0.0,
           given: ExecutionContext | None = None, earlier: ContinuityDecision | None = None) -> ContinuityDecision:
    """How a request relates to the last chunk of its memory (the node's one robot, or a wire session).

    Args:
        memory (`ChunkMemory`, *optional*): The memory it continues (``None`` only with ``given``).
        plan (`GoalPlan`): Its plan (continue, reset, frozen actions, guidance, instruction).
        stamp (`float`): Seconds; its observation's stamp.
        weights_version (`int`): The weights it will run on.
        elapsed_s (`float`): Seconds since the stamp, now (part of what an estimated frozen count covers).
        given (`ExecutionContext`, *optional*): The context the client sent: continued as it is, no memory read.
        earlier (`ContinuityDecision`, *optional*): Its decision before it waited in a queue: why its chunk was
            dropped then is kept over ``"no previous chunk"`` now.

    Raises:
        DelayTooLongError: the plan's ``inference_delay`` runs past what is left of the previous chunk.
    """
    if given is not None:
        return ContinuityDecision(given, CONTINUED, "goal")
    assert memory is not None, "a memory, or the context the client sent"
    decision = memory.decide(continue_previous=plan.continue_previous, reset=plan.reset_context,
                             inference_delay=plan.inference_delay, guidance=plan.guidance, stamp=stamp,
                             instruction=plan.instruction, weights_version=weights_version, elapsed_s=elapsed_s)
    if earlier is not None and earlier.status in FRESH_REASONS and decision.status == NO_PREVIOUS:
        return earlier
    return decision


def deadline_left(deadline_s: float | None, since: float, *, who: str, since_what: str = "arrival") -> float | None:
    """The one deadline rule: seconds left of ``deadline_s`` counted from ``since`` (``time.monotonic()``).

    Args:
        deadline_s (`float`, *optional*): The deadline, seconds (0/``None``: none).
        since (`float`): When it started counting (a request's arrival, a goal's acceptance).
        who (`str`), since_what (`str`): How the message names the request and ``since``.

    Raises:
        DeadlineUnmeetableError: it passed before the request could be submitted.
    """
    if not deadline_s:
        return None
    waited = time.monotonic() - since
    if waited >= deadline_s:
        # Below a millisecond "0.000" would mislead: such a deadline is quoted in full, as the engine quotes it.
        shown = f"{deadline_s:.3f}" if deadline_s >= 1e-3 else f"{deadline_s:.3g}"
        raise DeadlineUnmeetableError(f"{who}: its deadline {shown} s passed before it could start "
                                      f"({waited:.3f} s after {since_what})")
    return deadline_s - waited


def condition(params: NodeParams, image: np.ndarray) -> Any:
    """The model's condition for one frame ``[H, W, 3]`` uint8 from the parameters (chunk, domain, tier, view point)."""
    return policy_condition(image, chunk_size=params.chunk_size, domain_name=params.domain_name,
                            resolution_tier=params.resolution_tier, view_point=params.view_point)


def build_request(model: ServedModel, params: NodeParams, *, prompt: str, spec: CandidateTrajectorySpec,
                  base_seed: int | None, image: np.ndarray, request_id: str, context: ExecutionContext | None,
                  deadline_s: float | None = None, state: tuple[float, ...] | None = None,
                  current_state: tuple[float, ...] | None = None, rollout: Any = None,
                  on_progress: Callable[[ProgressEvent], None] | None = None) -> GroupRequest:
    """The group a request becomes, the same on every face (the node, the OpenPI server, a fleet replica).

    Args:
        model (`ServedModel`): The model that validates and will run it.
        params (`NodeParams`): Chunk size, domain, resolution tier, view point, steps, guidance scale, fps.
        prompt (`str`): The instruction.
        spec (`CandidateTrajectorySpec`): Count, reducer, candidates returned, seed policy.
        base_seed (`int`, *optional*): The request's seed (``None``: drawn by the model).
        image (`np.ndarray` of shape `[H, W, 3]`, uint8): The observation frame.
        request_id (`str`): The group's id.
        context (`ExecutionContext`, *optional*): The chunk it continues (:func:`decide`).
        deadline_s (`float`, *optional*): Seconds left (:func:`deadline_left`).
        state (`tuple[float, ...]`, *optional*): The robot's state ``[width]``, in the order and units the model's
            state input declares (``Cosmos3ActionModel.state_input``); a model without one ignores it, bit for bit.
        current_state (`tuple[float, ...]`, *optional*): Joint positions in action units ``[action_dim]``, for the
            limits' ``max_start_jump``.
        rollout (`RolloutSpec`, *optional*): Record the group's rollout (local model only).
        on_progress (`Callable[[ProgressEvent], None]`, *optional*): Told each stage and step.

    Raises:
        TrajectoryEnsembleError: what ``make_request`` refuses (count, reducer, context, state, rollout, ...).
    """
    p = params
    return model.make_request(
        prompt=prompt, action=condition(p, image), num_inference_steps=p.num_inference_steps,
        guidance_scale=p.guidance_scale, fps=p.fps, spec=spec, base_seed=base_seed, request_id=request_id,
        rollout=rollout, on_progress=on_progress, deadline_s=deadline_s, context=context, current_state=current_state,
        state=state)


def submit(model_submit: Callable[[GroupRequest], GroupHandle], request: GroupRequest, deadline_s: float | None,
           since: float, *, who: str, since_what: str = "arrival") -> GroupHandle:
    """Submit a built request under the deadline rule (:func:`deadline_left` from ``since``: a request's arrival, a
    goal's acceptance), so the engine gets what is left of it now.

    Raises:
        DeadlineUnmeetableError: the deadline passed before submission; or what the engine refuses there.
    """
    if deadline_s:
        request.deadline_s = deadline_left(deadline_s, since, who=who, since_what=since_what)
    return model_submit(request)


def remember(memory: ChunkMemory, result: EnsembleResult, *, instruction: str, stamp: float, dt: float,
             normalizer: ActionNormalizer | None, latency_s: float | None, epoch: int | None = None) -> bool:
    """Remember a served chunk for the next continuation, in the model's space, and fold in its latency.

    Args:
        memory (`ChunkMemory`): The memory it was decided in.
        result (`EnsembleResult`): What was served (``action`` ``[H, D]``, published units).
        instruction (`str`): Its instruction. stamp (`float`): Its observation's stamp, seconds.
        dt (`float`): Seconds between actions.
        normalizer (`ActionNormalizer`, *optional*): The configured action statistics (``None``: normalized).
        latency_s (`float`, *optional*): The serving latency the frozen-count estimate takes, seconds.
        epoch (`int`, *optional*): The memory's epoch at the decision: nothing across a clock jump is kept.

    Returns:
        `bool`: whether the estimate took ``latency_s``.
    """
    action = result.action if normalizer is None else to_model_space(result.action, normalizer)
    memory.remember(ServedChunk(action.float(), stamp, dt, instruction,
                                int(GroupCounters.from_metrics(result.metrics).weights_version or 0)), epoch=epoch)
    return latency_s is not None and memory.observe_latency(latency_s, epoch=epoch)
