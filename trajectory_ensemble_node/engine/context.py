"""The execution context: what a new action chunk must continue (ROS-free, model-free).

Time alignment (``shift = (stamp - previous_stamp) / dt``, fractional shifts interpolated) and the per-action weights
(1 on the frozen actions, RTC's exponential ramp, then 0) are defined in docs/closed-loop.md. Continuity's other
homes are listed in :mod:`trajectory_ensemble_node.serving.continuity`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
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
ON_GRID_TOLERANCE = 1e-6
"""A shift within this many ``dt`` of a whole number is that number: float seconds carry rounding noise
(``(200.2 - 200.0) / 0.1`` is 2.0000000000000284), and on-grid stamps must read the previous actions exactly."""


def _finite_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ExecutionContextError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def fractional_shift(previous_stamp: float, stamp: float, dt: float) -> float:
    """``(stamp - previous_stamp) / dt``, snapped to the nearest whole number within :data:`ON_GRID_TOLERANCE`.

    Args:
        previous_stamp (`float`): Seconds; the previous chunk's observation stamp.
        stamp (`float`): Seconds; the new observation's stamp.
        dt (`float`): Seconds between actions, ``> 0``.
    """
    shift = (stamp - previous_stamp) / dt
    nearest = round(shift)
    return float(nearest) if abs(shift - nearest) <= ON_GRID_TOLERANCE else float(shift)


def overlap_count(horizon_previous: int, shift: float) -> int:
    """New actions ``k`` with a previous action at or after their time: ``k + shift <= horizon_previous - 1``.

    Args:
        horizon_previous (`int`): The previous chunk's length.
        shift (`float`): :func:`fractional_shift`, ``>= 0``.
    """
    return max(math.floor(horizon_previous - shift), 0)


def resample(previous: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``previous`` ``[H, D]`` at fractional row ``positions`` ``[K]``, linearly interpolated, ``[K, D]``.

    Positions are clamped to ``[0, H - 1]`` (past the last action a controller holds it). Whole positions read the
    rows exactly.
    """
    last = int(previous.shape[0]) - 1
    positions = positions.to(torch.float64).clamp(0.0, float(last))
    low = positions.floor().long()
    high = torch.clamp(low + 1, max=last)
    frac = (positions - low.to(torch.float64)).to(previous.dtype)[:, None]
    out = previous[low] + frac * (previous[high] - previous[low])
    whole = frac[:, 0] == 0
    out[whole] = previous[low[whole]]  # exact, whatever the float noise of the line above
    return out


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
            action 0 is the state one ``dt`` after it). ``stamp - previous_stamp`` need not be a multiple of ``dt``.
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
                f"left at shift {self.offset:g}"
            )
        if self.guidance not in GUIDANCE_MODES:
            raise ExecutionContextError(f"guidance must be one of {GUIDANCE_MODES}, got {self.guidance!r}")
        if _finite_number("max_guidance_weight", self.max_guidance_weight) <= 0:
            raise ExecutionContextError(f"max_guidance_weight must be > 0, got {self.max_guidance_weight!r}")

    def fields(self) -> dict[str, Any]:
        """The context as plain values, for another process (an OpenPI ``context`` extra, a Serve replica):
        ``previous`` as a float32 ``np.ndarray`` ``[H_prev, D]``, every other field as it is. :meth:`from_fields`
        rebuilds it, bit for bit."""
        return {"previous": self.previous.numpy().astype(np.float32), "previous_stamp": float(self.previous_stamp),
                "stamp": float(self.stamp), "dt": float(self.dt), "frozen": int(self.frozen), "guidance": self.guidance,
                "max_guidance_weight": float(self.max_guidance_weight)}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> ExecutionContext:
        """The context :meth:`fields` describes (``previous`` any float array ``[H_prev, D]``); its own checks name
        a bad field.

        Raises:
            ExecutionContextError: and its subclasses, as the constructor.
        """
        return cls(torch.from_numpy(np.array(fields["previous"], dtype=np.float32)), fields["previous_stamp"],
                   fields["dt"], fields["frozen"], fields["stamp"], guidance=fields.get("guidance", "prefix"),
                   max_guidance_weight=fields.get("max_guidance_weight", DEFAULT_MAX_GUIDANCE_WEIGHT))

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
    def offset(self) -> float:
        """New action ``k`` lines up with previous position ``k + offset`` (:func:`fractional_shift`)."""
        return fractional_shift(self.previous_stamp, self.stamp, self.dt)

    @property
    def shift(self) -> int:
        """:attr:`offset` rounded to whole actions, as results report it (``continuity.shift``)."""
        return int(round(self.offset))

    @property
    def overlap(self) -> int:
        """How many new actions have a previous action at or after their time (0 once it has elapsed)."""
        return overlap_count(self.horizon_previous, self.offset)

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
        """The previous chunk at the new chunk's times, ``[horizon, D]`` float32; zeros where it has none.

        With a fractional :attr:`offset` the previous chunk is interpolated between its two actions around each time.
        """
        out = torch.zeros(horizon, self.width)
        count = min(self.overlap, horizon)
        if count > 0:
            out[:count] = self.previous_at(torch.arange(count, dtype=torch.float64))
        return out

    def previous_at(self, rows: torch.Tensor) -> torch.Tensor:
        """The previous chunk at the times of new rows ``rows`` ``[K]`` (clamped to its last action), ``[K, D]``."""
        return resample(self.previous, rows.to(torch.float64) + self.offset)

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
        held = self.previous_at(torch.tensor([float(k)]))[0]
        return float(torch.linalg.vector_norm(chunk[k].detach().cpu().float() - held))

    def report(self, chunk: torch.Tensor) -> ContinuityReport:
        """What a result reports about the context: frozen count, shift, overlap, guidance mode and seam jump.

        Args:
            chunk (`torch.Tensor` of shape `[H, D]`): The new chunk, in the model's normalized space.
        """
        return ContinuityReport(self.frozen, self.shift, self.offset, self.overlap, self.guidance,
                                self.seam_jump(chunk))


_CONTINUITY_KEYS = ("context_frozen", "context_shift", "context_offset", "context_overlap", "context_guidance",
                    "seam_jump")


@dataclass(frozen=True)
class ContinuityReport:
    """How a continued chunk was decided (``None`` everywhere: the group continued nothing).

    Args:
        frozen (`int`): ``context_frozen``, actions frozen to the old chunk. shift (`int`): ``context_shift``.
        offset (`float`): ``context_offset``. overlap (`int`): ``context_overlap``.
        guidance (`str`): ``context_guidance``, the guidance mode. seam_jump (`float`): ``seam_jump``.
    """

    frozen: int | None = None
    shift: int | None = None
    offset: float | None = None
    overlap: int | None = None
    guidance: str | None = None
    seam_jump: float | None = None

    @property
    def continued(self) -> bool:
        """Whether the group continued a chunk (its result carries the context entries)."""
        return self.frozen is not None

    def as_metrics(self) -> dict[str, float | int | str]:
        """The context entries; none for a group that continued nothing."""
        if not self.continued:
            return {}
        values = (self.frozen, self.shift, self.offset, self.overlap, self.guidance, self.seam_jump)
        return dict(zip(_CONTINUITY_KEYS, values))

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> ContinuityReport:
        """The context entries of a flat metrics mapping."""
        return cls(*(metrics.get(key) for key in _CONTINUITY_KEYS))


OUTLIER_WINDOW = 16
"""Accepted latencies the outlier gate compares a new one with (the most recent ones)."""
OUTLIER_MIN_SAMPLES = 3
"""The gate judges a latency once this many are in its window (before, everything finite and >= 0 is taken)."""
OUTLIER_GATE = 10.0
"""A latency farther than this many robust deviations from the window's median is an outlier."""
OUTLIER_FLOOR = (0.5, 0.05)
"""The robust deviation is at least this fraction of the median and this many seconds: the gate always takes a
latency up to 6 times the median (or 0.5 s above it), load and jitter the ``margin`` is there for, and refuses
what only a clock can do (a goal that "took" 1000 s while its neighbours took 0.2 s)."""
OUTLIER_PATIENCE = 3
"""This many outliers in a row that agree with each other are the new normal (a heavier load, a larger N): the
estimate restarts from them instead of refusing every later goal."""
_MAD_TO_STD = 1.4826


def _robust_band(values: list[float]) -> tuple[float, float]:
    """Median of ``values`` and the gate's half-width ``OUTLIER_GATE * max(1.4826 MAD, floors)`` around it."""
    median = statistics.median(values)
    mad = statistics.median([abs(v - median) for v in values])
    scale = max(_MAD_TO_STD * mad, OUTLIER_FLOOR[0] * abs(median), OUTLIER_FLOOR[1])
    return median, OUTLIER_GATE * scale


class LatencyEstimator:
    """A running estimate of serving latency, for a frozen count the node does not get from its goals.

    Exponential moving average of the observed latencies, plus ``margin`` standard deviations (also a moving
    estimate), so an occasional slow group does not leave frozen actions unaccounted for. A robust gate guards it:
    a latency farther than :data:`OUTLIER_GATE` robust deviations (1.4826 MAD, floored by :data:`OUTLIER_FLOOR`) from
    the median of the last :data:`OUTLIER_WINDOW` accepted ones is refused and counted (``rejected``), so one bad
    sample (a clock that jumped mid-goal) cannot poison the frozen counts of the goals after it;
    :data:`OUTLIER_PATIENCE` agreeing outliers in a row restart the estimate from them.

    Args:
        alpha (`float`): Weight of the newest observation, ``0 < alpha <= 1``.
        margin (`float`): Standard deviations added to the mean, ``>= 0``.
        initial (`float`, *optional*): Seconds assumed before the first observation (and after :meth:`reset`).
    """

    def __init__(self, alpha: float = 0.2, margin: float = 1.0, initial: float | None = None) -> None:
        if not 0 < _finite_number("alpha", alpha) <= 1:
            raise ExecutionContextError(f"alpha must be in (0, 1], got {alpha!r}")
        if _finite_number("margin", margin) < 0:
            raise ExecutionContextError(f"margin must be >= 0, got {margin!r}")
        self.alpha, self.margin = float(alpha), float(margin)
        self._initial = None if initial is None else _finite_number("initial", initial)
        self.rejected = 0
        """Latencies refused as outliers so far."""
        self.reset()

    def reset(self) -> None:
        """Forget every observation (the node's clock jumped: latencies measured across it mean nothing)."""
        self._mean: float | None = self._initial
        self._var = 0.0
        self.count = 0
        self._window: list[float] = []
        self._outliers: list[float] = []

    def observe(self, seconds: float) -> bool:
        """Fold one measured latency (seconds, finite, ``>= 0``) into the estimate, unless it is an outlier.

        Returns:
            `bool`: False when the gate refused it.
        """
        if _finite_number("latency", seconds) < 0:
            raise NegativeDelayError(f"latency must be >= 0 seconds, got {seconds!r}")
        seconds = float(seconds)
        if len(self._window) >= OUTLIER_MIN_SAMPLES:
            median, half_width = _robust_band(self._window)
            if abs(seconds - median) > half_width:
                self.rejected += 1
                self._outliers = [*self._outliers[-(OUTLIER_PATIENCE - 1):], seconds]
                if len(self._outliers) < OUTLIER_PATIENCE:
                    return False
                run = list(self._outliers)
                run_median, run_width = _robust_band(run)
                if any(abs(v - run_median) > run_width for v in run):
                    return False  # outliers, but not one new level: keep refusing
                self.rejected -= len(run)  # they were the new normal after all
                self.reset()
                for value in run:
                    self._fold(value)
                return True
        self._outliers.clear()
        self._fold(seconds)
        return True

    def _fold(self, seconds: float) -> None:
        if self._mean is None or self.count == 0:
            self._mean, self._var = seconds, 0.0
        else:
            delta = seconds - self._mean
            self._mean += self.alpha * delta
            self._var = (1 - self.alpha) * (self._var + self.alpha * delta * delta)
        self.count += 1
        self._window = [*self._window[-(OUTLIER_WINDOW - 1):], seconds]

    @property
    def estimate(self) -> float | None:
        """Seconds (mean + margin * std), or ``None`` before any observation or initial value."""
        if self._mean is None:
            return None
        return self._mean + self.margin * math.sqrt(self._var)

    def frozen_steps(self, dt: float, elapsed_s: float = 0.0) -> int:
        """``ceil((elapsed_s + estimate) / dt)``: actions that execute before a result arrives.

        Args:
            dt (`float`): Seconds between actions, ``> 0``.
            elapsed_s (`float`): Seconds already gone since the observation's stamp when the goal is decided (known
                exactly, unlike the rest of its latency); 0 with no estimate gives 0.
        """
        if _finite_number("dt", dt) <= 0:
            raise ExecutionContextError(f"dt must be > 0 seconds, got {dt!r}")
        estimate = self.estimate or 0.0
        total = max(_finite_number("elapsed_s", elapsed_s), 0.0) + estimate
        # A latency of exactly k * dt must give k, not k + 1, despite float noise in the division.
        return max(math.ceil(total / dt - 1e-9), 0)
