"""Every named error of the package, the explicit reason for every way a candidate group can end, and the codes.

All error classes are defined here, grouped by the layer that raises them; each carries an :class:`ErrorCode`
(:mod:`.error_codes`, importable from here), which the node copies verbatim into its result's ``error_code``.
"""

from __future__ import annotations

import enum

from .error_codes import ERROR_KINDS, ErrorCode, error_table  # noqa: F401 - the codes are importable from here


class AbortReason(str, enum.Enum):
    """Why a candidate group ended (vLLM-style: one explicit reason per terminal path)."""

    CANCELED = "canceled"
    PREEMPTED = "preempted"
    FAILED = "failed"
    SHUTDOWN = "shutdown"
    NOT_ACTIVE = "deactivated"  # the value is public: it ends the message of a group canceled this way


class TrajectoryEnsembleError(Exception):
    """Base class of every error this package raises on purpose."""

    code: ErrorCode = ErrorCode.ENGINE_FAILURE


def describe_error(error: BaseException) -> str:
    """``NAME (code): message`` for a named error, the form every refusal a person reads takes.

    A start-up refusal, a refused handshake and a log line all print the code, so an operator can look it up in
    the error table without knowing the class behind it. Anything that is not a named error is ``ENGINE_FAILURE``.

    Args:
        error (`BaseException`): What ended the work.

    Returns:
        `str`: for example ``"NOVELTY_SCORER_INVALID (84): novelty scorer '/x.safetensors' holds NaN"``.
    """
    code = ErrorCode(getattr(error, "code", ErrorCode.ENGINE_FAILURE)) \
        if isinstance(error, TrajectoryEnsembleError) else ErrorCode.ENGINE_FAILURE
    return f"{code.name} ({int(code)}): {error}"


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


class NotActiveError(GroupAbortedError):
    """The node was not active when the goal came, or was deactivated (or cleaned up) before it finished."""

    code = ErrorCode.NOT_ACTIVE
    reason = AbortReason.NOT_ACTIVE


class WeightUpdateError(TrajectoryEnsembleError, ValueError):
    """A weight update was rejected; in strict mode nothing was changed."""

    code = ErrorCode.WEIGHTS_REJECTED


# --- capacity -----------------------------------------------------------------------------------------------------


class CapacityError(InvalidSpecError):
    """A well-formed request refused for lack of room: a group larger than one batch with ``oversize_policy='reject'``."""

    code = ErrorCode.CAPACITY


# --- model loading and rollouts (models/) -------------------------------------------------------------------------


class ModelLoadError(TrajectoryEnsembleError, ValueError):
    """The model could not be loaded: unknown name, missing directory, not a Cosmos 3 pipeline, bad device/dtype."""

    code = ErrorCode.MODEL_LOAD_FAILED


class PickleWeightsError(ModelLoadError):
    """A checkpoint holds pickle weights with no safetensors alongside, and ``allow_pickle`` is off."""


class StepCaptureError(UnsupportedModeError):
    """``step_capture`` cannot run here: CUDA graphs asked for on a device that is not CUDA, or a capture failed."""


class RolloutError(UnsupportedModeError):
    """A rollout request whose log-probabilities would not be valid; refused (fail closed), nothing is written."""

    code = ErrorCode.ROLLOUT_FAILURE


# --- the node (ros/) ----------------------------------------------------------------------------------------------


class ParameterError(TrajectoryEnsembleError, ValueError):
    """One or more parameters are invalid; the message lists every problem, one per line, by parameter name."""

    code = ErrorCode.INVALID_PARAMETERS


class GoalRequestError(TrajectoryEnsembleError, ValueError):
    """A goal asks for something this node cannot do as configured (e.g. a rollout without ``rollout_dir``)."""

    code = ErrorCode.INVALID_REQUEST


class GoalRejectedError(CapacityError):
    """The goal policy refused the goal (``reject`` at capacity, or the ``queue`` is full)."""

    code = ErrorCode.CAPACITY


class WeightsPathError(WeightUpdateError):
    """The requested path is outside ``weights_dir``, traverses with ``..``, is missing, or is not safetensors."""


class FrameError(TrajectoryEnsembleError, ValueError):
    """An image message that cannot be a valid frame. ``cause`` names the check that failed (a diagnostics key)."""

    code = ErrorCode.INVALID_FRAME
    cause = "invalid"


class UnsupportedEncodingError(FrameError):
    """The image encoding is not one of the supported encodings (``serving.frames.SUPPORTED_ENCODINGS``)."""

    cause = "encoding"


class FrameStepError(FrameError):
    """``step`` (bytes per row) is smaller than ``width * bytes_per_pixel``."""

    cause = "step"


class FrameDataLengthError(FrameError):
    """``len(data)`` is not ``step * height`` (truncated or padded data)."""

    cause = "data_length"


class FrameDimensionsError(FrameError):
    """``height`` or ``width`` is zero, or under the model's minimum side (16 px for Cosmos 3: the VAE factor)."""

    cause = "dimensions"


class ObservationError(TrajectoryEnsembleError):
    """A goal cannot be served from the current observations."""

    code = ErrorCode.NO_OBSERVATION


class NoObservationError(ObservationError):
    """Nothing has been received yet on a topic the goal needs."""

    code = ErrorCode.NO_OBSERVATION


class StaleObservationError(ObservationError):
    """The newest message on a topic the goal needs is older than ``max_observation_age_s``."""

    code = ErrorCode.STALE_OBSERVATION


class ObservationNotReceivedError(ObservationError):
    """No frame stamped at or after the goal's ``min_observation_stamp`` arrived within ``observation_wait_s``."""

    code = ErrorCode.OBSERVATION_NOT_RECEIVED


class NonFiniteStateError(ObservationError):
    """The joint state holds NaN or Inf."""

    code = ErrorCode.NON_FINITE_STATE


class StateSkewError(ObservationError):
    """The joint state nearest the image's stamp is further from it than ``max_state_skew_s``: state and image would
    not be of the same moment."""

    code = ErrorCode.STATE_SKEW


# --- the OpenPI websocket server (openpi/) --------------------------------------------------------------------------


class InvalidMessageError(TrajectoryEnsembleError, ValueError):
    """A wire message that is not a msgpack map in openpi-client's encoding (``__ndarray__`` / ``__npgeneric__``)."""

    code = ErrorCode.INVALID_MESSAGE


class AuthenticationError(TrajectoryEnsembleError, PermissionError):
    """A connection without the server's key (``Authorization: Api-Key <key>`` or ``Bearer <key>``)."""

    code = ErrorCode.UNAUTHORIZED


class ObservationSchemaError(ObservationError, ValueError):
    """A request does not fit the observation schema; the message lists the keys the schema expects."""

    code = ErrorCode.OBSERVATION_SCHEMA


class MissingObservationKeyError(ObservationSchemaError):
    """A key the schema needs (an image, or the views of a composite) is absent."""


class UnknownObservationKeyError(ObservationSchemaError):
    """A key that is neither in the schema nor one of the per-request extras (a typo would otherwise be ignored)."""


class ObservationArrayError(ObservationSchemaError):
    """A value of the wrong type, dtype or shape for its key."""


# --- input size limits ----------------------------------------------------------------------------------------------


class InputTooLargeError(TrajectoryEnsembleError, ValueError):
    """An input is above a configured size limit; refused before any model work."""

    code = ErrorCode.INVALID_REQUEST


class InstructionTooLongError(InputTooLargeError):
    """The instruction has more characters than ``max_instruction_chars`` or more tokens than
    ``max_instruction_tokens``."""

    code = ErrorCode.INSTRUCTION_TOO_LONG


class ImageTooLargeError(InputTooLargeError):
    """An image message has more bytes than ``max_image_bytes`` or more pixels than ``max_image_pixels``."""

    code = ErrorCode.IMAGE_TOO_LARGE
    cause = "size"


# --- trustworthy output (issue 17) ----------------------------------------------------------------------------------


class TooFewValidCandidatesError(GroupFailedError):
    """Fewer candidates than ``min_valid_candidates`` passed the validity checks; nothing is reduced or published."""

    code = ErrorCode.TOO_FEW_VALID_CANDIDATES


class ReducedTrajectoryInvalidError(GroupFailedError):
    """The reduced trajectory of valid candidates broke a limit (a reducer that is not a convex combination can)."""

    code = ErrorCode.REDUCED_TRAJECTORY_INVALID


class DeadlineUnmeetableError(InvalidSpecError):
    """A deadline that not even one denoising step can meet; refused before any denoising."""

    code = ErrorCode.DEADLINE_UNMEETABLE


class LimitsFileError(InvalidSpecError):
    """An action limits file is unreadable, malformed, or does not fit the action width."""

    code = ErrorCode.LIMITS_FILE_INVALID


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


# --- observation novelty -------------------------------------------------------------------------------------------


class NoveltyScorerError(TrajectoryEnsembleError, ValueError):
    """A novelty scorer file is unreadable or malformed, or a scorer and an embedding do not fit each other."""

    code = ErrorCode.NOVELTY_SCORER_INVALID


# --- remote engine (engine: openpi) ---------------------------------------------------------------------------------


class RemoteEngineError(TrajectoryEnsembleError):
    """The remote engine failed a request for a network reason (its own refusals keep their own classes)."""

    code = ErrorCode.REMOTE_UNREACHABLE


class RemoteUnreachableError(RemoteEngineError, ConnectionError):
    """Connecting to the remote engine, or its handshake, failed."""

    code = ErrorCode.REMOTE_UNREACHABLE


class RemoteDisconnectedError(RemoteEngineError, ConnectionError):
    """The connection to the remote engine dropped while a request was in flight."""

    code = ErrorCode.REMOTE_DISCONNECTED


class RemoteTimeoutError(RemoteEngineError, TimeoutError):
    """The remote engine did not reply within the request's deadline or the configured bound."""

    code = ErrorCode.REMOTE_TIMEOUT


class RemoteSchemaError(RemoteEngineError, ValueError):
    """The remote engine's handshake metadata does not fit the node's parameters."""

    code = ErrorCode.REMOTE_SCHEMA


class RemoteRefusalError(TrajectoryEnsembleError):
    """A remote server's error frame naming a class this package does not have: its code and message as sent.

    Args:
        code (`int`): The frame's numeric code (``ENGINE_FAILURE`` when it is no known code).
        name (`str`): The class name it named. message (`str`): Its message.
    """

    code = ErrorCode.ENGINE_FAILURE

    def __init__(self, code: int, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        known = code in ErrorCode._value2member_map_
        self.code = ErrorCode(code) if known else ErrorCode.ENGINE_FAILURE


# --- replicas behind Ray Serve (issue 48) -------------------------------------------------------------------------


class ReplicaLostError(GroupFailedError):
    """The engine replica running the group died (its actor was lost) before it replied; Ray restarts the replica,
    and the next requests are served without restarting the server."""

    code = ErrorCode.REPLICA_LOST


def rebuild_error(name: str, message: str, *, code: int, request_id: str = "") -> TrajectoryEnsembleError | None:
    """The named error another process reported (a remote engine's error frame, a replica's payload), as the same
    class with the same message; ``None`` when this module has no error of that name and code.

    The error is built without its class's constructor, so its message is the sender's ``str(error)`` verbatim (a
    constructor may compose one) and a relay sends the frame it received.

    Args:
        name (`str`): The class name the sender gave (``type(error).__name__``).
        message (`str`): ``str(error)`` on the sender's side.
        code (`int`): The numeric code the sender gave; a class of that name with another code is not the same error.
        request_id (`str`): The group it ended, for the group errors (:class:`GroupAbortedError`), which carry one.

    Returns:
        `TrajectoryEnsembleError` or `None`: the rebuilt error, for the caller to raise.
    """
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, TrajectoryEnsembleError)) or int(cls.code) != code:
        return None
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    if isinstance(error, GroupAbortedError):
        error.request_id = request_id
    return error
