"""The execution context: what a new action chunk must continue (ROS-free, model-free).

A robot executes chunks back to back and the next chunk is computed while the current one runs. With an inference
delay of ``d`` control steps, the first ``d`` actions of the new chunk execute before it arrives, so they are
*frozen*: they must equal the previous chunk's actions at the same times. Alignment is by time: a chunk starts at
its observation's stamp, and action ``k`` of the new chunk lines up with action ``k + shift`` of the previous one,
``shift = round((stamp - previous_stamp) / dt)``.

Per-action weights over the new chunk (Real-Time Chunking, Black et al. 2025, "exp" schedule): 1 for the ``d``
frozen actions, then an exponentially decaying ramp to 0 across the rest of the overlap, then 0 where the previous
chunk has no action at that time. Guidance and continuity-aware selection both use these weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import DelayTooLongError, ExecutionContextError, NegativeDelayError

GUIDANCE_MODES = ("prefix", "mask", "vjp", "none")
"""How a model honours a context while denoising.

``"prefix"`` (default): gradient-free prefix guidance, the weighted part of each candidate's predicted clean action
is pulled to the previous chunk at every step. ``"mask"``: the frozen actions are conditioned through the model's
action-conditioning mask (clean tokens, velocity 0), the rest of the overlap guided as in ``"prefix"``. ``"vjp"``:
RTC's guidance, the weighted gap pulled back through the model with a vector-Jacobian product. ``"none"``: no
guidance (the context only informs continuity-aware selection).
"""

DEFAULT_MAX_GUIDANCE_WEIGHT = 5.0
"""RTC's cap on the VJP guidance weight ``min(c / r^2, cap)`` (the reference implementation's value)."""


def _finite_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ExecutionContextError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def overlap_weights(frozen: int, overlap: int, horizon: int) -> torch.Tensor:
    """RTC's "exp" prefix weights ``[horizon]``: 1 on ``[0, frozen)``, a decaying ramp on ``[frozen, overlap)``, 0 after.

    Ramp: ``u = clip((frozen - 1 - k) / (overlap - frozen + 1) + 1, 0, 1)``, weight ``u * expm1(u) / (e - 1)``; it
    starts below 1 right after the frozen actions and reaches 0 at ``overlap``.

    Args:
        frozen (`int`): Frozen count ``d``, ``0 <= d <= overlap``.
        overlap (`int`): New-chunk actions that have a previous-chunk action at the same time.
        horizon (`int`): New chunk length ``H``.

    Returns:
        `torch.Tensor` of shape `[horizon]`, float32.
    """
    k = torch.arange(horizon, dtype=torch.float64)
    end = min(overlap, horizon)
    start = min(frozen, end)
    u = ((start - 1 - k) / (end - start + 1) + 1).clamp(0.0, 1.0)
    w = u * torch.expm1(u) / (math.e - 1)
    w = torch.where(k < start, torch.ones_like(w), w)
    w = torch.where(k >= end, torch.zeros_like(w), w)
    return w.float()


@dataclass(frozen=True)
class ExecutionContext:
    """The chunk being executed, and how a new chunk must continue it.

    Args:
        previous (`torch.Tensor` of shape `[H_prev, D]`): The executing chunk in the model's normalized action space
            (float, finite, on any device; stored as float32 CPU).
        previous_stamp (`float`): Seconds; the stamp of the observation the previous chunk was planned from (its
            action 0 is the state one ``dt`` after it).
        dt (`float`): Seconds between actions, ``> 0``.
        frozen (`int`): ``d``, the new chunk's actions that execute before it can take over; ``0 <= d < H_prev``.
        stamp (`float`): Seconds; the new observation's stamp, ``>= previous_stamp``.
        guidance (`str`): One of :data:`GUIDANCE_MODES`.
        max_guidance_weight (`float`): Cap of the VJP guidance weight (``"vjp"`` only), ``> 0``.

    Raises:
        NegativeDelayError: ``frozen < 0``.
        DelayTooLongError: ``frozen >= H_prev``, or the frozen actions run past the previous chunk at this shift.
        ExecutionContextError: any other malformed field (shape, non-finite, ``dt <= 0``, stamp before the previous
            one, unknown guidance mode).
    """

    previous: torch.Tensor
    previous_stamp: float
    dt: float
    frozen: int
    stamp: float
    guidance: str = "prefix"
    max_guidance_weight: float = DEFAULT_MAX_GUIDANCE_WEIGHT

    def __post_init__(self) -> None:
        previous = self.previous
        if not isinstance(previous, torch.Tensor) or not previous.is_floating_point():
            raise ExecutionContextError(f"previous must be a floating torch.Tensor [H, D], got {previous!r}")
        if previous.ndim != 2 or min(previous.shape) < 1:
            raise ExecutionContextError(f"previous must have shape [H, D] with H, D >= 1, got {tuple(previous.shape)}")
        if not bool(torch.isfinite(previous).all()):
            raise ExecutionContextError("previous chunk holds NaN or Inf")
        object.__setattr__(self, "previous", previous.detach().to("cpu", torch.float32).clone())
        _finite_number("previous_stamp", self.previous_stamp)
        _finite_number("stamp", self.stamp)
        if _finite_number("dt", self.dt) <= 0:
            raise ExecutionContextError(f"dt must be > 0 seconds, got {self.dt!r}")
        if self.stamp < self.previous_stamp:
            raise ExecutionContextError(
                f"stamp {self.stamp!r} is before the previous chunk's stamp {self.previous_stamp!r}"
            )
        if isinstance(self.frozen, bool) or not isinstance(self.frozen, int):
            raise ExecutionContextError(f"frozen must be an int, got {self.frozen!r}")
        if self.frozen < 0:
            raise NegativeDelayError(f"frozen count (inference delay) must be >= 0, got {self.frozen}")
        if self.frozen >= self.horizon_previous:
            raise DelayTooLongError(
                f"frozen count {self.frozen} must be below the chunk length {self.horizon_previous}"
            )
        if self.frozen > self.overlap:
            raise DelayTooLongError(
                f"frozen count {self.frozen} runs past the previous chunk: only {self.overlap} of its actions are "
                f"left at shift {self.shift}"
            )
        if self.guidance not in GUIDANCE_MODES:
            raise ExecutionContextError(f"guidance must be one of {GUIDANCE_MODES}, got {self.guidance!r}")
        if _finite_number("max_guidance_weight", self.max_guidance_weight) <= 0:
            raise ExecutionContextError(f"max_guidance_weight must be > 0, got {self.max_guidance_weight!r}")

    @classmethod
    def from_latency(cls, previous: torch.Tensor, previous_stamp: float, dt: float, stamp: float,
                     estimator: LatencyEstimator, **kwargs) -> ExecutionContext:
        """A context whose frozen count is the estimator's latency divided by ``dt``, rounded up."""
        return cls(previous, previous_stamp, dt, estimator.frozen_steps(dt), stamp, **kwargs)

    @property
    def horizon_previous(self) -> int:
        return int(self.previous.shape[0])

    @property
    def width(self) -> int:
        return int(self.previous.shape[1])

    @property
    def shift(self) -> int:
        """New action ``k`` lines up with previous action ``k + shift``."""
        return int(round((self.stamp - self.previous_stamp) / self.dt))

    @property
    def overlap(self) -> int:
        """How many new actions have a previous action at the same time (0 once the previous chunk has elapsed)."""
        return max(self.horizon_previous - self.shift, 0)

    def check(self, horizon: int, width: int) -> None:
        """Refuse a context that cannot continue a new chunk ``[horizon, width]``.

        Raises:
            ExecutionContextError: the width differs from the previous chunk's.
            DelayTooLongError: ``frozen >= horizon``.
        """
        if width != self.width:
            raise ExecutionContextError(
                f"previous chunk has width {self.width}, but the model's actions have width {width}"
            )
        if self.frozen >= horizon:
            raise DelayTooLongError(f"frozen count {self.frozen} must be below the chunk length {horizon}")

    def weights(self, horizon: int) -> torch.Tensor:
        """Per-action weights ``[horizon]`` of the new chunk (see :func:`overlap_weights`)."""
        return overlap_weights(self.frozen, self.overlap, horizon)

    def target(self, horizon: int) -> torch.Tensor:
        """The previous actions at the new chunk's times, ``[horizon, D]`` float32; zeros where there are none."""
        out = torch.zeros(horizon, self.width)
        count = min(self.overlap, horizon)
        if count > 0:
            out[:count] = self.previous[self.shift : self.shift + count]
        return out

    def seam_jump(self, chunk: torch.Tensor) -> float:
        """Distance between the new chunk's first action after the frozen ones and the previous chunk's action at
        the same time (normalized units).

        Past the previous chunk's last action the comparison is with that last action: a trajectory controller holds
        a trajectory's last point once it has run out (the JointTrajectoryController does, and so does
        ``trajectory-ensemble sim``), so that is where the robot would be sent without the new chunk. It happens when
        the frozen actions take up the whole overlap (a latency estimate as long as what is left of the chunk).

        Args:
            chunk (`torch.Tensor` of shape `[H, D]`): The new chunk, in the model's normalized space, ``H > frozen``.
        """
        k = self.frozen
        if k >= int(chunk.shape[0]):
            raise DelayTooLongError(f"frozen count {k} must be below the chunk length {int(chunk.shape[0])}")
        held = self.previous[min(self.shift + k, self.horizon_previous - 1)]
        return float(torch.linalg.vector_norm(chunk[k].detach().cpu().float() - held))

    def metrics(self, chunk: torch.Tensor) -> dict[str, float | int | str]:
        """What a result reports about the context: frozen count, shift, overlap, guidance mode and seam jump."""
        return {
            "context_frozen": self.frozen,
            "context_shift": self.shift,
            "context_overlap": self.overlap,
            "context_guidance": self.guidance,
            "seam_jump": self.seam_jump(chunk),
        }


class LatencyEstimator:
    """A running estimate of goal-to-result latency, for a frozen count the node does not get from its goals.

    Exponential moving average of the observed latencies, plus ``margin`` standard deviations (also a moving
    estimate), so an occasional slow group does not leave frozen actions unaccounted for.

    Args:
        alpha (`float`): Weight of the newest observation, ``0 < alpha <= 1``.
        margin (`float`): Standard deviations added to the mean, ``>= 0``.
        initial (`float`, *optional*): Seconds assumed before the first observation.
    """

    def __init__(self, alpha: float = 0.2, margin: float = 1.0, initial: float | None = None) -> None:
        if not 0 < _finite_number("alpha", alpha) <= 1:
            raise ExecutionContextError(f"alpha must be in (0, 1], got {alpha!r}")
        if _finite_number("margin", margin) < 0:
            raise ExecutionContextError(f"margin must be >= 0, got {margin!r}")
        self.alpha, self.margin = float(alpha), float(margin)
        self._mean: float | None = None if initial is None else _finite_number("initial", initial)
        self._var = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        """Fold one measured goal-to-result latency (seconds, finite, ``>= 0``) into the estimate."""
        if _finite_number("latency", seconds) < 0:
            raise NegativeDelayError(f"latency must be >= 0 seconds, got {seconds!r}")
        if self._mean is None or self.count == 0:
            self._mean, self._var = float(seconds), 0.0
        else:
            delta = seconds - self._mean
            self._mean += self.alpha * delta
            self._var = (1 - self.alpha) * (self._var + self.alpha * delta * delta)
        self.count += 1

    @property
    def estimate(self) -> float | None:
        """Seconds (mean + margin * std), or ``None`` before any observation or initial value."""
        if self._mean is None:
            return None
        return self._mean + self.margin * math.sqrt(self._var)

    def frozen_steps(self, dt: float) -> int:
        """``ceil(estimate / dt)``: actions that execute before a result arrives (0 with no estimate)."""
        if _finite_number("dt", dt) <= 0:
            raise ExecutionContextError(f"dt must be > 0 seconds, got {dt!r}")
        estimate = self.estimate
        if estimate is None:
            return 0
        # A latency of exactly k * dt must give k, not k + 1, despite float noise in the division.
        return max(int(math.ceil(estimate / dt - 1e-9)), 0)
