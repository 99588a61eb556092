"""Named errors and the explicit reason for every way a candidate group can end.

Every error carries an :class:`ErrorCode`, which the ROS node copies verbatim into
``GenerateTrajectory.Result.error_code`` so that a behaviour tree can branch on it without parsing text.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Stable numeric codes for ``GenerateTrajectory.Result.error_code`` (0 = success).

    The values are part of the public interface: never renumber, only append.
    """

    OK = 0
    # Request validation (rejected before any model work).
    INVALID_SPEC = 10
    CANDIDATE_COUNT_ABOVE_MAX = 11
    UNKNOWN_REDUCER = 12
    REDUCER_INVALID_FOR_ACTION_SPACE = 13
    INVALID_REQUEST = 14
    # Observations.
    NO_OBSERVATION = 20
    STALE_OBSERVATION = 21
    NON_FINITE_STATE = 22
    # Model / engine.
    NON_FINITE_CANDIDATES = 30
    ENGINE_FAILURE = 31
    OUT_OF_MEMORY = 32
    UNSUPPORTED_MODE = 33
    ROLLOUT_FAILURE = 34
    # Lifecycle.
    CANCELED = 40
    PREEMPTED = 41
    SHUTDOWN = 42
    # Configuration and weights.
    STATS_FILE_INVALID = 50
    WEIGHTS_REJECTED = 51
    # Closed-loop execution context (the previous chunk a new one must continue).
    INVALID_CONTEXT = 70
    NEGATIVE_DELAY = 71
    DELAY_TOO_LONG = 72
    CONTEXT_UNSUPPORTED = 73


class AbortReason(str, enum.Enum):
    """Why a candidate group ended (vLLM-style: one explicit reason per terminal path)."""

    FINISHED = "finished"
    CANCELED = "canceled"
    PREEMPTED = "preempted"
    FAILED = "failed"
    REJECTED = "rejected"
    SHUTDOWN = "shutdown"


class TrajectoryEnsembleError(Exception):
    """Base class of every error this package raises on purpose."""

    code: ErrorCode = ErrorCode.ENGINE_FAILURE


# --- request validation -------------------------------------------------------------------------------------------


class InvalidSpecError(TrajectoryEnsembleError, ValueError):
    """A candidate spec, group or request is malformed."""

    code = ErrorCode.INVALID_SPEC


class CandidateCountError(InvalidSpecError):
    """``count`` is below 1 or above the configured maximum."""

    code = ErrorCode.CANDIDATE_COUNT_ABOVE_MAX


class UnknownReducerError(InvalidSpecError):
    """The reducer name is not registered."""

    code = ErrorCode.UNKNOWN_REDUCER


class ReducerLayoutError(InvalidSpecError):
    """The reducer does not fit the action layout (for example ``pose_gripper`` on width 7)."""

    code = ErrorCode.REDUCER_INVALID_FOR_ACTION_SPACE


class UnsupportedModeError(TrajectoryEnsembleError, ValueError):
    """The model cannot serve this mode (or rollout) correctly; refused rather than computed wrongly."""

    code = ErrorCode.UNSUPPORTED_MODE


class PartialGroupError(TrajectoryEnsembleError, ValueError):
    """A result was built from a candidate set that does not match its group."""

    code = ErrorCode.ENGINE_FAILURE


class StatsFileError(TrajectoryEnsembleError, ValueError):
    """An action statistics file is missing, unreadable, or has a missing key or a wrong width."""

    code = ErrorCode.STATS_FILE_INVALID


# --- numeric failures ---------------------------------------------------------------------------------------------


class NonFiniteCandidatesError(TrajectoryEnsembleError, ValueError):
    """Candidates contain NaN or Inf; they are never averaged silently."""

    code = ErrorCode.NON_FINITE_CANDIDATES


# --- group lifecycle ----------------------------------------------------------------------------------------------


class GroupAbortedError(TrajectoryEnsembleError):
    """A candidate group ended without a result. No partial aggregate exists for it.

    Args:
        request_id (`str`): The group's request id.
        reason (`AbortReason`): Why it ended.
        message (`str`): Human-readable detail.
    """

    code = ErrorCode.ENGINE_FAILURE
    reason: AbortReason = AbortReason.FAILED

    def __init__(self, request_id: str, message: str, *, reason: AbortReason | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id
        if reason is not None:
            self.reason = reason


class GroupCanceledError(GroupAbortedError):
    """The client canceled the group; it stopped at the next denoising step."""

    code = ErrorCode.CANCELED
    reason = AbortReason.CANCELED


class GroupPreemptedError(GroupCanceledError):
    """A newer goal preempted the group; it stopped at the next denoising step."""

    code = ErrorCode.PREEMPTED
    reason = AbortReason.PREEMPTED


class GroupFailedError(GroupAbortedError):
    """A slice of the group raised; the whole group fails and nothing is reduced."""

    code = ErrorCode.ENGINE_FAILURE
    reason = AbortReason.FAILED


class GroupOutOfMemoryError(GroupFailedError):
    """The device ran out of memory while running the group."""

    code = ErrorCode.OUT_OF_MEMORY


class EngineShutdownError(GroupAbortedError):
    """The engine stopped before the group finished."""

    code = ErrorCode.SHUTDOWN
    reason = AbortReason.SHUTDOWN


class WeightUpdateError(TrajectoryEnsembleError, ValueError):
    """A weight update was rejected; in strict mode nothing was changed."""

    code = ErrorCode.WEIGHTS_REJECTED


# --- closed-loop execution context ---------------------------------------------------------------------------------


class ExecutionContextError(InvalidSpecError):
    """An execution context is malformed: wrong shape or width, non-finite values, bad stamps or ``dt``."""

    code = ErrorCode.INVALID_CONTEXT


class NegativeDelayError(ExecutionContextError):
    """The frozen count (inference delay, in actions) is negative."""

    code = ErrorCode.NEGATIVE_DELAY


class DelayTooLongError(ExecutionContextError):
    """The frozen count reaches the chunk length, or runs past what is left of the previous chunk."""

    code = ErrorCode.DELAY_TOO_LONG


class ContextUnsupportedError(ExecutionContextError):
    """A context (or a context-only reducer) was asked of a model or request that cannot honour it."""

    code = ErrorCode.CONTEXT_UNSUPPORTED
