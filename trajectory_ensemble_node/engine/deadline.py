"""Per-request deadlines (anytime results): how many denoising steps fit, and when to stop early.

From measured :class:`StepCosts`: refuse at submission and again at admission what cannot be met
(:class:`DeadlineUnmeetableError`; a cold engine accepts unless ``refuse_cold``), fit ``steps_fitted`` after encoding,
and finish early from the clean-action estimate when one more step would overrun. The rules in full:
docs/safety-and-uncertainty.md, "3. Per-request deadlines". Adapters opt in through :class:`AnytimeAdapter`; without a
deadline nothing here runs and results are bit-identical.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import DeadlineUnmeetableError, InvalidSpecError

EMA_WEIGHT = 0.3
"""Weight of the newest measurement in the running cost estimates (recent load matters more)."""
SAFETY_FACTOR = 1.1
"""Planned costs are inflated by this factor: a step that takes 10 % longer than the estimate still fits."""


@runtime_checkable
class AnytimeAdapter(Protocol):
    """What an adapter implements to serve deadlines."""

    def reschedule(self, state: Any, steps: int) -> None:
        """Before the first step: run the group with ``steps`` denoising steps instead."""
        ...

    def enable_anytime(self, state: Any) -> None:
        """Before the first step: keep what :meth:`finish_now` needs (the group may stop early)."""
        ...

    def finish_now(self, state: Any) -> None:
        """After a step: replace the candidates by the clean estimate of the step just taken; the group is done."""
        ...


def check_deadline(deadline_s: float | None) -> float | None:
    """Validate a request's deadline; returns seconds or ``None`` (0 and ``None`` both mean none).

    This is the one rule for what a deadline is: any positive value is one, however small (a 1e-12 s deadline is
    refused as unmeetable, never served as "no deadline"). Callers convert units without rounding and pass the
    result here; only an exact 0 means none.

    Raises:
        InvalidSpecError: negative, NaN or infinite (quoted).
    """
    if deadline_s is None:
        return None
    if isinstance(deadline_s, bool) or not isinstance(deadline_s, (int, float)) or not math.isfinite(deadline_s) \
            or deadline_s < 0:
        raise InvalidSpecError(f"deadline_s must be a finite number >= 0 (0 = none), got {deadline_s!r}")
    return float(deadline_s) or None


def _seconds(value: float) -> str:
    # Millisecond precision, except for deadlines below it, which would print as a misleading "0.000".
    return f"{value:.3f}" if value >= 1e-3 else f"{value:.3g}"


@dataclass
class StepCosts:
    """Running estimates (milliseconds) of what a group costs on this engine; ``None`` until measured.

    ``provisional`` names estimates that only stand in until real work measures its own (a start-up measurement on
    a stand-in frame): the next measurement of each replaces it instead of being blended in.
    """

    encode_ms: float | None = None
    step_ms: float | None = None
    post_ms: float | None = None
    provisional: set[str] = field(default_factory=set)

    @staticmethod
    def _blend(old: float | None, new: float) -> float:
        return new if old is None else (1 - EMA_WEIGHT) * old + EMA_WEIGHT * new

    def observe(self, name: str, ms: float) -> None:
        if name in self.provisional:
            self.provisional.discard(name)
            setattr(self, name, float(ms))
            return
        setattr(self, name, self._blend(getattr(self, name), float(ms)))

    def minimum_ms(self) -> float | None:
        """Encode + one step + post-processing, or ``None`` before a step was ever measured."""
        if self.step_ms is None:
            return None
        return SAFETY_FACTOR * ((self.encode_ms or 0.0) + self.step_ms + (self.post_ms or 0.0))

    def steps_that_fit(self, remaining_ms: float, requested: int) -> int:
        """How many steps fit in ``remaining_ms`` (post-processing reserved); ``requested`` before any step was
        measured, unless no time is left at all (then 0)."""
        budget = remaining_ms - SAFETY_FACTOR * (self.post_ms or 0.0)
        if self.step_ms is None:
            return requested if budget > 0 else 0
        return max(0, min(requested, int(budget // (SAFETY_FACTOR * self.step_ms))))

    def one_more_step_overruns(self, now_ms: float, deadline_ms: float, own_step_ms: float | None) -> bool:
        """Whether another step (at the slower of the engine's and the group's own step time) would be late."""
        step = max(v for v in (self.step_ms, own_step_ms, 0.0) if v is not None)
        return now_ms + SAFETY_FACTOR * (step + (self.post_ms or 0.0)) > deadline_ms


def refuse_unmeetable(costs: StepCosts, adapter: Any, request: Any, sequential: bool, *,
                      refuse_cold: bool = False) -> None:
    """At submission: raise unless ``request.deadline_s`` can be served at all.

    Args:
        refuse_cold (`bool`): Refuse while no step has been measured, rather than accept and plan after encoding.

    Raises:
        InvalidSpecError: the adapter cannot re-schedule and stop early, or the group would run sequentially.
        DeadlineUnmeetableError: measured encode + one step + post-processing exceed the deadline (or, with
            ``refuse_cold``, nothing is measured yet).
    """
    if sequential or not isinstance(adapter, AnytimeAdapter):
        raise InvalidSpecError(
            f"group {request.request_id!r}: a deadline needs one batched group on an adapter that can re-schedule "
            f"and stop early ({type(adapter).__name__}, sequential={sequential})."
        )
    minimum = costs.minimum_ms()
    if minimum is None and refuse_cold:
        raise DeadlineUnmeetableError(
            f"group {request.request_id!r}: deadline {_seconds(request.deadline_s)} s cannot be planned: no denoising "
            "step has been measured on this engine yet (its start-up measurement failed); goals without a deadline "
            "measure one."
        )
    if minimum is not None and 1000.0 * request.deadline_s < minimum:
        raise DeadlineUnmeetableError(
            f"group {request.request_id!r}: deadline {_seconds(request.deadline_s)} s is shorter than encoding + one "
            f"denoising step + post-processing as measured here ({minimum / 1000.0:.3f} s)."
        )


def refuse_at_admission(costs: StepCosts, remaining_ms: float, request: Any) -> None:
    """At admission, before the encode: raise when what is left of the deadline cannot hold encode + one step +
    post-processing as measured (a group that waited in the queue), or, on a cold engine, when nothing is left.

    Args:
        costs (`StepCosts`): The engine's measured costs.
        remaining_ms (`float`): Deadline minus now, in ms (negative once past).
        request: The group's request (``request_id``, ``deadline_s``).

    Raises:
        DeadlineUnmeetableError: naming the time left and the measured minimum.
    """
    minimum = costs.minimum_ms()
    if remaining_ms > 0 and (minimum is None or remaining_ms >= minimum):
        return
    measured = "nothing measured yet" if minimum is None else f"encode + one step + post-processing {minimum:.1f} ms"
    raise DeadlineUnmeetableError(
        f"group {request.request_id!r}: {max(remaining_ms, 0.0):.1f} ms of its {_seconds(request.deadline_s)} s "
        f"deadline were left at admission ({measured}); refused before encoding."
    )


def plan_steps(costs: StepCosts, adapter: Any, state: Any, remaining_ms: float, request: Any, *,
               encoded: bool = True) -> int | None:
    """After encoding: how many steps the group runs; re-schedules it when fewer than requested. Before encoding
    (``encoded=False``, at admission): only :func:`refuse_at_admission`.

    Returns:
        `int`: the planned step count (>= 1); ``None`` before encoding.

    Raises:
        DeadlineUnmeetableError: not one step fits in ``remaining_ms`` (before encoding: see
            :func:`refuse_at_admission`).
    """
    if not encoded:
        refuse_at_admission(costs, remaining_ms, request)
        return None
    requested = state.num_steps
    steps = costs.steps_that_fit(remaining_ms, requested)
    if steps < 1:
        step = "not measured yet" if costs.step_ms is None else f"{costs.step_ms:.1f} ms"
        raise DeadlineUnmeetableError(
            f"group {request.request_id!r}: not one denoising step fits in what is left of its "
            f"{_seconds(request.deadline_s)} s deadline ({remaining_ms:.0f} ms left, step {step})."
        )
    adapter.enable_anytime(state)
    if steps < requested:
        adapter.reschedule(state, steps)
    return steps


@dataclass(frozen=True)
class StepsReport:
    """A group's denoising steps as a result reports them (``None``: not reported).

    Args:
        planned (`int`): ``steps_planned``, the steps the request asked for.
        fitted (`int`): ``steps_fitted``, what fits the deadline.
        used (`int`): ``steps_used``, taken; fewer when the group stopped early.
        deadline_ms (`float`, *optional*): ``deadline_ms``, with a deadline.
        deadline_met (`bool`, *optional*): ``deadline_met``, with a deadline.
    """

    planned: int | None = None
    fitted: int | None = None
    used: int | None = None
    deadline_ms: float | None = None
    deadline_met: bool | None = None

    def as_metrics(self) -> dict[str, Any]:
        """``steps_planned``, ``steps_fitted``, ``steps_used`` (always, as results carry them), and with a deadline
        ``deadline_ms`` and ``deadline_met``."""
        out: dict[str, Any] = {"steps_planned": self.planned, "steps_fitted": self.fitted, "steps_used": self.used}
        if self.deadline_ms is not None:
            out["deadline_ms"] = self.deadline_ms
            out["deadline_met"] = self.deadline_met
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> StepsReport:
        """The step entries of a flat metrics mapping."""
        return cls(metrics.get("steps_planned"), metrics.get("steps_fitted"), metrics.get("steps_used"),
                   metrics.get("deadline_ms"), metrics.get("deadline_met"))


def steps_report(extras: Mapping[str, Any], steps_fitted: int | None, deadline_s: float | None,
                 met: bool | None) -> StepsReport:
    """The steps of a finished group. Without a deadline all three counts are equal.

    Args:
        extras (`Mapping[str, Any]`): The adapter's extras of the group's first output (``num_inference_steps``,
            ``steps_requested``, ``steps_used``).
        steps_fitted (`int`, *optional*): What the deadline planning fitted.
        deadline_s (`float`, *optional*): The request's deadline.
        met (`bool`, *optional*): Whether the group finished by it.
    """
    steps = extras.get("num_inference_steps")
    return StepsReport(
        planned=extras.get("steps_requested", steps), fitted=steps_fitted or steps,
        used=extras.get("steps_used", steps),
        deadline_ms=None if deadline_s is None else 1000.0 * deadline_s,
        deadline_met=None if deadline_s is None else bool(met))
