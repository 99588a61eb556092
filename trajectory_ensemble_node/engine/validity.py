"""The engine's validity hook: screen a finished group's candidates, reduce the survivors, check the result.

The order (screen, quorum, reduce, check again) is in docs/safety-and-uncertainty.md, "1. Per-candidate validity".
With no limits and all candidates finite, the reducer sees the very tensor it saw before this hook existed, so
results stay bit-identical.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..errors import InvalidSpecError, ReducedTrajectoryInvalidError, TooFewValidCandidatesError
from ..normalization import ActionNormalizer
from ..safety import REASONS, ActionLimits, ValidityReport, check_trajectories

POSITION_POLICIES = ("drop", "clamp")


@dataclass(frozen=True)
class ValidityPolicy:
    """How a model screens candidates (one per model; the node sets it from parameters).

    Args:
        limits (`ActionLimits`, *optional*): Per-channel limits in robot units; ``None`` checks NaN/Inf only.
        min_valid_candidates (`int`): Fewest survivors that still make a result (>= 1).
        position_policy (`str`): ``"drop"`` (default) drops a candidate outside ``min``/``max``; ``"clamp"`` clamps
            it into range (position limits only; velocity, acceleration and start-jump violations still drop it).
    """

    limits: ActionLimits | None = None
    min_valid_candidates: int = 1
    position_policy: str = "drop"

    def __post_init__(self) -> None:
        if self.limits is not None and not isinstance(self.limits, ActionLimits):
            raise InvalidSpecError(f"limits must be ActionLimits or None, got {type(self.limits).__name__}")
        m = self.min_valid_candidates
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise InvalidSpecError(f"min_valid_candidates must be an int >= 1, got {m!r}")
        if self.position_policy not in POSITION_POLICIES:
            raise InvalidSpecError(
                f"position_policy must be one of {list(POSITION_POLICIES)}, got {self.position_policy!r}"
            )


@dataclass(frozen=True)
class ValidityCheck:
    """The validity settings of one request.

    Args:
        policy (`ValidityPolicy`): The model's policy.
        dt (`float`, *optional*): Seconds between actions of the chunk (``1 / fps``).
        current_state (`tuple[float, ...]`, *optional*): Current robot state in action units, for
            ``max_start_jump``.
    """

    policy: ValidityPolicy
    dt: float | None = None
    current_state: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.dt is not None and not (isinstance(self.dt, (int, float)) and 0 < self.dt < float("inf")):
            raise InvalidSpecError(f"dt must be a finite number > 0, got {self.dt!r}")
        if self.current_state is not None:
            state = tuple(float(v) for v in self.current_state)
            if not all(abs(v) < float("inf") for v in state):
                raise InvalidSpecError(f"current_state must be finite, got {list(state)!r}")
            object.__setattr__(self, "current_state", state)

    @property
    def clamp(self) -> bool:
        return self.policy.position_policy == "clamp"

    def check(self, trajectories: torch.Tensor) -> ValidityReport:
        """Verdicts of ``[N, H, D]`` trajectories in robot units."""
        current = None if self.current_state is None else torch.tensor(self.current_state, dtype=torch.float64)
        return check_trajectories(trajectories, self.policy.limits, dt=self.dt, current=current,
                                  clamp_positions=self.clamp)


DEFAULT_CHECK = ValidityCheck(ValidityPolicy())
"""NaN/Inf only, one survivor suffices: what every request gets when it carries no validity settings."""


def request_check(policy: ValidityPolicy, width: int, fps: float, current_state: Any) -> ValidityCheck | None:
    """The validity settings of one request of ``width`` action channels at ``fps``, local or remote.

    Returns ``None`` for the engine's default (:data:`DEFAULT_CHECK`), so a plain request builds nothing new.

    Raises:
        InvalidSpecError: ``current_state`` is not ``width`` values. LimitsFileError: limits of another width.
    """
    if policy == ValidityPolicy() and current_state is None:
        return None
    if policy.limits is not None:
        policy.limits.check_width(width)
    state = None
    if current_state is not None:
        state = tuple(float(v) for v in torch.as_tensor(current_state, dtype=torch.float64).flatten())
        if len(state) != width:
            raise InvalidSpecError(f"current_state must have {width} values, got {list(state)!r}.")
    return ValidityCheck(policy=policy, dt=1.0 / float(fps) if fps else None, current_state=state)


def to_model_space(raw: torch.Tensor, normalizer: ActionNormalizer) -> torch.Tensor:
    """Robot-unit actions ``[..., D]`` back to the model's normalized space (float64)."""
    # The exact affine inverse of denormalize; ``normalize`` would clamp quantile actions to [-1, 1] and move a
    # clamped candidate that limits allow outside the stats' range.
    zero = normalizer.denormalize(torch.zeros(raw.shape[-1], dtype=torch.float64))
    scale = normalizer.denormalize(torch.ones(raw.shape[-1], dtype=torch.float64)) - zero
    return (raw.double() - zero) / scale


@dataclass
class Screening:
    """What the screen hands the reducer and the result.

    Args:
        report (`ValidityReport`): Verdicts of every candidate.
        survivors (`torch.Tensor` of shape `[M, H, D]`): Valid candidates in model (normalized) space; the input
            tensor itself when every candidate is valid and none was clamped.
        raw (`torch.Tensor` of shape `[N, H, D]`, *optional*): All candidates in robot units with clamped rows
            replaced; ``None`` when ``survivors`` is the input (then the reducer's own denormalization is used).
    """

    report: ValidityReport
    survivors: torch.Tensor
    raw: torch.Tensor | None

    @property
    def valid(self) -> tuple[bool, ...]:
        return tuple(bool(v) for v in self.report.valid)


def screen_candidates(candidates: torch.Tensor, normalizer: ActionNormalizer | None, check: ValidityCheck,
                      request_id: str) -> Screening:
    """Screen a finished group's candidates (steps 1-3 of docs/safety-and-uncertainty.md, section 1).

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Model-space (normalized) candidates.
        normalizer (`ActionNormalizer`, *optional*): Robot units; ``None`` means the model space is robot units.
        check (`ValidityCheck`): The request's settings.
        request_id (`str`): For the error.

    Raises:
        TooFewValidCandidatesError: fewer than ``min_valid_candidates`` survive; the message gives every reason.
    """
    raw = normalizer.denormalize(candidates) if normalizer is not None else candidates
    report = check.check(raw)
    valid = report.valid
    survivors_needed = check.policy.min_valid_candidates
    if int(valid.sum()) < survivors_needed:
        reasons = "; ".join(f"candidate {v.index}: {', '.join(v.details)}" for v in report.verdicts if not v.valid)
        error = TooFewValidCandidatesError(
            request_id, f"{int(valid.sum())} of {len(valid)} candidates valid, min_valid_candidates="
                        f"{survivors_needed}: {reasons}")
        error.counts = report.counts()  # the node reports them in the aborted goal's result
        raise error
    if bool(valid.all()) and not report.any_clamped:
        return Screening(report=report, survivors=candidates, raw=None)
    clamped = report.trajectories.to(candidates.dtype)
    model_space = clamped if normalizer is None else to_model_space(report.trajectories, normalizer).to(
        candidates.dtype)
    # Unclamped survivors keep their exact model-space values; only clamped rows pass through the round trip.
    rows = [model_space[i] if v.clamped else candidates[i] for i, v in enumerate(report.verdicts) if v.valid]
    raw_rows = [clamped[i] if v.clamped else raw[i].to(clamped.dtype) for i, v in enumerate(report.verdicts)]
    return Screening(report=report, survivors=torch.stack(rows), raw=torch.stack(raw_rows))


def check_reduced(action: torch.Tensor, check: ValidityCheck, request_id: str) -> tuple[torch.Tensor, bool]:
    """Check the reduced trajectory ``[H, D]`` (robot units) again; clamp or refuse it.

    Returns:
        `tuple`: the action (clamped when the clamp policy applied) and whether it was clamped.

    Raises:
        ReducedTrajectoryInvalidError: it breaks a limit that clamping cannot (or may not) fix.
    """
    if check.policy.limits is None and bool(torch.isfinite(action).all()):
        return action, False
    verdict = check.check(action[None]).verdicts[0]
    if not verdict.valid:
        raise ReducedTrajectoryInvalidError(
            request_id, f"the reduced trajectory breaks its limits: {', '.join(verdict.details)}")
    if verdict.clamped:
        report = check.check(action[None])
        return report.trajectories[0].to(action.dtype), True
    return action, False


@dataclass(frozen=True)
class ValidityCounts:
    """How a group's candidates fared in the validity checks, as a result reports it (``None``: not reported).

    Args:
        valid (`int`): ``valid_candidates``. dropped (`int`): ``dropped_candidates``.
        clamped (`int`): ``clamped_candidates``.
        dropped_by_reason (`tuple[int, ...]`, one per :data:`~trajectory_ensemble_node.safety.REASONS`):
            ``dropped_<reason>`` (a candidate with several reasons counts under each).
        action_clamped (`bool`, *optional*): ``action_clamped``, whether the reduced trajectory was clamped; absent
            for a group that never got one.
    """

    valid: int | None = None
    dropped: int | None = None
    clamped: int | None = None
    dropped_by_reason: tuple[int | None, ...] = (None,) * len(REASONS)
    action_clamped: bool | None = None

    def dropped_for(self, reason: str) -> int | None:
        """``dropped_<reason>``."""
        return self.dropped_by_reason[REASONS.index(reason)]

    def as_metrics(self) -> dict[str, Any]:
        """The counts, ``dropped_<reason>`` in :data:`REASONS` order, then ``action_clamped`` when set."""
        out: dict[str, Any] = {"valid_candidates": self.valid, "dropped_candidates": self.dropped,
                               "clamped_candidates": self.clamped}
        out.update((f"dropped_{reason}", count) for reason, count in zip(REASONS, self.dropped_by_reason))
        if self.action_clamped is not None:
            out["action_clamped"] = self.action_clamped
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> ValidityCounts:
        """The validity entries of a flat metrics mapping (a result's, or a refused group's ``error.counts``)."""
        return cls(metrics.get("valid_candidates"), metrics.get("dropped_candidates"),
                   metrics.get("clamped_candidates"),
                   tuple(metrics.get(f"dropped_{reason}") for reason in REASONS), metrics.get("action_clamped"))


def validity_counts(report: ValidityReport, action_clamped: bool | None = None) -> ValidityCounts:
    """The counts of a checked set of candidates.

    Args:
        report (`ValidityReport`): The candidates' verdicts.
        action_clamped (`bool`, *optional*): Whether the reduced trajectory was clamped.
    """
    return ValidityCounts.from_metrics(report.counts()) if action_clamped is None else replace(
        ValidityCounts.from_metrics(report.counts()), action_clamped=action_clamped)
