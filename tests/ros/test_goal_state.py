"""The goal lifecycle: every transition, legal and illegal, and the state each error code ends a goal in."""

from __future__ import annotations

import itertools

import pytest

from trajectory_ensemble_node.errors import ErrorCode, error_table
from trajectory_ensemble_node.ros.goal_state import (
    OUTCOME_COUNTER,
    TERMINAL,
    TRANSITIONS,
    GoalState,
    IllegalGoalTransitionError,
    next_state,
    terminal_state,
)

S = GoalState
LEGAL = {
    (S.ACCEPTED, S.QUEUED), (S.ACCEPTED, S.RUNNING), (S.ACCEPTED, S.REFUSED), (S.ACCEPTED, S.FAILED),
    (S.ACCEPTED, S.CANCELED), (S.ACCEPTED, S.PREEMPTED), (S.ACCEPTED, S.SHUTDOWN), (S.ACCEPTED, S.NOT_ACTIVE),
    (S.QUEUED, S.RUNNING), (S.QUEUED, S.REFUSED), (S.QUEUED, S.FAILED), (S.QUEUED, S.CANCELED),
    (S.QUEUED, S.SHUTDOWN), (S.QUEUED, S.NOT_ACTIVE),
    (S.RUNNING, S.SUCCEEDED), (S.RUNNING, S.REFUSED), (S.RUNNING, S.FAILED), (S.RUNNING, S.CANCELED),
    (S.RUNNING, S.PREEMPTED), (S.RUNNING, S.SHUTDOWN), (S.RUNNING, S.NOT_ACTIVE),
}
"""Written out by hand, independently of TRANSITIONS: the lifecycle the node's docs describe."""


@pytest.mark.parametrize("current, to", sorted(itertools.product(S, S), key=lambda p: (p[0].value, p[1].value)))
def test_every_transition_is_allowed_refused_or_illegal(current, to):
    if current in TERMINAL:
        assert next_state(current, to) is None  # too late: the goal already ended
    elif (current, to) in LEGAL:
        assert next_state(current, to) is to
    else:
        with pytest.raises(IllegalGoalTransitionError, match=f"from '{current.value}' to '{to.value}'"):
            next_state(current, to)


def test_the_table_is_the_documented_lifecycle():
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL
    assert set(TRANSITIONS) == set(S)
    # A goal reaches a terminal state from every live state, and only RUNNING may succeed.
    for state in set(S) - TERMINAL:
        assert {S.CANCELED, S.SHUTDOWN, S.NOT_ACTIVE, S.REFUSED, S.FAILED} <= TRANSITIONS[state]
    assert [a for a, b in LEGAL if b is S.SUCCEEDED] == [S.RUNNING]
    # Nothing goes back: no transition into ACCEPTED, none from QUEUED or RUNNING to an earlier state.
    assert all(b is not S.ACCEPTED for _, b in LEGAL)
    assert (S.RUNNING, S.QUEUED) not in LEGAL


def test_each_error_code_ends_a_goal_in_the_state_of_its_kind():
    kinds = {name: kind for name, _, kind, _ in error_table()}
    for code in ErrorCode:
        state = terminal_state(code)
        assert state in TERMINAL
        if code == ErrorCode.OK:
            assert state is S.SUCCEEDED
        elif code == ErrorCode.NOT_ACTIVE:
            assert state is S.NOT_ACTIVE
        elif kinds[code.name] == "lifecycle":
            assert state.value == code.name.lower()  # CANCELED, PREEMPTED, SHUTDOWN
        elif kinds[code.name] == "engine failure":
            assert state is S.FAILED, code.name
        else:
            assert state is S.REFUSED, code.name
    assert terminal_state(ErrorCode.DEADLINE_UNMEETABLE) is S.REFUSED
    assert terminal_state(ErrorCode.TOO_FEW_VALID_CANDIDATES) is S.FAILED
    with pytest.raises(ValueError):
        terminal_state(9999)


def test_every_terminal_state_has_a_diagnostics_counter():
    assert set(OUTCOME_COUNTER) == TERMINAL
    assert set(OUTCOME_COUNTER.values()) <= {"succeeded", "aborted", "canceled", "preempted"}
