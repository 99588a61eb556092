"""A goal's lifecycle: one state from a small enum, and one function that decides every transition.

:func:`terminal_state` maps the code a goal ends with to its group status and that to its state, so state, counters
and ``error_code`` never disagree; :func:`next_state` is the one place that decides a transition (``None``: too late;
a transition the table forbids from a live state raises). The states: docs/node.md, "Goal states". No rclpy.
"""

from __future__ import annotations

import enum

from ..engine.status import FINISHED, GroupStatus, status_for_code


class GoalState(str, enum.Enum):
    """Where an accepted goal is (docs/node.md, "Goal states")."""

    ACCEPTED = "accepted"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    REFUSED = "refused"
    FAILED = "failed"
    CANCELED = "canceled"
    PREEMPTED = "preempted"
    SHUTDOWN = "shutdown"
    NOT_ACTIVE = "inactive"


TERMINAL = frozenset({GoalState.SUCCEEDED, GoalState.REFUSED, GoalState.FAILED, GoalState.CANCELED,
                      GoalState.PREEMPTED, GoalState.SHUTDOWN, GoalState.NOT_ACTIVE})
"""States a goal never leaves."""

_ENDINGS = frozenset({GoalState.REFUSED, GoalState.FAILED, GoalState.CANCELED, GoalState.SHUTDOWN,
                      GoalState.NOT_ACTIVE})
"""Ways any live goal can end: validation or its frame refuses it, an unexpected error fails it, the client cancels,
the node stops or is deactivated."""

TRANSITIONS: dict[GoalState, frozenset[GoalState]] = {
    # Waiting for a slot or its frame; the oldest contender of an admission may be this very goal (preempted).
    GoalState.ACCEPTED: _ENDINGS | {GoalState.QUEUED, GoalState.RUNNING, GoalState.PREEMPTED},
    # The queue policy never preempts, so a queued goal is admitted, refused (its frame went stale), or ends.
    GoalState.QUEUED: _ENDINGS | {GoalState.RUNNING},
    # The engine may still refuse (capacity, an unsupported mode) or fail the group; only it can succeed.
    GoalState.RUNNING: _ENDINGS | {GoalState.SUCCEEDED, GoalState.PREEMPTED},
    **{state: frozenset() for state in TERMINAL},
}
"""For each state, the states it may move to."""


class IllegalGoalTransitionError(RuntimeError):
    """A transition the lifecycle table does not allow from a live state: a bug in the caller, never a race."""


def next_state(current: GoalState, to: GoalState) -> GoalState | None:
    """Decide the transition ``current -> to``.

    Args:
        current (`GoalState`): The goal's state now.
        to (`GoalState`): The state asked for.

    Returns:
        `GoalState` or `None`: ``to`` when the move is allowed; ``None`` when ``current`` is terminal (the goal has
        already ended, e.g. a cancel after the goal committed to its result: the caller refuses it).

    Raises:
        IllegalGoalTransitionError: ``current`` is live and :data:`TRANSITIONS` has no ``current -> to``.
    """
    if current in TERMINAL:
        return None
    if to not in TRANSITIONS[current]:
        raise IllegalGoalTransitionError(f"a goal cannot go from {current.value!r} to {to.value!r}")
    return to


GOAL_STATE_OF: dict[GroupStatus, GoalState] = {
    GroupStatus.FINISHED_SUCCEEDED: GoalState.SUCCEEDED, GroupStatus.FINISHED_REFUSED: GoalState.REFUSED,
    GroupStatus.FINISHED_FAILED: GoalState.FAILED, GroupStatus.FINISHED_CANCELED: GoalState.CANCELED,
    GroupStatus.FINISHED_PREEMPTED: GoalState.PREEMPTED, GroupStatus.FINISHED_SHUTDOWN: GoalState.SHUTDOWN,
    GroupStatus.FINISHED_NOT_ACTIVE: GoalState.NOT_ACTIVE,
}
"""The terminal goal state of each way a group ends: a goal's ending is its group's status seen from the node."""


def terminal_state(code: int) -> GoalState:
    """The terminal state of a goal that ends with ``code`` (through its group status,
    :func:`~trajectory_ensemble_node.engine.status.status_for_code`).

    Args:
        code (`int`): An :class:`~trajectory_ensemble_node.errors.ErrorCode` value.

    Raises:
        ValueError: ``code`` is no :class:`ErrorCode`.
    """
    return GOAL_STATE_OF[status_for_code(code)]


OUTCOME_COUNTER: dict[GoalState, str] = {GOAL_STATE_OF[status]: status.goal_counter for status in FINISHED}
"""The ``/diagnostics`` goal counter (``goals_<name>``) each terminal state adds to (its group status's); ``rejected``
counts goals the action server never accepted."""
