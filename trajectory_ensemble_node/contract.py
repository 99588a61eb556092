"""The candidate contract: what a request asks for, which candidates form its group, and the one result it gets.

A :class:`CandidateTrajectorySpec` becomes a :class:`CandidateGroup` and gets exactly one :class:`EnsembleResult`;
every type validates itself on construction. :func:`check_request` is the one place a request is validated (its parts
:func:`check_count` and :func:`check_reducer` report every problem); each rule lives with its data
(:func:`~trajectory_ensemble_node.seeding.check_seed`, :meth:`~trajectory_ensemble_node.reducers.Reducer.check_layout`,
:func:`check_finite`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch

from .errors import (
    CandidateCountError,
    InvalidSpecError,
    NonFiniteCandidatesError,
    PartialGroupError,
    ReducerLayoutError,
)
from .quoting import quote_value
from .reducers import available_reducers, check_finite, get_reducer
from .seeding import SEED_POLICIES, check_seed

DEFAULT_MAX_CANDIDATES = 64
"""Default upper bound on ``CandidateTrajectorySpec.count`` (the node's ``max_candidates`` parameter)."""

PUBLIC_OUTPUTS = ("action",)
"""Outputs a candidate group may reduce. Only actions: videos and latents are never averaged."""

__all__ = [
    "DEFAULT_MAX_CANDIDATES",
    "PUBLIC_OUTPUTS",
    "SEED_POLICIES",
    "CandidateGroup",
    "CandidateTrajectorySpec",
    "EnsembleResult",
    "allowed_reducers",
    "check_count",
    "check_finite",
    "check_reducer",
    "reducers_for_width",
    "check_request",
]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(count: object, max_count: int) -> int:
    """The count bound: ``count`` must be an int in ``[1, max_count]``.

    Args:
        count (`object`): The requested number of candidates.
        max_count (`int`): The configured maximum (the node's ``max_candidates``).

    Returns:
        `int`: ``count``, unchanged.

    Raises:
        CandidateCountError: ``count`` is not an int, or outside ``[1, max_count]``; the message quotes it.
    """
    if not _is_int(count):
        raise CandidateCountError(
            f"candidate_count must be an int, got {quote_value(count)} of type {type(count).__name__}; nothing was run"
        )
    if not 1 <= count <= max_count:
        raise CandidateCountError(
            f"candidate_count {quote_value(count)} is outside [1, max_candidates={max_count}]; nothing was run"
        )
    return count


def allowed_reducers(declared: Iterable[str]) -> tuple[str, ...]:
    """The reducers an adapter declares that are registered, in the adapter's order.

    Args:
        declared (`Iterable[str]`): An adapter's ``capabilities.valid_reducers``.
    """
    registered = set(available_reducers())
    return tuple(name for name in declared if name in registered)


def check_reducer(
    reducer: str,
    action_dim: int,
    *,
    valid_reducers: Iterable[str] | None = None,
    space: str | None = None,
    domain_name: str | None = None,
) -> None:
    """Reducer validity: registered, declared valid by the model, fits the action width (and reduction space).

    ``"none"`` always passes here; whether it fits the count is the spec's rule.

    Args:
        reducer (`str`): The reducer name.
        action_dim (`int`): The raw action width the reducer will see.
        valid_reducers (`Iterable[str]`, *optional*): The model adapter's declared reducers; omitted when no model
            is known yet (a parameter file checked before the model loads).
        space (`str`, *optional*): ``"normalized"`` or ``"raw"``: where the model adapter reduces.
        domain_name (`str`, *optional*): The embodiment, named in the width message.

    Raises:
        UnknownReducerError: ``reducer`` is not registered (the message lists the registered names).
        ReducerLayoutError: the model does not declare it, or it does not fit ``action_dim`` or ``space``.
    """
    if reducer == "none":
        return
    implementation = get_reducer(reducer)
    if valid_reducers is not None:
        valid = allowed_reducers(valid_reducers)
        if reducer not in valid:
            raise ReducerLayoutError(
                f"reducer {quote_value(reducer)} is not valid for this model's action space; valid: {', '.join(valid)}"
            )
    try:
        implementation.check_layout(action_dim)
    except ReducerLayoutError as error:
        actions = f"{domain_name} actions" if domain_name else "the actions"
        raise ReducerLayoutError(f"{error} ({actions} have width {action_dim})") from None
    if space is not None:
        implementation.check_space(space)


def reducers_for_width(declared: Iterable[str], action_dim: int, *, space: str | None = None) -> tuple[str, ...]:
    """The declared reducers a request may name for actions of width ``action_dim``: those :func:`check_reducer`
    accepts, so what is listed (e.g. in the OpenPI metadata) and what is accepted follow one rule.

    Args:
        declared (`Iterable[str]`): An adapter's declared reducers.
        action_dim (`int`): The raw action width served.
        space (`str`, *optional*): ``"normalized"`` or ``"raw"``.
    """
    valid = []
    for name in allowed_reducers(declared):
        try:
            check_reducer(name, action_dim, valid_reducers=declared, space=space)
        except InvalidSpecError:
            continue
        valid.append(name)
    return tuple(valid)


def check_request(
    count: object,
    reducer: str,
    *,
    max_count: int,
    action_dim: int,
    valid_reducers: Iterable[str] | None = None,
    domain_name: str | None = None,
    return_candidates: bool = False,
    seed_policy: str = "per_candidate",
    base_seed: int | None = None,
) -> CandidateTrajectorySpec:
    """Validate one request, before any model work: THE check a goal, a parameter set and a Python call share.

    Args:
        count (`object`): Number of candidates.
        reducer (`str`): Reducer name, or ``"none"`` with ``count == 1``.
        max_count (`int`): The configured maximum count.
        action_dim (`int`): The raw action width of the embodiment served.
        valid_reducers (`Iterable[str]`, *optional*): The model adapter's declared reducers.
        domain_name (`str`, *optional*): The embodiment, named in a width error.
        return_candidates (`bool`): Whether the candidates come back.
        seed_policy (`str`): ``"per_candidate"`` or ``"shared"``.
        base_seed (`int`, *optional*): The request's seed, when it brings one.

    Returns:
        `CandidateTrajectorySpec`: the validated spec.

    Raises:
        CandidateCountError: the count is outside ``[1, max_count]``.
        UnknownReducerError: the reducer is not registered.
        ReducerLayoutError: the reducer is not valid for this model or does not fit ``action_dim``.
        InvalidSpecError: a bad seed (outside ``[0, 2**64)``), seed policy, or ``"none"`` with several candidates.
    """
    check_count(count, max_count)
    check_reducer(reducer, action_dim, valid_reducers=valid_reducers, domain_name=domain_name)
    if base_seed is not None:
        check_seed(base_seed)
    return CandidateTrajectorySpec(
        count=count,  # type: ignore[arg-type]  # checked above
        reducer=reducer,
        return_candidates=return_candidates,
        seed_policy=seed_policy,
        max_count=max_count,
    )


@dataclass(frozen=True)
class CandidateTrajectorySpec:
    """How many candidate trajectories one request wants and how they become one.

    Args:
        count (`int`, defaults to `1`): Number of candidates, ``1 <= count <= max_count``. ``1`` is the plain path.
        reducer (`str`, defaults to `"none"`): A registered reducer name, or ``"none"``, which is valid only with
            ``count == 1`` (there is nothing to reduce, and several candidates are never silently cut to one).
        return_candidates (`bool`, defaults to `False`): Also return all candidates, ordered by candidate id.
        seed_policy (`str`, defaults to `"per_candidate"`): ``"per_candidate"`` (independent seeds) or ``"shared"``
            (every candidate gets the base seed; for debugging only). See :mod:`trajectory_ensemble_node.seeding`.
        max_count (`int`, keyword-only, defaults to `DEFAULT_MAX_CANDIDATES`): The configured maximum ``count``.

    Raises:
        CandidateCountError: ``count`` is not an int in ``[1, max_count]``.
        UnknownReducerError: ``reducer`` is neither ``"none"`` nor registered (the message lists the known names).
        InvalidSpecError: ``reducer="none"`` with ``count > 1``, a bad ``seed_policy``, ``return_candidates`` or
            ``max_count``.
    """

    count: int = 1
    reducer: str = "none"
    return_candidates: bool = False
    seed_policy: str = "per_candidate"
    max_count: int = field(default=DEFAULT_MAX_CANDIDATES, kw_only=True, repr=False)

    def __post_init__(self) -> None:
        if not _is_int(self.max_count) or self.max_count < 1:
            raise InvalidSpecError(f"max_count must be an int >= 1, got {quote_value(self.max_count)}")
        check_count(self.count, self.max_count)
        if self.reducer == "none":
            if self.count > 1:
                raise InvalidSpecError(
                    f"reducer 'none' is only valid with count=1, got count={self.count}; choose one of: "
                    f"{', '.join(available_reducers())}"
                )
        else:
            get_reducer(self.reducer)
        if not isinstance(self.return_candidates, bool):
            raise InvalidSpecError(f"return_candidates must be a bool, got {quote_value(self.return_candidates)}")
        if self.seed_policy not in SEED_POLICIES:
            raise InvalidSpecError(f"seed_policy must be one of {SEED_POLICIES}, got {quote_value(self.seed_policy)}")


@dataclass(frozen=True)
class CandidateGroup:
    """The identity of one logical prediction: a request and its ordered candidate ids.

    Args:
        request_id (`str`): Non-empty request (goal) id.
        candidate_ids (`tuple[int, ...]`): Non-empty, unique, non-negative and ascending; a list is accepted and
            stored as a tuple.
        public_output (`str`, defaults to `"action"`): The output being reduced; one of :data:`PUBLIC_OUTPUTS`.

    Raises:
        InvalidSpecError: If any field breaks the rules above; the message quotes the bad value.
    """

    request_id: str
    candidate_ids: tuple[int, ...]
    public_output: str = "action"

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise InvalidSpecError(f"request_id must be a non-empty string, got {quote_value(self.request_id)}")
        ids = self.candidate_ids
        if isinstance(ids, list):
            ids = tuple(ids)
            object.__setattr__(self, "candidate_ids", ids)
        if not isinstance(ids, tuple) or not ids:
            raise InvalidSpecError(f"candidate_ids must be a non-empty tuple of ints, got {quote_value(self.candidate_ids)}")
        if not all(_is_int(i) and i >= 0 for i in ids):
            raise InvalidSpecError(f"candidate_ids must be non-negative ints, got {quote_value(ids)}")
        if any(a >= b for a, b in zip(ids, ids[1:])):
            raise InvalidSpecError(f"candidate_ids must be unique and ascending, got {quote_value(ids)}")
        if self.public_output not in PUBLIC_OUTPUTS:
            raise InvalidSpecError(f"public_output must be one of {PUBLIC_OUTPUTS}, got {quote_value(self.public_output)}")

    @classmethod
    def for_spec(cls, request_id: str, spec: CandidateTrajectorySpec) -> CandidateGroup:
        """The group for a spec: candidate ids ``0 .. spec.count - 1``.

        Args:
            request_id (`str`): The request id.
            spec (`CandidateTrajectorySpec`): The validated spec.

        Returns:
            `CandidateGroup`
        """
        return cls(request_id, tuple(range(spec.count)))

    @property
    def size(self) -> int:
        """Number of candidates in the group."""
        return len(self.candidate_ids)


class Report(Protocol):
    """A typed finding of a finished group (counters, steps, validity, continuity, uncertainty, novelty)."""

    def as_metrics(self) -> dict[str, Any]:
        """The flat key -> value entries diagnostics and the wires carry."""
        ...


ReportT = TypeVar("ReportT")


class MetricsView(dict):
    """A result's flat metrics: read-only, derived from its reports (a copy, ``dict(view)``, can be changed)."""

    def _read_only(self, *args: object, **kwargs: object) -> None:
        raise TypeError("EnsembleResult.metrics is derived from its reports and read-only; copy it with dict()")

    __setitem__ = __delitem__ = update = pop = popitem = setdefault = clear = __ior__ = _read_only  # type: ignore

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return MetricsView, (dict(self),)


def flatten_reports(reports: Iterable[Report], extra: Mapping[str, Any] | None = None) -> MetricsView:
    """The flat metrics of ``reports`` in order (later ones update earlier keys in place; a report with
    ``fills_gaps`` only adds keys not yet there), then ``extra``.

    Args:
        reports (`Iterable[Report]`): The group's reports.
        extra (`Mapping[str, Any]`, *optional*): Entries given as they are (e.g. by a caller that has no reports).
    """
    flat: dict[str, Any] = {}
    for report in reports:
        entries = report.as_metrics()
        if getattr(report, "fills_gaps", False):
            for key, value in entries.items():
                flat.setdefault(key, value)
        else:
            flat.update(entries)
    flat.update(extra or {})
    return MetricsView(flat)


@dataclass(frozen=True, eq=False)
class EnsembleResult:
    """The one result of a candidate group. Construction refuses anything but the complete group.

    Args:
        group (`CandidateGroup`): The group this result answers.
        spec (`CandidateTrajectorySpec`): The request's spec; ``spec.count == group.size``.
        action (`torch.Tensor` of shape `[H, D]`): The reduced trajectory (float32 for publishing), finite.
        candidate_ids (`tuple[int, ...]`): Ids of the candidates that went into ``action``; must equal
            ``group.candidate_ids``.
        seeds (`tuple[int, ...]`): One uint64 seed per candidate, in candidate order.
        metrics (`dict[str, Any]`, defaults to `{}`): Per-group measurements given as they are; once built,
            ``metrics`` is the read-only flat view of ``reports`` followed by these (:func:`flatten_reports`).
        candidates (`torch.Tensor` of shape `[N, H, D]`, *optional*): All candidates ordered by candidate id;
            required when ``spec.return_candidates``.
        base_seed (`int`, *optional*): The request's seed; defaults to ``seeds[0]`` and must equal it.
        rollout (`object`, *optional*): Rollout-mode payload (filled by rollout mode).
        candidate_valid (`tuple[bool, ...]`, *optional*): Per candidate, whether it passed the validity checks and
            went into ``action``; rows of ``candidates`` flagged invalid may hold NaN/Inf (shown, never reduced).
        verdicts (`tuple`, *optional*): Per candidate, its ``safety.CandidateVerdict`` (reasons when dropped).
        reports (`tuple[Report, ...]`): The group's typed reports, in the order their entries are flattened;
            read one with :meth:`report`.

    Raises:
        PartialGroupError: If the ids, seeds or candidates do not describe exactly the whole group, or a shape is
            wrong.
        NonFiniteCandidatesError: If ``action`` or ``candidates`` hold NaN or Inf.
    """

    group: CandidateGroup
    spec: CandidateTrajectorySpec
    action: torch.Tensor
    candidate_ids: tuple[int, ...]
    seeds: tuple[int, ...]
    metrics: Mapping[str, Any] = field(default_factory=dict)
    candidates: torch.Tensor | None = None
    base_seed: int | None = None
    rollout: object | None = None
    candidate_valid: tuple[bool, ...] | None = None
    verdicts: tuple[object, ...] | None = None
    reports: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.group, CandidateGroup) or not isinstance(self.spec, CandidateTrajectorySpec):
            raise PartialGroupError(
                f"EnsembleResult needs a CandidateGroup and a CandidateTrajectorySpec, got "
                f"{type(self.group).__name__} and {type(self.spec).__name__}"
            )
        group, size = self.group, self.group.size
        if self.spec.count != size:
            raise PartialGroupError(
                f"request {quote_value(group.request_id)}: spec.count={self.spec.count} but the group has {size} candidate(s)"
            )
        ids = tuple(self.candidate_ids)
        if ids != group.candidate_ids:
            raise PartialGroupError(
                f"request {quote_value(group.request_id)}: result candidate_ids {quote_value(ids)} do not match the group's "
                f"{quote_value(group.candidate_ids)}"
            )
        seeds = tuple(self.seeds)
        if len(seeds) != size:
            raise PartialGroupError(
                f"request {quote_value(group.request_id)}: {len(seeds)} seed(s) for {size} candidate(s): {quote_value(seeds)}"
            )
        for index, seed in enumerate(seeds):
            check_seed(seed, name=f"seeds[{index}]")
        base_seed = seeds[0] if self.base_seed is None else check_seed(self.base_seed)
        if base_seed != seeds[0]:
            raise PartialGroupError(
                f"request {quote_value(group.request_id)}: base_seed {quote_value(base_seed)} must equal seeds[0] {quote_value(seeds[0])}"
            )
        self._check_tensors()
        object.__setattr__(self, "candidate_ids", ids)
        object.__setattr__(self, "seeds", seeds)
        object.__setattr__(self, "base_seed", base_seed)
        object.__setattr__(self, "reports", tuple(self.reports))
        object.__setattr__(self, "metrics", flatten_reports(self.reports, self.metrics))

    def report(self, kind: type[ReportT]) -> ReportT | None:
        """The result's report of type ``kind`` (e.g. ``UncertaintyReport``), ``None`` when it has none.

        Args:
            kind (`type`): The report class.
        """
        return next((r for r in self.reports if isinstance(r, kind)), None)

    def _check_tensors(self) -> None:
        rid, size, action, candidates = self.group.request_id, self.group.size, self.action, self.candidates
        if not isinstance(action, torch.Tensor) or action.ndim != 2 or not action.is_floating_point():
            got = f"shape {tuple(action.shape)}, {action.dtype}" if isinstance(action, torch.Tensor) else quote_value(action)
            raise PartialGroupError(f"request {quote_value(rid)}: action must be a floating tensor [H, D], got {got}")
        if candidates is None:
            if self.spec.return_candidates:
                raise PartialGroupError(f"request {quote_value(rid)}: return_candidates=True but no candidates were given")
        else:
            if not isinstance(candidates, torch.Tensor) or candidates.ndim != 3:
                got = tuple(candidates.shape) if isinstance(candidates, torch.Tensor) else repr(candidates)
                raise PartialGroupError(f"request {quote_value(rid)}: candidates must be a tensor [N, H, D], got {got}")
            if candidates.shape[0] != size or candidates.shape[1:] != action.shape:
                raise PartialGroupError(
                    f"request {quote_value(rid)}: candidates have shape {tuple(candidates.shape)}, expected "
                    f"{(size, *action.shape)} for {size} candidate(s) and action {tuple(action.shape)}"
                )
            # The plain path must publish its one candidate untouched.
            if self.spec.reducer == "none" and not torch.equal(candidates[0], action):
                raise PartialGroupError(f"request {quote_value(rid)}: with reducer 'none' the action must equal candidate 0")
        valid = self.candidate_valid
        if valid is not None:
            valid = tuple(bool(v) for v in valid)
            if len(valid) != size or not any(valid):
                raise PartialGroupError(
                    f"request {quote_value(rid)}: candidate_valid {quote_value(valid)} must flag {size} candidate(s), at least one valid"
                )
            object.__setattr__(self, "candidate_valid", valid)
            if candidates is not None:
                # Dropped candidates are reported as they came out of the model, NaN included.
                candidates = candidates[torch.tensor(valid, dtype=torch.bool)]
        # An EnsembleResult is what gets published: it never carries NaN/Inf, whichever path built it.
        try:
            check_finite(action, "action")
            if candidates is not None:
                check_finite(candidates, "candidates")
        except NonFiniteCandidatesError as error:
            raise NonFiniteCandidatesError(f"request {quote_value(rid)}: {error}") from None

    @property
    def request_id(self) -> str:
        """The group's request id."""
        return self.group.request_id

    @property
    def size(self) -> int:
        """Number of candidates that went into the result."""
        return self.group.size
