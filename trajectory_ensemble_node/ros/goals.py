"""Goal handling: goal validation into a candidate spec, the goal policy (preempt / queue / reject), preemption.

:func:`plan_action_goal` turns a goal into a :class:`~trajectory_ensemble_node.serving.planning.GoalPlan`; the
:class:`GoalTracker` decides under one lock when a :class:`GoalRecord` may run (at most :data:`MAX_QUEUED_GOALS`
waiting; the policies: docs/node.md, "Goals"). A stop that arrives before the group exists is remembered, and
:meth:`GoalRecord.attach` cancels the group as soon as it is submitted. No rclpy.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine import GroupHandle, ProgressEvent
from ..engine.status import ABORT_ERRORS, GOAL_COUNTERS, GroupStatus
from ..errors import AbortReason, EngineShutdownError, GoalRejectedError, GroupAbortedError
from ..quoting import quote_value
from ..serving.params import NodeParams
from ..serving.planning import GoalPlan, PlanRequest, plan_goal
from .goal_state import GOAL_STATE_OF, OUTCOME_COUNTER, GoalState, next_state, terminal_state

MAX_QUEUED_GOALS = 8
"""With ``goal_policy: queue``, goals waiting beyond this many are rejected (each waiting goal holds a thread)."""

GOAL_OUTCOMES = GOAL_COUNTERS  # ("succeeded", "aborted", "canceled", "preempted", "rejected"), from GroupStatus


def goal_id_str(goal_id: Any) -> str:
    """A ``unique_identifier_msgs/UUID`` as the canonical dashed string clients print."""
    return str(uuid.UUID(bytes=bytes(bytearray(goal_id.uuid))))


def goal_request(goal: Any) -> PlanRequest:
    """A ``GenerateTrajectory.Goal`` as the neutral :class:`~trajectory_ensemble_node.serving.planning.PlanRequest`."""
    # getattr: goals built by older clients (and tests' plain namespaces) may lack the closed-loop fields.
    deadline = getattr(goal, "deadline", None)
    stamp = getattr(goal, "min_observation_stamp", None)
    return PlanRequest(
        instruction=goal.instruction,
        candidate_count=int(goal.candidate_count),
        reducer=goal.reducer,
        seed=int(goal.seed) if goal.use_seed else None,
        return_candidates=bool(goal.return_candidates),
        rollout=bool(goal.rollout),
        continue_previous=bool(getattr(goal, "continue_previous", False)),
        reset_context=bool(getattr(goal, "reset_context", False)),
        inference_delay=int(getattr(goal, "inference_delay", 0)),
        guidance=getattr(goal, "guidance", ""),
        deadline_s=0.0 if deadline is None else float(deadline.sec) + float(deadline.nanosec) * 1e-9,
        min_observation_stamp=None if stamp is None else (stamp.sec, stamp.nanosec),
    )


def plan_action_goal(
    goal: Any, params: NodeParams, *, default_instruction: str, valid_reducers: Sequence[str]
) -> GoalPlan:
    """Validate a ``GenerateTrajectory.Goal`` before any model work: :func:`goal_request`, then the faces' shared
    :func:`~trajectory_ensemble_node.serving.planning.plan_goal` (its Args and Raises hold)."""
    return plan_goal(goal_request(goal), params, default_instruction=default_instruction,
                     valid_reducers=valid_reducers)


_STOPS: dict[GoalState, tuple[type[GroupAbortedError], AbortReason]] = {
    GOAL_STATE_OF[status]: (ABORT_ERRORS[status.reason], status.reason) for status in (
        GroupStatus.FINISHED_CANCELED, GroupStatus.FINISHED_PREEMPTED, GroupStatus.FINISHED_SHUTDOWN,
        GroupStatus.FINISHED_NOT_ACTIVE) if status.reason is not None
}
"""The states another thread can stop a goal in, with the error it ends with and the reason its group is canceled."""


@dataclass
class GoalRecord:
    """One accepted goal: its :class:`~.goal_state.GoalState` and what its thread, the cancel callback and newer goals
    share about it.

    Every state change goes through :meth:`transition` (:func:`~.goal_state.next_state` decides it), under one lock.
    A stop (a cancel, a preemption, shutdown or deactivation) can come from any thread at any time, also before the
    goal's group exists (it may still be validating): the state remembers it, :meth:`attach` then cancels the group
    as soon as it is submitted, and :meth:`stop_error` is the named error the goal ends with.

    Args:
        goal_id (`str`): The goal's UUID string.
        events (`queue.Queue`): Progress events from the engine thread; ``None`` wakes the goal's thread (its group
            ended, or the goal was stopped).
        on_stop (`Callable[[GoalRecord], None]`, *optional*): Called after the goal is stopped from outside, so
            whatever it waits on (a frame, a slot) is woken at once.
    """

    goal_id: str
    accepted: float = field(default_factory=time.monotonic)
    events: queue.Queue = field(default_factory=queue.Queue)
    on_stop: Callable[[GoalRecord], None] | None = None
    plan: GoalPlan | None = None
    """Set once the goal validated (the error paths report its ``base_seed``)."""
    observation: Any = None
    """The observation the submitted group runs on (its stamp goes on the published trajectory)."""
    continuity: Any = None
    """The :class:`~.continuity.ContinuityDecision` the submitted group runs with."""
    decided_clock: float | None = None
    """Seconds of the node's ROS clock when its observation and continuity were decided (sim time under
    ``use_sim_time``); its serving latency runs from here to publication."""
    elapsed_s: float = 0.0
    """Seconds since its observation's stamp at that moment (the known part of its latency)."""
    epoch: int = 0
    """The chunk memory's clock epoch at that moment (a clock jump since voids its latency and its chunk)."""
    handle: GroupHandle | None = None
    cancel_processed: threading.Event = field(default_factory=threading.Event, repr=False)
    """Set once the action server has moved the goal to CANCELING (after the cancel callback returned)."""
    _state: GoalState = GoalState.ACCEPTED
    _why: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def state(self) -> GoalState:
        with self._lock:
            return self._state

    def transition(self, to: GoalState, why: str = "") -> bool:
        """Move to ``to``, if the lifecycle allows it now.

        Args:
            to (`GoalState`): The next state.
            why (`str`): What ended the goal (kept for its error message), for a stop.

        Returns:
            `bool`: False when the goal had already ended (too late: the move is refused).

        Raises:
            IllegalGoalTransitionError: a move the lifecycle never allows from the current live state.
        """
        with self._lock:
            if next_state(self._state, to) is None:
                return False
            self._state, self._why = to, why or self._why
        return True

    def on_progress(self, event: ProgressEvent) -> None:
        """Engine-thread callback: hand the event to the goal's thread (publishing happens there, not here)."""
        self.events.put(event)

    def attach(self, handle: GroupHandle) -> None:
        """Remember the submitted group; cancel it at once if the goal was stopped meanwhile."""
        with self._lock:
            self.handle = handle
        handle.add_done_callback(lambda _handle: self.events.put(None))
        self._cancel_handle()

    def stop(self, state: GoalState, why: str) -> bool:
        """End the goal from outside its thread: cancel its group at the next step and wake its thread now.

        Args:
            state (`GoalState`): ``CANCELED``, ``PREEMPTED``, ``SHUTDOWN`` or ``NOT_ACTIVE``.
            why (`str`): The message the goal ends with.

        Returns:
            `bool`: False when the goal had already ended or committed to its result (the stop comes too late).
        """
        if state not in _STOPS:
            raise ValueError(f"a goal is stopped as one of {[s.value for s in _STOPS]}, got {quote_value(state.value)}")
        if not self.transition(state, why):
            return False
        self._cancel_handle()
        # End the goal now rather than when the engine reaches the group: the engine may be inside an encode it
        # cannot interrupt (seconds on a loaded CPU), and under a burst each waiting goal holds an executor thread.
        self.events.put(None)
        if self.on_stop is not None:
            self.on_stop(self)
        return True

    def preempt(self, by: str) -> bool:
        """A newer goal takes this goal's slot (see :meth:`stop`)."""
        return self.stop(GoalState.PREEMPTED, f"preempted by {by}")

    def request_cancel(self) -> bool:
        """The client canceled (see :meth:`stop`); False when the cancel comes too late."""
        return self.stop(GoalState.CANCELED, f"goal {self.goal_id} canceled by the client")

    def claim_success(self) -> GroupAbortedError | None:
        """Commit to publishing the finished group's result, unless a stop came first.

        ``RUNNING -> SUCCEEDED``: afterwards every stop is refused, so a goal is never both published and reported
        as preempted or canceled.

        Returns:
            `GroupAbortedError` or `None`: the stop that came first, if one did.
        """
        if self.transition(GoalState.SUCCEEDED):
            return None
        return self.stop_error()

    def finish(self, code: int) -> GoalState:
        """The goal's thread ends it with ``code``: move to that code's terminal state unless a stop came first.

        Returns:
            `GoalState`: the state the goal ends in (the stop's, when one came first).
        """
        self.transition(terminal_state(code))
        return self.state

    def stop_error(self) -> GroupAbortedError | None:
        """The error the goal ends with because it was stopped from outside, or ``None``."""
        with self._lock:
            state, why = self._state, self._why
        if state not in _STOPS:
            return None
        cls, _ = _STOPS[state]
        return cls(self.goal_id, why)

    def _cancel_handle(self) -> None:
        with self._lock:
            handle, state, why = self.handle, self._state, self._why
        if handle is not None and state in _STOPS:
            handle.cancel(_STOPS[state][1], why)


class GoalTracker:
    """Which goals run, which wait, and the outcome counters. Thread-safe.

    Args:
        policy (`str`): ``preempt``, ``queue`` or ``reject``.
        max_concurrent (`int`): Goals allowed to run (and co-batch) at once.
        on_stop (`Callable[[GoalRecord], None]`, *optional*): Given to every record (see :class:`GoalRecord`).
    """

    def __init__(self, policy: str, max_concurrent: int,
                 on_stop: Callable[[GoalRecord], None] | None = None) -> None:
        self.policy = policy
        self.max_concurrent = max_concurrent
        self._on_stop = on_stop
        self._cond = threading.Condition()
        self._running: list[GoalRecord] = []
        self._waiting: list[GoalRecord] = []
        self._active: dict[str, GoalRecord] = {}
        self._closed = False
        self.counters: dict[str, int] = dict.fromkeys(GOAL_OUTCOMES, 0)

    # --- goal callback ----------------------------------------------------------------------------------------------

    def should_reject(self) -> str | None:
        """Called before accepting a goal: the reason to reject it now, or ``None`` (then count nothing yet)."""
        with self._cond:
            if self._closed:
                return "the node is shutting down"
            if self.policy == "reject" and len(self._active) >= self.max_concurrent:
                return f"{len(self._active)} goal(s) running and goal_policy is reject"
            if self.policy == "queue" and len(self._active) >= self.max_concurrent + MAX_QUEUED_GOALS:
                return f"{MAX_QUEUED_GOALS} goals already queued"
        return None

    def reject(self) -> None:
        """Count a goal rejected at the goal callback (it never got a record)."""
        with self._cond:
            self.counters["rejected"] += 1

    # --- execute thread -------------------------------------------------------------------------------------------

    def register(self, goal_id: str) -> GoalRecord:
        """Track an accepted goal (the cancel callback finds it by id)."""
        record = GoalRecord(goal_id, on_stop=self._stopped)
        with self._cond:
            self._active[goal_id] = record
        return record

    def find(self, goal_id: str) -> GoalRecord | None:
        with self._cond:
            return self._active.get(goal_id)

    def admit(self, record: GoalRecord) -> bool:
        """Block until ``record`` may run, applying the goal policy; the record is then ``RUNNING``.

        Returns:
            `bool`: True when the goal had to wait in the queue (its observation may be outdated by now).

        Raises:
            GroupAbortedError: the record was stopped (preempted, canceled, shut down, deactivated) meanwhile.
            GoalRejectedError: ``reject`` policy and no slot is free (a race past :meth:`should_reject`).
            EngineShutdownError: the node is shutting down.
        """
        waited = False
        with self._cond:
            while True:
                if self._closed:
                    raise EngineShutdownError(record.goal_id, "the node is shutting down")
                stop = record.stop_error()
                if stop is not None:
                    raise stop
                if len(self._running) < self.max_concurrent:
                    if not record.transition(GoalState.RUNNING):
                        raise record.stop_error() or EngineShutdownError(record.goal_id, "the goal ended")
                    self._running.append(record)
                    if record in self._waiting:
                        self._waiting.remove(record)
                    return waited
                if self.policy == "preempt":
                    # Oldest (by acceptance) first: its observation is the most outdated. A goal that was
                    # accepted before a running one but finished validating later is itself the oldest.
                    contenders = sorted([*self._running, record], key=lambda r: r.accepted)
                    newest = contenders[-1]
                    for victim in contenders[: len(contenders) - self.max_concurrent]:
                        if victim is record:
                            record.preempt(newest.goal_id)
                            raise record.stop_error()  # type: ignore[misc]
                        self._running.remove(victim)
                        victim.preempt(record.goal_id)
                    continue
                if self.policy == "reject":
                    raise GoalRejectedError(f"{len(self._running)} goal(s) running and goal_policy is reject")
                if record not in self._waiting:
                    record.transition(GoalState.QUEUED)
                    self._waiting.append(record)
                waited = True
                # Woken by release(), by a stop of this record (_stopped) and by close(): no timeout needed.
                self._cond.wait()

    def _stopped(self, record: GoalRecord) -> None:
        with self._cond:
            self._cond.notify_all()
        if self._on_stop is not None:
            self._on_stop(record)

    def release(self, record: GoalRecord) -> None:
        """The goal reached its terminal state: count it by that state, free its slot and forget it."""
        with self._cond:
            if record.goal_id in self._active:
                # A goal is released after its thread ended it; a live state here is a bug, counted as aborted.
                self.counters[OUTCOME_COUNTER.get(record.state, "aborted")] += 1
            if record in self._running:
                self._running.remove(record)
            if record in self._waiting:
                self._waiting.remove(record)
            self._active.pop(record.goal_id, None)
            self._cond.notify_all()

    # --- node -------------------------------------------------------------------------------------------------------

    def stop_all(self, state: GoalState, why: str) -> int:
        """Stop every running or waiting goal (``SHUTDOWN`` or ``NOT_ACTIVE``); returns how many were stopped."""
        with self._cond:
            records = list(self._active.values())
        return sum(record.stop(state, why) for record in records)

    def close(self) -> None:
        """Shutdown: every running or waiting goal ends with SHUTDOWN now; no new goal is accepted."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.stop_all(GoalState.SHUTDOWN, "the node is shutting down")

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no goal is tracked (every thread has released its goal); False when ``timeout_s`` passed."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._active, timeout_s)

    def canceled_records(self) -> list[GoalRecord]:
        """The goals a client canceled that are still tracked (their threads are ending them)."""
        with self._cond:
            return [r for r in self._active.values() if r.state is GoalState.CANCELED]

    @property
    def num_active(self) -> int:
        with self._cond:
            return len(self._active)

    @property
    def num_running(self) -> int:
        with self._cond:
            return len(self._running)

    @property
    def num_waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    def snapshot(self) -> dict[str, int]:
        """Counters plus running/waiting gauges, for diagnostics."""
        with self._cond:
            return {**self.counters, "running": len(self._running), "waiting": len(self._waiting)}
