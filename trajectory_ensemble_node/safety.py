"""Per-candidate validity: action limits in robot units, and a verdict with reasons for every candidate.

The JointTrajectoryController enforces no velocity or acceleration limit, so every candidate and the reduced
trajectory are checked here. The limits file's format (``version: 1``, one entry per channel): docs/safety-and-
uncertainty.md, "1. Per-candidate validity". NaN and Inf are always rejected, with or without limits.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import LimitsFileError

REASONS = ("non_finite", "min", "max", "max_velocity", "max_acceleration", "max_start_jump")
"""Every reason a candidate can be dropped for, in the order verdicts list them."""
LIMITS_FORMAT_VERSION = 1
_KEYS = ("min", "max", "max_velocity", "max_acceleration", "max_start_jump")


def _limit(value: Any, name: str, *, positive: bool) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LimitsFileError(f"{name} must be a finite number or null, got {value!r}")
    if positive and value <= 0:
        raise LimitsFileError(f"{name} must be > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ChannelLimits:
    """Limits of one action channel, in robot units (``None`` = unlimited).

    Args:
        name (`str`): Label used in verdict reasons.
        min (`float`, *optional*), max (`float`, *optional*): Position limits, ``min < max``.
        max_velocity (`float`, *optional*): Largest ``|Δa| / dt`` (units/s), > 0.
        max_acceleration (`float`, *optional*): Largest ``|Δ²a| / dt²`` (units/s²), > 0.
        max_start_jump (`float`, *optional*): Largest ``|a[0] - state|`` (units), > 0.
    """

    name: str = ""
    min: float | None = None
    max: float | None = None
    max_velocity: float | None = None
    max_acceleration: float | None = None
    max_start_jump: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise LimitsFileError(f"channel name must be a string, got {self.name!r}")
        label = self.name or "channel"
        for key in _KEYS:
            positive = key.startswith("max_")
            object.__setattr__(self, key, _limit(getattr(self, key), f"{label}.{key}", positive=positive))
        if self.min is not None and self.max is not None and not self.min < self.max:
            raise LimitsFileError(f"{label}: min must be < max, got min={self.min!r}, max={self.max!r}")


@dataclass(frozen=True)
class ActionLimits:
    """Per-channel limits of an action space; validated on construction.

    Args:
        channels (`tuple[ChannelLimits, ...]`): One per action channel, in order.
        source (`str`): Where they came from (quoted in errors).
    """

    channels: tuple[ChannelLimits, ...]
    source: str = "<memory>"

    def __post_init__(self) -> None:
        channels = tuple(self.channels)
        if not channels or not all(isinstance(c, ChannelLimits) for c in channels):
            raise LimitsFileError(f"{self.source}: channels must be a non-empty list of ChannelLimits, got {channels!r}")
        named = tuple(
            c if c.name else ChannelLimits(f"channel {i}", c.min, c.max, c.max_velocity, c.max_acceleration,
                                           c.max_start_jump)
            for i, c in enumerate(channels)
        )
        object.__setattr__(self, "channels", named)

    @property
    def width(self) -> int:
        return len(self.channels)

    def column(self, key: str, default: float) -> torch.Tensor:
        """``[D]`` float64 tensor of one limit across channels, ``default`` where unlimited."""
        return torch.tensor([default if getattr(c, key) is None else getattr(c, key) for c in self.channels],
                            dtype=torch.float64)

    def check_width(self, width: int) -> None:
        """Raise :class:`LimitsFileError` unless the limits describe exactly ``width`` channels."""
        if width != self.width:
            raise LimitsFileError(f"{self.source}: limits describe {self.width} channel(s), the action has {width}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "<memory>") -> ActionLimits:
        """Build from the parsed YAML schema in the module docstring."""
        if not isinstance(data, Mapping):
            raise LimitsFileError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
        version = data.get("version", LIMITS_FORMAT_VERSION)
        if version != LIMITS_FORMAT_VERSION:
            raise LimitsFileError(f"{source}: version must be {LIMITS_FORMAT_VERSION}, got {version!r}")
        unknown = set(data) - {"version", "channels"}
        if unknown:
            raise LimitsFileError(f"{source}: unknown top-level key(s) {sorted(unknown)!r}")
        entries = data.get("channels")
        if not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)) or not entries:
            raise LimitsFileError(f"{source}: 'channels' must be a non-empty list, got {entries!r}")
        channels = []
        for index, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise LimitsFileError(f"{source}: channels[{index}] must be a mapping, got {entry!r}")
            bad = set(entry) - {"name", *_KEYS}
            if bad:
                raise LimitsFileError(f"{source}: channels[{index}] has unknown key(s) {sorted(bad)!r}")
            try:
                channels.append(ChannelLimits(name=str(entry.get("name") or f"channel {index}"),
                                              **{key: entry.get(key) for key in _KEYS}))
            except LimitsFileError as exc:
                raise LimitsFileError(f"{source}: channels[{index}]: {exc}") from None
        return cls(channels=tuple(channels), source=source)


def load_limits(path: str | Path) -> ActionLimits:
    """Read a limits YAML file (schema in the module docstring).

    Raises:
        LimitsFileError: unreadable, not YAML, or any invalid value (quoted).
    """
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LimitsFileError(f"cannot read limits file {str(path)!r}: {exc}") from exc
    return ActionLimits.from_mapping(data, source=str(path))


@dataclass(frozen=True)
class CandidateVerdict:
    """Whether one candidate may be reduced and published, and why not.

    Args:
        index (`int`): Candidate position in the group.
        valid (`bool`): True when no reason applies (after clamping, when clamped).
        reasons (`tuple[str, ...]`): Subset of :data:`REASONS`, in that order.
        details (`tuple[str, ...]`): One line per reason: the first violation, with channel, step and values.
        clamped (`bool`): Position limits were enforced by clamping this candidate.
    """

    index: int
    valid: bool
    reasons: tuple[str, ...] = ()
    details: tuple[str, ...] = ()
    clamped: bool = False


@dataclass(frozen=True)
class ValidityReport:
    """Verdicts of a set of trajectories and, with a clamp policy, the clamped trajectories.

    Args:
        verdicts (`tuple[CandidateVerdict, ...]`): One per trajectory.
        trajectories (`torch.Tensor` of shape `[N, H, D]`): The checked trajectories in robot units, clamped rows
            replaced by their clamped version.
    """

    verdicts: tuple[CandidateVerdict, ...]
    trajectories: torch.Tensor = field(repr=False)

    @property
    def valid(self) -> torch.Tensor:
        """``[N]`` bool."""
        return torch.tensor([v.valid for v in self.verdicts], dtype=torch.bool)

    @property
    def any_clamped(self) -> bool:
        return any(v.clamped for v in self.verdicts)

    def counts(self) -> dict[str, int]:
        """``valid_candidates``, ``dropped_candidates``, ``clamped_candidates`` and ``dropped_<reason>`` per reason
        (a candidate with several reasons counts under each)."""
        out = {
            "valid_candidates": sum(v.valid for v in self.verdicts),
            "dropped_candidates": sum(not v.valid for v in self.verdicts),
            "clamped_candidates": sum(v.clamped for v in self.verdicts),
        }
        for reason in REASONS:
            out[f"dropped_{reason}"] = sum(reason in v.reasons for v in self.verdicts)
        return out


def _first(mask: torch.Tensor) -> tuple[int, int]:
    # [H', D] bool with at least one True: (step, channel) of the first violation in time order.
    step, channel = (int(i) for i in mask.nonzero()[0])
    return step, channel


def _violations(x: torch.Tensor, limits: ActionLimits | None, dt: float | None,
                current: torch.Tensor | None) -> list[tuple[str, str]]:
    """Reasons and details for one finite trajectory ``[H, D]`` (float64)."""
    if limits is None:
        return []
    found: list[tuple[str, str]] = []
    names = [c.name for c in limits.channels]
    low, high = limits.column("min", -math.inf), limits.column("max", math.inf)
    for reason, mask, bound in (("min", x < low, low), ("max", x > high, high)):
        if mask.any():
            k, d = _first(mask)
            found.append((reason, f"{reason}: {names[d]} step {k}: {float(x[k, d]):.6g} vs {float(bound[d]):.6g}"))
    checks = []
    if dt is not None and x.shape[0] >= 2:
        checks.append(("max_velocity", (x[1:] - x[:-1]).abs() / dt, "units/s"))
    if dt is not None and x.shape[0] >= 3:
        checks.append(("max_acceleration", (x[2:] - 2 * x[1:-1] + x[:-2]).abs() / dt**2, "units/s^2"))
    if current is not None:
        checks.append(("max_start_jump", (x[:1] - current[None]).abs(), "units"))
    for reason, value, unit in checks:
        bound = limits.column(reason, math.inf)
        mask = value > bound
        if mask.any():
            k, d = _first(mask)
            found.append((reason, f"{reason}: {names[d]} step {k}: {float(value[k, d]):.6g} > "
                                  f"{float(bound[d]):.6g} {unit}"))
    return found


def check_trajectories(
    trajectories: torch.Tensor,
    limits: ActionLimits | None,
    *,
    dt: float | None = None,
    current: torch.Tensor | None = None,
    clamp_positions: bool = False,
) -> ValidityReport:
    """Give every trajectory a verdict: NaN/Inf always, then each limit of ``limits``.

    Args:
        trajectories (`torch.Tensor` of shape `[N, H, D]`): In robot units (the published ones).
        limits (`ActionLimits`, *optional*): ``None`` checks finiteness only.
        dt (`float`, *optional*): Seconds between consecutive actions (velocity and acceleration need it).
        current (`torch.Tensor` of shape `[D]`, *optional*): Current state, for ``max_start_jump``.
        clamp_positions (`bool`): Clamp ``min``/``max`` violations into range instead of dropping the candidate;
            the clamped trajectory is then checked against every other limit.

    Returns:
        `ValidityReport`
    """
    if trajectories.ndim != 3:
        raise ValueError(f"trajectories must be [N, H, D], got shape {tuple(trajectories.shape)}")
    if limits is not None:
        limits.check_width(int(trajectories.shape[-1]))
    if current is not None:
        current = torch.as_tensor(current, dtype=torch.float64).flatten()
        if current.numel() != trajectories.shape[-1] or not torch.isfinite(current).all():
            raise ValueError(f"current state must be {trajectories.shape[-1]} finite values, got {current.tolist()!r}")
    out = trajectories.detach().to("cpu", torch.float64).clone()
    verdicts = []
    for index in range(out.shape[0]):
        x = out[index]
        if not torch.isfinite(x).all():
            bad = (~torch.isfinite(x)).nonzero()[0].tolist()
            verdicts.append(CandidateVerdict(index, False, ("non_finite",),
                                             (f"non_finite: step {bad[0]} channel {bad[1]} is {float(x[tuple(bad)])}",)))
            continue
        found = _violations(x, limits, dt, current)
        clamped = False
        if clamp_positions and limits is not None and any(r in ("min", "max") for r, _ in found):
            out[index] = x = torch.maximum(torch.minimum(x, limits.column("max", math.inf)),
                                           limits.column("min", -math.inf))
            clamped = True
            found = _violations(x, limits, dt, current)
        verdicts.append(CandidateVerdict(index, not found, tuple(r for r, _ in found), tuple(d for _, d in found),
                                         clamped))
    return ValidityReport(verdicts=tuple(verdicts), trajectories=out)
