"""The node's memory of the chunk it served last, and the rules for continuing it.

A robot executes one chunk while the next is computed. A goal with ``continue_previous`` (or any goal, with the
parameter of that name) is served with an :class:`~trajectory_ensemble_node.engine.context.ExecutionContext` built
from the chunk this node published last, so its candidates are guided toward the actions that execute before the
new chunk can take over.

The remembered chunk is dropped, and the goal starts fresh with the reason in its result (``continuity.status``)
and in the log, when:

- the goal sets ``reset_context`` (``"reset requested"``);
- nothing was served yet, or the last goal failed after a drop (``"no previous chunk"``);
- the previous chunk has fully elapsed at the new observation's stamp (``"previous chunk elapsed"``);
- the weights changed since (``"weights updated"``): the old chunk came from another policy;
- the instruction changed (``"instruction changed"``): the old chunk served another task;
- the new observation is older than the previous one (``"observation older than the previous chunk"``), e.g. a
  bag replayed from its start again.

A continuation request with nothing to continue is not an error. Everything here works on stamps (seconds of the
node's ROS clock: simulated time under ``use_sim_time``), never on the host's wall clock. Nothing here imports rclpy.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ..engine.context import ExecutionContext, LatencyEstimator

CONTINUED = "continued"
NOT_REQUESTED = "not requested"
RESET_REQUESTED = "reset requested"
NO_PREVIOUS = "no previous chunk"
ELAPSED = "previous chunk elapsed"
WEIGHTS_UPDATED = "weights updated"
INSTRUCTION_CHANGED = "instruction changed"
OLDER_OBSERVATION = "observation older than the previous chunk"
FRESH_REASONS = (RESET_REQUESTED, NO_PREVIOUS, ELAPSED, WEIGHTS_UPDATED, INSTRUCTION_CHANGED, OLDER_OBSERVATION)
"""Every reason a continuation request starts fresh (``continuity.status`` in the result)."""


@dataclass(frozen=True)
class ServedChunk:
    """A chunk the node published.

    Args:
        action (`torch.Tensor` of shape `[H, D]`): The reduced trajectory in the model's normalized space.
        stamp (`float`): Seconds; its observation's stamp (action ``k`` executes at ``stamp + (k + 1) * dt``).
        dt (`float`): Seconds between actions.
        instruction (`str`): The instruction it was served for.
        weights_version (`int`): The weights that produced it.
    """

    action: torch.Tensor
    stamp: float
    dt: float
    instruction: str
    weights_version: int


@dataclass(frozen=True)
class ContinuityDecision:
    """How one goal relates to the previous chunk.

    Args:
        context (`ExecutionContext`, *optional*): What the goal continues; ``None`` when it starts fresh.
        status (`str`): :data:`CONTINUED`, :data:`NOT_REQUESTED` or one of :data:`FRESH_REASONS`.
        delay_source (`str`): ``"goal"`` (its ``inference_delay``), ``"estimate"`` (measured latency) or ``""``.
    """

    context: ExecutionContext | None
    status: str
    delay_source: str = ""


class ChunkMemory:
    """The last chunk served, the latency estimate its frozen counts come from, and the drop rules.

    Thread-safe: goals are decided on the action server's threads and remembered on their execute threads.

    Args:
        estimator (`LatencyEstimator`, *optional*): Goal-to-result latency (seconds of the node's clock).
    """

    def __init__(self, estimator: LatencyEstimator | None = None) -> None:
        self.estimator = estimator or LatencyEstimator()
        self._lock = threading.Lock()
        self._last: ServedChunk | None = None

    @property
    def last(self) -> ServedChunk | None:
        with self._lock:
            return self._last

    def remember(self, chunk: ServedChunk) -> None:
        """Record the chunk just published (the next continuation continues this one)."""
        with self._lock:
            self._last = chunk

    def drop(self) -> bool:
        """Forget the remembered chunk; True when there was one."""
        with self._lock:
            had, self._last = self._last is not None, None
            return had

    def observe_latency(self, seconds: float) -> None:
        """Fold one goal's acceptance-to-result time (node clock) into the frozen-count estimate."""
        if seconds >= 0:
            with self._lock:
                self.estimator.observe(seconds)

    def decide(self, *, continue_previous: bool, reset: bool, inference_delay: int, guidance: str, stamp: float,
               instruction: str, weights_version: int) -> ContinuityDecision:
        """The context for a goal, or the reason it starts fresh.

        Args:
            continue_previous (`bool`): The goal continues the previous chunk (after the node's default applied).
            reset (`bool`): The goal asked to drop the remembered chunk.
            inference_delay (`int`): Frozen actions from the goal; 0 = from the latency estimate.
            guidance (`str`): Guidance mode.
            stamp (`float`): Seconds; the new observation's stamp.
            instruction (`str`): The goal's instruction.
            weights_version (`int`): The weights the goal will run on.

        Raises:
            DelayTooLongError: the goal's ``inference_delay`` runs past what is left of the previous chunk.
        """
        with self._lock:
            if reset:
                self._last = None
                return ContinuityDecision(None, RESET_REQUESTED)
            if not continue_previous:
                return ContinuityDecision(None, NOT_REQUESTED)
            last = self._last
            if last is None:
                return ContinuityDecision(None, NO_PREVIOUS)
            horizon = int(last.action.shape[0])
            # The same alignment ExecutionContext.shift uses: new action k lines up with old action k + shift.
            overlap = horizon - round((stamp - last.stamp) / last.dt)
            reason = None
            if last.weights_version != weights_version:
                reason = WEIGHTS_UPDATED
            elif last.instruction != instruction:
                reason = INSTRUCTION_CHANGED
            elif stamp < last.stamp:
                reason = OLDER_OBSERVATION
            elif overlap <= 0:
                reason = ELAPSED
            if reason is not None:
                self._last = None
                return ContinuityDecision(None, reason)
            if inference_delay:
                frozen, source = inference_delay, "goal"
            else:
                # An estimate past the previous chunk's end means the robot will have run out of actions before the
                # result arrives; freeze what is left rather than refuse the goal.
                frozen, source = min(self.estimator.frozen_steps(last.dt), overlap, horizon - 1), "estimate"
        context = ExecutionContext(last.action, last.stamp, last.dt, frozen, stamp, guidance=guidance)
        return ContinuityDecision(context, CONTINUED, source)
