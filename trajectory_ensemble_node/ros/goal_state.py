"""A goal's lifecycle: one state from a small enum, and one function that decides every transition.

Every accepted ``GenerateTrajectory`` goal is in exactly one :class:`GoalState`:

==============  ====================================================================================================
``ACCEPTED``    the action server accepted it; it is being validated, or waits for its frame
``QUEUED``      valid, and waiting for a slot (``goal_policy: queue``)
``RUNNING``     admitted: its candidate group is submitted to the engine
``SUCCEEDED``   committed to publishing its result; from here nothing can cancel or preempt it
``REFUSED``     ended before any model work with a refusal, observation or configuration code
``FAILED``      the engine failed its group (an engine-failure code); nothing was published
``CANCELED``    the client canceled it
``PREEMPTED``   a newer goal took its slot (``goal_policy: preempt``)
``SHUTDOWN``    the node shut down first
``NOT_ACTIVE``  the node was not active when it came, or was deactivated before it finished (lifecycle)
==============  ====================================================================================================

The terminal states are the ways a goal ends, one for each finished
:class:`~trajectory_ensemble_node.engine.status.GroupStatus` (vLLM's habit: one named reason for every way a request
ends): :func:`terminal_state` maps the code a goal ends with to its group status and that to its state, so the
state, the counters and the ``error_code`` of a result can never disagree.

:func:`next_state` is the one place that decides whether a transition may happen. A transition out of a terminal
state is *too late* (a cancel that arrives after the goal committed to its result) and is refused by returning
``None``; one that the table does not allow from a live state is a bug and raises. Nothing here imports rclpy.
"""

from __future__ import annotations

import enum

from ..engine.status import FINISHED, GroupStatus, status_for_code


class GoalState(str, enum.Enum):
    """Where an accepted goal is (see the module docstring)."""

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
