"""How far a group got and how it ended: one status, from which every counter, goal outcome and diagnostic derives.

Like vLLM's ``RequestStatus``: ``WAITING``, ``RUNNING``, then one ``FINISHED_*``. The code a group ends with decides
its status (:func:`status_for_code`), and the status decides the rest: docs/node.md, "Group status".
"""

from __future__ import annotations

import enum

from ..error_codes import ErrorCode, error_table
from ..errors import (
    AbortReason,
    EngineShutdownError,
    GroupAbortedError,
    GroupCanceledError,
    GroupFailedError,
    GroupPreemptedError,
    NotActiveError,
    TrajectoryEnsembleError,
)


class GroupStatus(str, enum.Enum):
    """Where a group is, or how it ended, each ending with its row of docs/node.md's "Group status" table: ``reason``,
    the finish reason of an aborted group (``None`` while live, on success and on a refusal); ``service_counter``, the
    :meth:`EnsembleService.outcome_counts` key it adds to; ``goal_counter``, the node's ``goals_<name>`` counter it
    adds to (both ``""`` while live). Only a client's own cancel or a preemption is a goal counter of its own; every
    other goal that ended without a trajectory is "aborted" (the action server's own word).
    """

    reason: AbortReason | None
    service_counter: str
    goal_counter: str

    def __new__(cls, value: str, reason: AbortReason | None = None, service_counter: str = "",
                goal_counter: str = "") -> GroupStatus:
        member = str.__new__(cls, value)
        member._value_ = value
        member.reason, member.service_counter, member.goal_counter = reason, service_counter, goal_counter
        return member

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_SUCCEEDED = "finished_succeeded", None, "succeeded", "succeeded"
    FINISHED_REFUSED = "finished_refused", None, "failed", "aborted"
    FINISHED_FAILED = "finished_failed", AbortReason.FAILED, "failed", "aborted"
    FINISHED_CANCELED = "finished_canceled", AbortReason.CANCELED, "canceled", "canceled"
    FINISHED_PREEMPTED = "finished_preempted", AbortReason.PREEMPTED, "preempted", "preempted"
    FINISHED_SHUTDOWN = "finished_shutdown", AbortReason.SHUTDOWN, "shutdown", "aborted"
    FINISHED_NOT_ACTIVE = "finished_deactivated", AbortReason.NOT_ACTIVE, "failed", "aborted"

    @property
    def finished(self) -> bool:
        """Whether the group has ended (a ``FINISHED_*`` status)."""
        return self.value.startswith("finished_")


FINISHED = tuple(status for status in GroupStatus if status.finished)
"""The ways a group ends, in table order."""

REJECTED = "rejected"
"""The goal counter of goals the action server never accepted (they never became a group, so have no status)."""

GOAL_COUNTERS = (*dict.fromkeys(status.goal_counter for status in FINISHED), REJECTED)
"""Every ``goals_<name>`` counter, in the order ``/diagnostics`` lists them."""

_BY_CODE = {ErrorCode.OK: GroupStatus.FINISHED_SUCCEEDED, ErrorCode.CANCELED: GroupStatus.FINISHED_CANCELED,
            ErrorCode.PREEMPTED: GroupStatus.FINISHED_PREEMPTED, ErrorCode.SHUTDOWN: GroupStatus.FINISHED_SHUTDOWN,
            ErrorCode.NOT_ACTIVE: GroupStatus.FINISHED_NOT_ACTIVE}
_BY_KIND = {"refusal": GroupStatus.FINISHED_REFUSED, "observation": GroupStatus.FINISHED_REFUSED,
            "configuration": GroupStatus.FINISHED_REFUSED, "engine failure": GroupStatus.FINISHED_FAILED}
_CODE_KIND = {name: kind for name, _, kind, _ in error_table()}

ABORT_ERRORS: dict[AbortReason, type[GroupAbortedError]] = {
    AbortReason.CANCELED: GroupCanceledError, AbortReason.PREEMPTED: GroupPreemptedError,
    AbortReason.FAILED: GroupFailedError, AbortReason.SHUTDOWN: EngineShutdownError,
    AbortReason.NOT_ACTIVE: NotActiveError,
}
"""The named error a group aborted for each reason ends with."""


def status_for_code(code: int) -> GroupStatus:
    """The finished status of a group (or goal) that ends with ``code``.

    Args:
        code (`int`): An :class:`~trajectory_ensemble_node.errors.ErrorCode` value.

    Raises:
        ValueError: ``code`` is no :class:`ErrorCode` (quoted).
    """
    error = ErrorCode(code)
    return _BY_CODE.get(error) or _BY_KIND[_CODE_KIND[error.name]]


def status_for_error(error: BaseException | None) -> GroupStatus:
    """The finished status of a group that ended with ``error`` (``None``: it succeeded); an error that is not one
    of this package's named errors is an engine failure."""
    if error is None:
        return GroupStatus.FINISHED_SUCCEEDED
    code = error.code if isinstance(error, TrajectoryEnsembleError) else ErrorCode.ENGINE_FAILURE
    return status_for_code(code)
