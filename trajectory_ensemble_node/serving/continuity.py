"""The node's memory of the chunk it served last, and the rules for continuing it.

When the remembered chunk is dropped (each reason a ``continuity.status`` string) and how the frozen count is
estimated: docs/closed-loop.md, "In the node". Works on stamps of the node's ROS clock, never the host's wall clock;
no rclpy. Continuity's other homes: :mod:`~trajectory_ensemble_node.engine.context` (the value type and alignment),
:mod:`~trajectory_ensemble_node.reducers.continuity` (selection),
:mod:`~trajectory_ensemble_node.models.cosmos3.guidance` (guided denoising).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch

from ..engine.context import ExecutionContext, LatencyEstimator, fractional_shift, overlap_count

CONTINUED = "continued"
NOT_REQUESTED = "not requested"
RESET_REQUESTED = "reset requested"
NO_PREVIOUS = "no previous chunk"
ELAPSED = "previous chunk elapsed"
WEIGHTS_UPDATED = "weights updated"
INSTRUCTION_CHANGED = "instruction changed"
OLDER_OBSERVATION = "observation older than the previous chunk"
CLOCK_JUMPED_BACK = "clock jumped back"
FRESH_REASONS = (RESET_REQUESTED, NO_PREVIOUS, ELAPSED, WEIGHTS_UPDATED, INSTRUCTION_CHANGED, OLDER_OBSERVATION,
                 CLOCK_JUMPED_BACK)
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
        latency_s (`float`, *optional*): With ``"estimate"``: the latency the frozen count covers, seconds (what had
            gone since the stamp + the serving estimate), before the cap at what is left of the previous chunk.
    """

    context: ExecutionContext | None
    status: str
    delay_source: str = ""
    latency_s: float | None = None


class ChunkMemory:
    """The last chunk served, the latency estimate its frozen counts come from, and the drop rules.

    Thread-safe: goals are decided on the action server's threads and remembered on their execute threads.

    Args:
        estimator (`LatencyEstimator`, *optional*): Serving latency, decision to publication (node clock seconds).
    """

    def __init__(self, estimator: LatencyEstimator | None = None) -> None:
        self.estimator = estimator or LatencyEstimator()
        self._lock = threading.Lock()
        self._last: ServedChunk | None = None
        self._dropped_because: str | None = None
        self._epoch = 0

    @property
    def last(self) -> ServedChunk | None:
        with self._lock:
            return self._last

    @property
    def epoch(self) -> int:
        """Clock jumps so far; a goal keeps the value of its decision (see :meth:`remember`)."""
        with self._lock:
            return self._epoch

    def remember(self, chunk: ServedChunk, epoch: int | None = None) -> bool:
        """Record the chunk just published (the next continuation continues this one).

        Args:
            chunk (`ServedChunk`): What was published.
            epoch (`int`, *optional*): :attr:`epoch` when its goal was decided; a chunk from before a clock jump is
                not remembered (it belongs to the old time line).

        Returns:
            `bool`: whether it was remembered.
        """
        with self._lock:
            if epoch is not None and epoch != self._epoch:
                return False
            self._last, self._dropped_because = chunk, None
            return True

    def drop(self, reason: str | None = None) -> bool:
        """Forget the remembered chunk; True when there was one.

        Args:
            reason (`str`, *optional*): One of :data:`FRESH_REASONS`; the next continuation reports it (until a chunk
                is remembered again) instead of ``"no previous chunk"``.
        """
        with self._lock:
            had, self._last = self._last is not None, None
            if reason is not None:
                self._dropped_because = reason
            return had

    def clock_jumped(self, backward: bool) -> bool:
        """The node's clock jumped: start a new epoch; back, drop the chunk; forward, reset the latency estimate.

        Returns:
            `bool`: whether a chunk was dropped.
        """
        with self._lock:
            self._epoch += 1
            if not backward:
                self.estimator.reset()
                return False
            had, self._last, self._dropped_because = self._last is not None, None, CLOCK_JUMPED_BACK
            return had

    def observe_latency(self, seconds: float, epoch: int | None = None) -> bool:
        """Fold one goal's serving latency (seconds of the node's clock) into the frozen-count estimate.

        Args:
            seconds (`float`): Decision to publication (negative or non-finite ones are ignored).
            epoch (`int`, *optional*): :attr:`epoch` at the goal's decision; a latency across a clock jump is ignored.

        Returns:
            `bool`: whether the estimate took it (False also when the estimator's outlier gate refused it).
        """
        with self._lock:
            if not math.isfinite(seconds) or seconds < 0 or (epoch is not None and epoch != self._epoch):
                return False
            return self.estimator.observe(seconds)

    def decide(self, *, continue_previous: bool, reset: bool, inference_delay: int, guidance: str, stamp: float,
               instruction: str, weights_version: int, elapsed_s: float = 0.0) -> ContinuityDecision:
        """The context for a goal, or the reason it starts fresh.

        Args:
            continue_previous (`bool`): The goal continues the previous chunk (after the node's default applied).
            reset (`bool`): The goal asked to drop the remembered chunk.
            inference_delay (`int`): Frozen actions from the goal; 0 = from the latency estimate.
            guidance (`str`): Guidance mode.
            stamp (`float`): Seconds; the new observation's stamp.
            instruction (`str`): The goal's instruction.
            weights_version (`int`): The weights the goal will run on.
            elapsed_s (`float`): Seconds since the observation's stamp, now (part of the latency the frozen count
                covers when ``inference_delay`` is 0).

        Raises:
            DelayTooLongError: the goal's ``inference_delay`` runs past what is left of the previous chunk.
        """
        with self._lock:
            if reset:
                self._last, self._dropped_because = None, None
                return ContinuityDecision(None, RESET_REQUESTED)
            if not continue_previous:
                return ContinuityDecision(None, NOT_REQUESTED)
            last = self._last
            if last is None:
                return ContinuityDecision(None, self._dropped_because or NO_PREVIOUS)
            horizon = int(last.action.shape[0])
            # The alignment ExecutionContext uses: new action k lines up with old position k + shift.
            overlap = overlap_count(horizon, fractional_shift(last.stamp, stamp, last.dt))
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
                self._last, self._dropped_because = None, None
                return ContinuityDecision(None, reason)
            latency = None
            if inference_delay:
                frozen, source = inference_delay, "goal"
            else:
                # An estimate past the previous chunk's end means the robot will have run out of actions before the
                # result arrives; freeze what is left rather than refuse the goal.
                latency = max(elapsed_s, 0.0) + (self.estimator.estimate or 0.0)
                frozen = self.estimator.frozen_steps(last.dt, elapsed_s=elapsed_s)
                frozen, source = min(frozen, overlap, horizon - 1), "estimate"
        context = ExecutionContext(last.action, last.stamp, last.dt, frozen, stamp, guidance=guidance)
        return ContinuityDecision(context, CONTINUED, source, latency)
