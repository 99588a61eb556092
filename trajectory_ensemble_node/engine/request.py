"""A candidate group as the engine sees it: the request going in, and the handle a caller waits on."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..contract import CandidateGroup, CandidateTrajectorySpec, EnsembleResult, check_request
from ..errors import (
    AbortReason,
    GroupAbortedError,
    GroupCanceledError,
    GroupPreemptedError,
    InvalidSpecError,
)
from ..normalization import ActionNormalizer
from ..reducers import Reducer, configured_reducer
from ..seeding import candidate_seeds, fresh_base_seed
from ..uncertainty import NoveltyCheck
from .context import ExecutionContext
from .deadline import check_deadline
from .status import GroupStatus, status_for_error
from .validity import ValidityCheck

OVERSIZE_POLICIES = ("microbatch", "sequential", "reject")


@dataclass(frozen=True)
class EngineConfig:
    """How the group scheduler batches.

    Args:
        max_batch_candidates (`int`): Most candidates in one physical forward. A group is admitted atomically
            when it fits next to the running groups.
        oversize_policy (`str`): What a group larger than ``max_batch_candidates`` does:
            ``"microbatch"`` runs it as lockstep microbatches (same step for every slice, one shared stepper state),
            ``"sequential"`` runs its candidates one after another through the plain count=1 path (the documented
            fallback; ``fallback_reason`` says why), ``"reject"`` refuses it at submission. Never truncated.
        max_retries (`int`): How many times a group whose forward raised is rerun whole, from its seeds.
    """

    max_batch_candidates: int = 16
    oversize_policy: str = "microbatch"
    max_retries: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.max_batch_candidates, int) or self.max_batch_candidates < 1:
            raise InvalidSpecError(f"max_batch_candidates must be an int >= 1, got {self.max_batch_candidates!r}.")
        if self.oversize_policy not in OVERSIZE_POLICIES:
            raise InvalidSpecError(
                f"oversize_policy must be one of {list(OVERSIZE_POLICIES)}, got {self.oversize_policy!r}."
            )
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise InvalidSpecError(f"max_retries must be an int >= 0, got {self.max_retries!r}.")


@dataclass(frozen=True)
class ProgressEvent:
    """Reported to ``GroupRequest.on_progress`` on the engine thread; keep the callback short."""

    request_id: str
    stage: str  # "queued", "encoding", "denoising", "reducing"
    step: int
    total_steps: int


@dataclass
class GroupRequest:
    """One logical prediction: a candidate group plus the model-specific payload that conditions it.

    Args:
        group (`CandidateGroup`): Identity of the group and its candidates.
        spec (`CandidateTrajectorySpec`): Count, reducer, whether candidates are returned, seed policy.
        seeds (`tuple[int, ...]`): One seed per candidate (``seeds[0] == base_seed``), owned by the request.
        payload (`Any`): Adapter-specific request (prompt, observation, steps, ...).
        reducer (`Reducer`, *optional*): The validated reducer (``None`` only for ``reducer="none"``).
        normalizer (`ActionNormalizer`, *optional*): Denormalizes candidates into robot units when configured.
        on_progress (`Callable[[ProgressEvent], None]`, *optional*): Progress callback.
        max_retries (`int`, *optional*): Overrides the engine's retry budget for this group.
        validity (`ValidityCheck`, *optional*): Limits, survivors needed, clamp policy, ``dt`` and current state;
            ``None`` checks NaN/Inf only (see :mod:`.validity`).
        deadline_s (`float`, *optional*): Seconds from submission by which the result must exist; 0/``None``: none
            (see :mod:`.deadline`).
        uncertainty_threshold (`float`, *optional*): Calibrated score threshold; the result metrics then say
            ``uncertain`` when the score exceeds it.
        context (`ExecutionContext`, *optional*): The chunk being executed; continuity-aware reducers score
            candidates against it (see :mod:`.context`).
        novelty (`NoveltyCheck`, *optional*): Observation novelty scorer and calibrated alarm rule; the adapter
            must then return the observation embedding (``OBSERVATION_EMBEDDING``). ``None``: metrics as without it.
    """

    group: CandidateGroup
    spec: CandidateTrajectorySpec
    seeds: tuple[int, ...]
    payload: Any
    reducer: Reducer | None = None
    normalizer: ActionNormalizer | None = None
    on_progress: Callable[[ProgressEvent], None] | None = None
    max_retries: int | None = None
    validity: ValidityCheck | None = None
    deadline_s: float | None = None
    uncertainty_threshold: float | None = None
    context: ExecutionContext | None = None
    novelty: NoveltyCheck | None = None

    def __post_init__(self) -> None:
        self.deadline_s = check_deadline(self.deadline_s)
        if self.novelty is not None and not isinstance(self.novelty, NoveltyCheck):
            raise InvalidSpecError(f"novelty must be a NoveltyCheck, got {type(self.novelty).__name__}.")
        if self.validity is not None and not isinstance(self.validity, ValidityCheck):
            raise InvalidSpecError(f"validity must be a ValidityCheck, got {type(self.validity).__name__}.")
        threshold = self.uncertainty_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                      or not 0 <= threshold < float("inf")):
            raise InvalidSpecError(f"uncertainty_threshold must be a finite number >= 0, got {threshold!r}.")
        if len(self.seeds) != self.spec.count or self.group.size != self.spec.count:
            raise InvalidSpecError(
                f"Group {self.group.request_id!r} has {self.group.size} candidate ids and {len(self.seeds)} seeds "
                f"for count={self.spec.count}."
            )
        if self.spec.reducer != "none" and (self.reducer is None or self.reducer.name != self.spec.reducer):
            raise InvalidSpecError(f"Request reducer does not match spec.reducer={self.spec.reducer!r}.")

    @property
    def request_id(self) -> str:
        return self.group.request_id

    @property
    def count(self) -> int:
        return self.spec.count

    @property
    def base_seed(self) -> int:
        return self.seeds[0]

    def report_progress(self, stage: str, step: int, total: int) -> None:
        """Tell ``on_progress`` (on the caller's thread, the engine's or a remote group's); a broken callback is
        logged and ends nothing."""
        if self.on_progress is None:
            return
        try:
            self.on_progress(ProgressEvent(self.request_id, stage, step, total))
        except Exception:  # noqa: BLE001 - a broken callback must not take the engine or a group down
            logging.getLogger("trajectory_ensemble.engine").exception("progress callback of group %s raised",
                                                                      self.request_id)


def new_group(spec: CandidateTrajectorySpec | None, *, base_seed: int | None, request_id: str | None, max_count: int,
              action_dim: int, valid_reducers: Sequence[str], domain_name: str, mode_threshold: float | None
              ) -> tuple[CandidateTrajectorySpec, tuple[int, ...], CandidateGroup, Reducer | None]:
    """The spec, seeds, ids and reducer of a group, the same for every served model's ``make_request``.

    Args:
        spec (`CandidateTrajectorySpec`, *optional*): As asked (``None``: one candidate); held to ``max_count``.
        base_seed (`int`, *optional*): The request's seed (``None``: a fresh one). request_id (`str`, *optional*):
            The group's id (``None``: a fresh one).
        max_count (`int`), action_dim (`int`), valid_reducers (`Sequence[str]`), domain_name (`str`): What the
            spec is checked against (``contract.check_request``, the same messages as a goal or a parameter file).
        mode_threshold (`float`, *optional*): The model's fixed cut for ``mode`` (``configured_reducer``).

    Returns:
        `tuple`: the checked spec, the seeds ``[count]``, the group and its reducer (``None`` for ``"none"``).

    Raises:
        InvalidSpecError: and its subclasses (count above the maximum, unknown reducer, reducer invalid for the
            action layout, seed).
    """
    spec = spec or CandidateTrajectorySpec(max_count=max_count)
    spec = check_request(spec.count, spec.reducer, max_count=max_count, action_dim=action_dim,
                         valid_reducers=valid_reducers, domain_name=domain_name,
                         return_candidates=spec.return_candidates, seed_policy=spec.seed_policy, base_seed=base_seed)
    reducer = None if spec.reducer == "none" else configured_reducer(spec.reducer, mode_threshold)
    seeds = candidate_seeds(fresh_base_seed() if base_seed is None else base_seed, spec.count, spec.seed_policy)
    return spec, seeds, CandidateGroup.for_spec(request_id or uuid.uuid4().hex, spec), reducer


class GroupHandle:
    """The caller's view of a submitted group: wait for it, or cancel it. Thread-safe.

    Every handle reaches exactly one terminal state: a result, or a :class:`GroupAbortedError` subclass (canceled,
    preempted, failed, shutdown) or another named error. There is never a partial aggregate.
    """

    def __init__(self, request: GroupRequest) -> None:
        self.request = request
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._result: EnsembleResult | None = None
        self._error: BaseException | None = None
        self._cancel: GroupAbortedError | None = None
        self._callbacks: list[Callable[[GroupHandle], None]] = []
        self._status = GroupStatus.WAITING
        self.metrics: dict[str, Any] = {}

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def cancel(self, reason: AbortReason = AbortReason.CANCELED, message: str = "") -> bool:
        """Ask the engine to stop the group at its next denoising step.

        Args:
            reason (`AbortReason`): ``CANCELED`` (client cancel) or ``PREEMPTED`` (a newer goal took over).
            message (`str`): Detail for the error, e.g. ``"preempted by <goal id>"``.

        Returns:
            `bool`: False when the group had already ended.
        """
        with self._lock:
            if self._done.is_set():
                return False
            if self._cancel is None:
                cls = GroupPreemptedError if reason == AbortReason.PREEMPTED else GroupCanceledError
                self._cancel = cls(self.request_id, message or f"group {self.request_id} {reason.value}")
            return True

    @property
    def status(self) -> GroupStatus:
        """Where the group is (``WAITING``, ``RUNNING``) or how it ended (a ``FINISHED_*`` status with its reason)."""
        return self._status

    @property
    def cancel_requested(self) -> GroupAbortedError | None:
        return self._cancel

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> EnsembleResult:
        """Block until the group ends; return its result or raise its named error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"group {self.request_id} did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def add_done_callback(self, callback: Callable[[GroupHandle], None]) -> None:
        """Call ``callback(handle)`` when the group ends (immediately if it already has)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    # --- engine side ---------------------------------------------------------------------------------------------

    def _mark(self, status: GroupStatus) -> None:
        """Engine side: the group was admitted (``RUNNING``) or queued again for a retry (``WAITING``)."""
        with self._lock:
            if not self._done.is_set():
                self._status = status

    def _finish(self, result: EnsembleResult | None, error: BaseException | None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._result, self._error = result, error
            self._status = status_for_error(error)
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)
