"""One outcome vocabulary (issue 46): over every error code, the group status decides the service count, the goal's
terminal state, its ``/diagnostics`` counter and the stop table, and they agree with what the code paths did before
the status existed (the reference ladders below are the removed code, verbatim in effect)."""

from __future__ import annotations

import collections
import threading
from types import SimpleNamespace

import pytest

import trajectory_ensemble_node.service  # noqa: F401 - loads every layer's named errors
from trajectory_ensemble_node.engine import GroupHandle, GroupStatus
from trajectory_ensemble_node.engine.status import (
    ABORT_ERRORS,
    FINISHED,
    GOAL_COUNTERS,
    status_for_code,
    status_for_error,
)
from trajectory_ensemble_node.errors import (
    AbortReason,
    EngineShutdownError,
    ErrorCode,
    GroupAbortedError,
    GroupCanceledError,
    GroupPreemptedError,
    NotActiveError,
    RemoteRefusalError,
    TrajectoryEnsembleError,
    error_table,
)
from trajectory_ensemble_node.ros import goals
from trajectory_ensemble_node.ros.goal_state import OUTCOME_COUNTER, GoalState, terminal_state
from trajectory_ensemble_node.service import EnsembleService


# --- what the code did before GroupStatus ----------------------------------------------------------------------------


def old_service_count(error: BaseException | None) -> str:
    if error is None:
        return "succeeded"
    if isinstance(error, GroupPreemptedError):
        return "preempted"
    if isinstance(error, GroupCanceledError):
        return "canceled"
    if isinstance(error, EngineShutdownError):
        return "shutdown"
    return "failed"


_OLD_KIND_STATE = {"refusal": GoalState.REFUSED, "observation": GoalState.REFUSED,
                   "configuration": GoalState.REFUSED, "engine failure": GoalState.FAILED}
_OLD_LIFECYCLE_STATE = {ErrorCode.CANCELED: GoalState.CANCELED, ErrorCode.PREEMPTED: GoalState.PREEMPTED,
                        ErrorCode.SHUTDOWN: GoalState.SHUTDOWN, ErrorCode.NOT_ACTIVE: GoalState.NOT_ACTIVE}


def old_terminal_state(code: int) -> GoalState:
    error = ErrorCode(code)
    if error == ErrorCode.OK:
        return GoalState.SUCCEEDED
    if error in _OLD_LIFECYCLE_STATE:
        return _OLD_LIFECYCLE_STATE[error]
    return _OLD_KIND_STATE[{name: kind for name, _, kind, _ in error_table()}[error.name]]


OLD_OUTCOME_COUNTER = {
    GoalState.SUCCEEDED: "succeeded", GoalState.REFUSED: "aborted", GoalState.FAILED: "aborted",
    GoalState.CANCELED: "canceled", GoalState.PREEMPTED: "preempted", GoalState.SHUTDOWN: "aborted",
    GoalState.NOT_ACTIVE: "aborted",
}
OLD_GOAL_OUTCOMES = ("succeeded", "aborted", "canceled", "preempted", "rejected")
OLD_STOPS = {
    GoalState.CANCELED: (GroupCanceledError, AbortReason.CANCELED),
    GoalState.PREEMPTED: (GroupPreemptedError, AbortReason.PREEMPTED),
    GoalState.SHUTDOWN: (EngineShutdownError, AbortReason.SHUTDOWN),
    GoalState.NOT_ACTIVE: (NotActiveError, AbortReason.NOT_ACTIVE),
}


# --- the errors each code is raised as ------------------------------------------------------------------------------


def _named_errors() -> list[type[TrajectoryEnsembleError]]:
    found, todo = [], [TrajectoryEnsembleError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def errors_for(code: ErrorCode) -> list[BaseException]:
    """Every named error class that carries ``code``, instantiated; a bare one for a code no class carries (every
    code is checked, and the engine only ever ends a group with a named error or an engine failure)."""
    out: list[BaseException] = []
    for cls in _named_errors():
        if cls.code != code:
            continue
        if cls is RemoteRefusalError:  # a remote's error frame: its code, class name and message as sent
            out.append(cls(int(code), "SomeRemoteError", "m"))
        else:
            out.append(cls("r", "m") if issubclass(cls, GroupAbortedError) else cls("m"))
    return out or [type("Bare", (TrajectoryEnsembleError,), {"code": code})("m")]


CODES = [code for code in ErrorCode]


@pytest.mark.parametrize("code", CODES, ids=lambda c: c.name)
def test_every_code_derives_status_counters_and_goal_state_as_before(code):
    status = status_for_code(code)
    assert status.finished and status in FINISHED
    # The goal: its terminal state, and the /diagnostics goals_<name> counter it adds to.
    assert terminal_state(code) == old_terminal_state(code)
    assert OUTCOME_COUNTER[terminal_state(code)] == OLD_OUTCOME_COUNTER[old_terminal_state(code)]
    assert status.goal_counter == OLD_OUTCOME_COUNTER[old_terminal_state(code)]
    assert f"goals_{status.goal_counter}" in {f"goals_{name}" for name in goals.GOAL_OUTCOMES}
    if code == ErrorCode.OK:
        assert status is GroupStatus.FINISHED_SUCCEEDED and status.reason is None
        assert status.service_counter == old_service_count(None)
        return
    for error in errors_for(code):
        # The service count, from the group status the engine gives the handle.
        assert status_for_error(error) is status
        assert status.service_counter == old_service_count(error), type(error).__name__
        if isinstance(error, GroupAbortedError) and status.reason is not None:
            assert error.reason == status.reason
            # What a stop of this reason raises ends in the very same status.
            assert status_for_code(ABORT_ERRORS[status.reason].code) is status


def test_an_error_that_is_not_named_is_an_engine_failure():
    assert status_for_error(RuntimeError("boom")) is GroupStatus.FINISHED_FAILED
    assert status_for_error(RuntimeError("boom")).service_counter == old_service_count(RuntimeError("boom"))
    assert status_for_error(None) is GroupStatus.FINISHED_SUCCEEDED
    with pytest.raises(ValueError, match="999"):
        status_for_code(999)


def test_the_derived_tables_keep_their_names_and_values():
    assert goals.GOAL_OUTCOMES == GOAL_COUNTERS == OLD_GOAL_OUTCOMES
    assert OUTCOME_COUNTER == OLD_OUTCOME_COUNTER and list(OUTCOME_COUNTER) == list(OLD_OUTCOME_COUNTER)
    assert goals._STOPS == OLD_STOPS and list(goals._STOPS) == list(OLD_STOPS)
    assert [s for s in GroupStatus if not s.finished] == [GroupStatus.WAITING, GroupStatus.RUNNING]
    assert all(s.reason is None and s.service_counter == "" == s.goal_counter for s in GroupStatus if not s.finished)


@pytest.mark.parametrize("error", [None, GroupCanceledError("r", "m"), GroupPreemptedError("r", "m"),
                                   EngineShutdownError("r", "m"), NotActiveError("r", "m"), RuntimeError("m")],
                         ids=lambda e: type(e).__name__)
def test_a_handle_carries_its_status_and_the_service_counts_it(error):
    handle = GroupHandle(SimpleNamespace(request_id="r"))  # type: ignore[arg-type]
    assert handle.status is GroupStatus.WAITING
    handle._mark(GroupStatus.RUNNING)
    assert handle.status is GroupStatus.RUNNING
    service = SimpleNamespace(_outcomes=collections.Counter(), _outcomes_lock=threading.Lock())
    handle.add_done_callback(lambda h: EnsembleService._count_outcome(service, h))  # type: ignore[arg-type]
    if error is None:
        handle._finish(object(), None)  # type: ignore[arg-type]
    else:
        handle._finish(None, error)
    assert handle.status is status_for_error(error)
    assert dict(service._outcomes) == {old_service_count(error): 1}
    handle._mark(GroupStatus.RUNNING)  # too late: a finished group keeps its status
    assert handle.status is status_for_error(error)
