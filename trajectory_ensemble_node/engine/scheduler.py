"""The group scheduler: admission, lockstep microbatches, co-batching, cancellation, failure, retry, metrics.

One engine iteration advances every running group by one denoising step: canceled queued groups end; a pending weight
update waits until no group runs; queued groups are admitted in order when they fit ``max_batch_candidates``;
canceled running groups end; all candidates are packed into as few forwards as capacity allows (each token at its own
timestep); each group steps, and a finished one is completed by :mod:`.completion`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

from ..errors import CapacityError, EngineShutdownError, GroupAbortedError, TrajectoryEnsembleError
from ..metrics import now_ms
from ..seeding import make_generators
from .adapter import CandidateModelAdapter, ForwardAborted, Slice
from .completion import complete_group, named_failure
from .deadline import StepCosts, plan_steps, refuse_unmeetable
from .heap import trim_heap
from .request import EngineConfig, GroupHandle, GroupRequest
from .run import GroupRun
from .status import GroupStatus

logger = logging.getLogger("trajectory_ensemble.engine")


class GroupEngine:
    """Runs candidate groups through a :class:`CandidateModelAdapter`.

    Use it synchronously (``submit`` then ``run_until_idle``) or from a background thread (``start``), as the ROS
    node does. All model work happens on one thread.

    Args:
        adapter (`CandidateModelAdapter`): The model.
        config (`EngineConfig`): Batching policy.
        device (`torch.device`): Device whose peak memory the metrics report.
    """

    def __init__(self, adapter: CandidateModelAdapter, config: EngineConfig, device: torch.device) -> None:
        self.adapter = adapter
        self.config = config
        self.device = torch.device(device)
        self._lock = threading.Condition()
        self._queue: collections.deque[GroupRun] = collections.deque()
        self._running: list[GroupRun] = []
        self._updates: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._driving = threading.Lock()
        # Measured costs, for deadlines (see deadline.py); updated on every group, read only by deadline requests.
        self.costs = StepCosts()

    # --- public API ----------------------------------------------------------------------------------------------

    def check(self, request: GroupRequest, *, refuse_cold: bool = False) -> bool:
        """Every refusal :meth:`submit` makes before queuing, without queuing: capacity, and an unmeetable deadline.

        A caller that must not act on a request the engine would refuse (the node, before a goal may preempt
        another) calls this first; :meth:`submit` calls it again.

        Args:
            request (`GroupRequest`): The built request.
            refuse_cold (`bool`): Refuse a deadline while no step has been measured (see :mod:`.deadline`).

        Returns:
            `bool`: whether the group would run one candidate at a time (``oversize_policy='sequential'``).

        Raises:
            CapacityError: oversize group under ``oversize_policy='reject'``.
            DeadlineUnmeetableError: see :func:`~.deadline.refuse_unmeetable`.
        """
        max_batch = self.config.max_batch_candidates
        sequential = False
        if request.count > max_batch:
            if self.config.oversize_policy == "reject":
                raise CapacityError(
                    f"group {request.request_id!r} has {request.count} candidates, above "
                    f"max_batch_candidates={max_batch}, and oversize_policy='reject'."
                )
            sequential = self.config.oversize_policy == "sequential"
        if request.deadline_s is not None:
            refuse_unmeetable(self.costs, self.adapter, request, sequential, refuse_cold=refuse_cold)
        return sequential

    def submit(self, request: GroupRequest) -> GroupHandle:
        """Queue a group. Validation that needs no model work happens here (:meth:`check`), so bad requests fail
        fast."""
        max_batch = self.config.max_batch_candidates
        sequential = self.check(request)
        handle = GroupHandle(request)
        run = GroupRun(handle=handle, sequential=sequential, submitted_ms=now_ms())
        if request.deadline_s is not None:
            run.deadline_ms = run.submitted_ms + 1000.0 * request.deadline_s
        if request.count > max_batch:
            if sequential:
                run.fallback_reason = (
                    f"{request.count} candidates exceed max_batch_candidates={max_batch}; ran one at a time"
                )
            else:
                run.microbatches = -(-request.count // max_batch)
        with self._lock:
            if self._stopping:
                raise EngineShutdownError(request.request_id, "engine is stopped")
            self._queue.append(run)
            self._lock.notify_all()
        self._progress(run, "queued", 0)
        return handle

    def run_between_groups(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` on the engine thread when no group is running; admission pauses until it has run.

        Running groups finish first, so no group ever sees the state before and after ``fn`` (used for atomic
        weight updates).
        """
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._updates.append((fn, future))
            self._lock.notify_all()
        return future

    def run_until_idle(self) -> None:
        """Drive the engine on the calling thread until nothing is queued or running."""
        if self._thread is not None:
            raise RuntimeError("run_until_idle() is for synchronous use; this engine runs on a background thread.")
        with self._driving:
            while self._iterate():
                pass

    def start(self) -> None:
        """Run the engine on a background daemon thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="trajectory-ensemble-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the engine; every queued or running group ends with :class:`EngineShutdownError`."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._driving:
            for run in list(self._running) + list(self._queue):
                self._fail(run, EngineShutdownError(run.request.request_id, "engine stopped before the group ended"))
            self._running.clear()
            self._queue.clear()
            while self._updates:
                _, future = self._updates.popleft()
                future.cancel()

    @property
    def is_background(self) -> bool:
        """Whether a background thread drives this engine (``start()`` was called and ``stop()`` was not)."""
        return self._thread is not None

    @property
    def is_alive(self) -> bool:
        """Whether the background thread is running (False for a synchronous or stopped engine)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    @property
    def num_running(self) -> int:
        return len(self._running)

    # --- loop ------------------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        was_busy = False
        while True:
            with self._lock:
                if self._stopping:
                    return
            with self._driving:
                busy = self._iterate()
            if was_busy and not busy:
                trim_heap()  # once per busy-to-idle transition (``heap.py``)
            was_busy = busy
            if not busy:
                with self._lock:
                    if not self._stopping and not self._queue and not self._updates:
                        self._lock.wait(timeout=0.5)

    def _iterate(self) -> bool:
        """One engine iteration. Returns False when there was nothing to do."""
        # Serving never needs gradients; without this every step would extend one autograd graph per group, and
        # memory would grow with the step count.
        with torch.no_grad():
            return self._iterate_unguarded()

    def _iterate_unguarded(self) -> bool:
        self._reap_queued_cancels()
        if self._updates and not self._running:
            fn, future = self._updates.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                    future.set_exception(exc)
            return True
        if not self._updates:
            self._admit()
        if not self._running:
            return bool(self._queue or self._updates)
        self._reap_running_cancels()
        if self._running:
            self._denoise_one_step()
        return True

    def _reap_queued_cancels(self) -> None:
        with self._lock:
            canceled = [run for run in self._queue if run.handle.cancel_requested is not None]
            for run in canceled:
                self._queue.remove(run)
        for run in canceled:
            self._fail(run, run.handle.cancel_requested)

    def _reap_running_cancels(self) -> None:
        for run in [r for r in self._running if r.handle.cancel_requested is not None]:
            self._running.remove(run)
            self._release(run)
            self._fail(run, run.handle.cancel_requested)

    def _admit(self) -> None:
        capacity = self.config.max_batch_candidates
        while True:
            with self._lock:
                if not self._queue:
                    return
                run = self._queue[0]
                used = sum(r.slots for r in self._running)
                # Atomic admission: the whole group fits next to the running ones, or it is oversize and runs alone.
                if used + min(run.slots, capacity) > capacity:
                    return
                self._queue.popleft()
            run.admitted_ms = now_ms()
            if self._prepare(run):
                self._running.append(run)
                run.handle._mark(GroupStatus.RUNNING)

    def _prepare(self, run: GroupRun) -> bool:
        request = run.request
        if run.deadline_ms is not None and not self._plan_steps(run, encoded=False):
            return False
        self._progress(run, "encoding", 0)
        started = now_ms()
        try:
            if run.sequential:
                seeds = (request.seeds[run.part],)
            else:
                seeds = request.seeds
            # Fresh generators from the seeds on every (re)start: a partly advanced generator is never reused.
            generators = make_generators(seeds, device=getattr(self.adapter, "generator_device", self.device))
            run.state = self.adapter.prepare(request.payload, generators)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a named terminal state
            self._fail(run, self._named(run, exc, "preparing"))
            return False
        run.encode_ms += now_ms() - started
        self.costs.observe("encode_ms", now_ms() - started)
        return run.deadline_ms is None or self._plan_steps(run)

    def _plan_steps(self, run: GroupRun, encoded: bool = True) -> bool:
        """Before encoding, refuse what the deadline cannot hold; after it, fit the group's step count to it."""
        try:
            run.steps_fitted = plan_steps(self.costs, self.adapter, run.state, run.deadline_ms - now_ms(),
                                           run.request, encoded=encoded)
        except BaseException as exc:  # noqa: BLE001 - every failure becomes a named terminal state
            self._release(run)
            self._fail(run, self._named(run, exc, "planning steps"))
            return False
        return True

    def _plan(self) -> list[list[Slice]]:
        capacity = self.config.max_batch_candidates
        forwards: list[list[Slice]] = [[]]
        room = capacity
        for run in self._running:
            start, count = 0, run.state.count
            run.pending_slices = 0
            while start < count:
                if room == 0:
                    forwards.append([])
                    room = capacity
                stop = min(count, start + room)
                forwards[-1].append(Slice(run.state, start, stop))
                run.pending_slices += 1
                room -= stop - start
                start = stop
        return [f for f in forwards if f]

    def _denoise_one_step(self) -> None:
        iteration_started = now_ms()
        by_state = {id(run.state): run for run in self._running}
        failed: dict[int, BaseException] = {}
        for planned in self._plan():
            # A group that failed in an earlier microbatch of this step is dropped; the others still run.
            slices = [s for s in planned if id(s.state) not in failed]
            if not slices:
                continue
            runs = {id(s.state): by_state[id(s.state)] for s in slices}

            def everyone_canceled(runs=runs) -> bool:
                return all(r.handle.cancel_requested is not None for r in runs.values())

            started = now_ms()
            try:
                forwards = int(self.adapter.forward(slices, should_abort=everyone_canceled))
            except ForwardAborted:
                # Every group in this forward was canceled mid-forward; they are reaped below, nothing failed.
                continue
            except BaseException as exc:  # noqa: BLE001 - fails exactly the groups in this forward
                for key in runs:
                    failed[key] = exc
                continue
            elapsed = now_ms() - started
            for run in runs.values():
                run.physical_forwards += forwards
                run.co_batched_max = max(run.co_batched_max, len(runs))
                run.denoise_ms += elapsed
        for run in list(self._running):
            error = failed.get(id(run.state))
            if error is not None:
                self._running.remove(run)
                self._release(run)
                self._retry_or_fail(run, error)
        # Cancels that arrived during the forwards end now, without taking the step.
        self._reap_running_cancels()
        for run in list(self._running):
            started = now_ms()
            try:
                self.adapter.step(run.state)
                if run.deadline_ms is not None and run.state.step_index < run.state.num_steps:
                    own_step_ms = (run.denoise_ms + now_ms() - started) / run.state.step_index
                    if self.costs.one_more_step_overruns(now_ms(), run.deadline_ms, own_step_ms):
                        # Anytime result: stop here, from the clean estimate of the step just taken.
                        self.adapter.finish_now(run.state)
            except BaseException as exc:  # noqa: BLE001
                self._running.remove(run)
                self._release(run)
                self._retry_or_fail(run, exc)
                continue
            run.denoise_ms += now_ms() - started
            total = run.state.num_steps
            done_steps = run.state.step_index
            if run.sequential:
                done_steps += run.part * total
                total *= run.request.count
            self._progress(run, "denoising", done_steps, total)
            if run.state.step_index >= run.state.num_steps:
                finishing = now_ms()
                self._finish_part(run)
                iteration_started += now_ms() - finishing  # post-processing is estimated on its own (post_ms)
        self.costs.observe("step_ms", now_ms() - iteration_started)

    def _finish_part(self, run: GroupRun) -> None:
        started = now_ms()
        try:
            run.outputs.append(self.adapter.finish(run.state))
        except BaseException as exc:  # noqa: BLE001
            self._running.remove(run)
            self._release(run)
            self._fail(run, self._named(run, exc, "post-processing"))
            return
        run.outputs[-1].extras.setdefault("postprocess_ms", now_ms() - started)
        self._release(run)
        if run.sequential and run.part + 1 < run.request.count:
            run.part += 1
            if not self._prepare(run):
                self._running.remove(run)
            return
        self._running.remove(run)
        self._complete(run)

    def _complete(self, run: GroupRun) -> None:
        self._progress(run, "reducing", run.request.count)
        try:
            result = complete_group(run, self.adapter, self.device, self.costs)
        except BaseException as exc:  # noqa: BLE001
            self._fail(run, self._named(run, exc, "reducing"))
            return
        run.handle.metrics = dict(result.metrics)
        run.handle._finish(result, None)

    # --- failure paths ---------------------------------------------------------------------------------------------

    def _retry_or_fail(self, run: GroupRun, exc: BaseException) -> None:
        budget = run.request.max_retries if run.request.max_retries is not None else self.config.max_retries
        if run.retries < budget and not isinstance(exc, TrajectoryEnsembleError):
            logger.warning("group %s failed (%s); rerunning it whole from its seeds", run.request.request_id, exc)
            run.restart()
            run.handle._mark(GroupStatus.WAITING)
            with self._lock:
                self._queue.appendleft(run)
            return
        self._fail(run, self._named(run, exc, "denoising"))

    def _named(self, run: GroupRun, exc: BaseException, stage: str) -> BaseException:
        return named_failure(run, exc, stage)

    def _fail(self, run: GroupRun, error: BaseException | None) -> None:
        assert error is not None
        if not isinstance(error, GroupAbortedError):
            logger.info("group %s ended: %s: %s", run.request.request_id, type(error).__name__, error)
        run.handle._finish(None, error)

    def _release(self, run: GroupRun) -> None:
        if run.state is not None:
            try:
                self.adapter.release(run.state)
            finally:
                run.state = None

    @staticmethod
    def _progress(run: GroupRun, stage: str, step: int, total: int | None = None) -> None:
        run.request.report_progress(stage, step, step if total is None else total)
