"""The stable numeric error codes and what each means: one table for the node's result, the wire and the docs.

Every named error of :mod:`.errors` carries one of these codes, which the ROS node copies verbatim into
``GenerateTrajectory.Result.error_code`` and the OpenPI wire into its error frame. :func:`error_table` says, for every
code, what kind of outcome it is and what it means (the README's table is generated from it). The classes live in
:mod:`.errors`, grouped by the layer that raises them; this module holds only the codes, so the table stays in one
place as the classes are split.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Stable numeric codes for ``GenerateTrajectory.Result.error_code`` (0 = success).

    The values are part of the public interface: never renumber, only add new values.
    """

    OK = 0
    # Refusals: the request was rejected before any model work.
    INVALID_SPEC = 10
    CANDIDATE_COUNT_ABOVE_MAX = 11
    UNKNOWN_REDUCER = 12
    REDUCER_INVALID_FOR_ACTION_SPACE = 13
    INVALID_REQUEST = 14
    CAPACITY = 15
    INVALID_MESSAGE = 16
    UNAUTHORIZED = 17
    # Observations.
    NO_OBSERVATION = 20
    STALE_OBSERVATION = 21
    NON_FINITE_STATE = 22
    INVALID_FRAME = 23
    OBSERVATION_NOT_RECEIVED = 24
    OBSERVATION_SCHEMA = 25
    STATE_SKEW = 26
    # Model / engine (ROLLOUT_FAILURE and UNSUPPORTED_MODE are refusals: nothing was run).
    NON_FINITE_CANDIDATES = 30
    ENGINE_FAILURE = 31
    OUT_OF_MEMORY = 32
    UNSUPPORTED_MODE = 33
    ROLLOUT_FAILURE = 34
    # Lifecycle.
    CANCELED = 40
    PREEMPTED = 41
    SHUTDOWN = 42
    NOT_ACTIVE = 43
    # Configuration and weights.
    STATS_FILE_INVALID = 50
    WEIGHTS_REJECTED = 51
    INVALID_PARAMETERS = 52
    MODEL_LOAD_FAILED = 53
    # Input size limits (refused before any model work).
    INSTRUCTION_TOO_LONG = 60
    IMAGE_TOO_LARGE = 61
    # Closed-loop execution context (the previous chunk a new one must continue).
    INVALID_CONTEXT = 70
    NEGATIVE_DELAY = 71
    DELAY_TOO_LONG = 72
    CONTEXT_UNSUPPORTED = 73
    # Trustworthy output: validity, deadlines (issue 17).
    TOO_FEW_VALID_CANDIDATES = 80
    REDUCED_TRAJECTORY_INVALID = 81
    DEADLINE_UNMEETABLE = 82
    LIMITS_FILE_INVALID = 83
    # Observation novelty (issue 33).
    NOVELTY_SCORER_INVALID = 84
    # A remote engine (engine: openpi; issue 48).
    REMOTE_UNREACHABLE = 90
    REMOTE_DISCONNECTED = 91
    REMOTE_TIMEOUT = 92
    REMOTE_SCHEMA = 93
    # Replicas behind Ray Serve (issue 48).
    REPLICA_LOST = 95


ERROR_KINDS = ("ok", "refusal", "observation", "engine failure", "lifecycle", "configuration")
"""The kinds :func:`error_table` sorts codes into."""

_TABLE: dict[ErrorCode, tuple[str, str]] = {
    ErrorCode.OK: ("ok", "The trajectory was published and the goal succeeded."),
    ErrorCode.INVALID_SPEC: ("refusal", "The goal's candidate request is malformed (e.g. reducer none with several "
                                        "candidates, or a bad seed); nothing was run."),
    ErrorCode.CANDIDATE_COUNT_ABOVE_MAX: ("refusal", "The goal asked for more candidates than max_candidates (or "
                                                     "fewer than one); nothing was run."),
    ErrorCode.UNKNOWN_REDUCER: ("refusal", "The goal named a reducer that does not exist; nothing was run."),
    ErrorCode.REDUCER_INVALID_FOR_ACTION_SPACE: ("refusal", "The reducer does not fit this robot's action layout "
                                                            "(e.g. pose_gripper on a 2-wide action); nothing was run."),
    ErrorCode.INVALID_REQUEST: ("refusal", "The goal asks for something this node is not configured for (e.g. a "
                                           "rollout without rollout_dir); nothing was run."),
    ErrorCode.CAPACITY: ("refusal", "The node is at capacity (goal_policy reject, a full queue, or too many "
                                    "candidates for one batch); retry later."),
    ErrorCode.INVALID_MESSAGE: ("refusal", "An OpenPI wire message is not a msgpack map in openpi-client's encoding "
                                           "(e.g. not msgpack, or an array whose bytes do not fit its dtype and "
                                           "shape); nothing was run."),
    ErrorCode.UNAUTHORIZED: ("refusal", "An OpenPI connection carried no key or the wrong one (Authorization: Api-Key "
                                        "or Bearer); refused at the handshake, before any work."),
    ErrorCode.NO_OBSERVATION: ("observation", "No camera image (or joint state) has arrived yet."),
    ErrorCode.STALE_OBSERVATION: ("observation", "The newest camera image (or joint state) is older than "
                                                 "max_observation_age_s."),
    ErrorCode.NON_FINITE_STATE: ("observation", "The joint state holds NaN or Inf."),
    ErrorCode.INVALID_FRAME: ("observation", "A camera image could not be decoded (encoding, step or size) or is too "
                                             "small for the model (a side under 16 px); it was dropped and the last "
                                             "good frame kept."),
    ErrorCode.OBSERVATION_NOT_RECEIVED: ("observation", "No frame stamped at or after the goal's "
                                                        "min_observation_stamp arrived within observation_wait_s."),
    ErrorCode.OBSERVATION_SCHEMA: ("observation", "An OpenPI request misses a key its observation schema needs, has a "
                                                  "key it does not know, or an array of the wrong dtype or shape (or "
                                                  "the node's joint state lacks a joint the model reads); nothing was "
                                                  "run."),
    ErrorCode.STATE_SKEW: ("observation", "The joint state nearest the image's stamp is further from it than "
                                          "max_state_skew_s (a model that takes state); nothing was run."),
    ErrorCode.NON_FINITE_CANDIDATES: ("engine failure", "The model produced NaN or Inf actions; nothing was "
                                                        "published."),
    ErrorCode.ENGINE_FAILURE: ("engine failure", "The model failed while running the goal; nothing was published."),
    ErrorCode.OUT_OF_MEMORY: ("engine failure", "The GPU (or CPU) ran out of memory while running the goal."),
    ErrorCode.UNSUPPORTED_MODE: ("refusal", "The model cannot serve this mode correctly, so it was refused."),
    ErrorCode.ROLLOUT_FAILURE: ("refusal", "The rollout was refused because its log-probabilities would not be "
                                           "valid; nothing was written."),
    ErrorCode.CANCELED: ("lifecycle", "The client canceled the goal."),
    ErrorCode.PREEMPTED: ("lifecycle", "A newer goal took this goal's place (goal_policy preempt)."),
    ErrorCode.SHUTDOWN: ("lifecycle", "The node shut down before the goal finished."),
    ErrorCode.NOT_ACTIVE: ("lifecycle", "The node is not active (not configured yet, or deactivated by its lifecycle "
                                        "manager): the goal was not served, or was ended when the node was "
                                        "deactivated; nothing was published."),
    ErrorCode.STATS_FILE_INVALID: ("configuration", "The action statistics file is missing, unreadable or has the "
                                                    "wrong width."),
    ErrorCode.WEIGHTS_REJECTED: ("configuration", "A weight update was refused; the weights serving did not change."),
    ErrorCode.INVALID_PARAMETERS: ("configuration", "A node parameter is invalid; the node did not start."),
    ErrorCode.MODEL_LOAD_FAILED: ("configuration", "The model could not be loaded (path, format, device or dtype); "
                                                   "the node did not start."),
    ErrorCode.INSTRUCTION_TOO_LONG: ("refusal", "The instruction is longer than max_instruction_chars or "
                                                "max_instruction_tokens; nothing was run."),
    ErrorCode.IMAGE_TOO_LARGE: ("observation", "A camera image is larger than max_image_bytes or max_image_pixels; "
                                               "it was dropped and the last good frame kept."),
    ErrorCode.INVALID_CONTEXT: ("refusal", "The continuation context is malformed (shape, width, stamps or dt); "
                                           "nothing was run."),
    ErrorCode.NEGATIVE_DELAY: ("refusal", "The inference delay (frozen actions) is negative; nothing was run."),
    ErrorCode.DELAY_TOO_LONG: ("refusal", "The inference delay reaches the chunk length or the end of the previous "
                                          "chunk; nothing was run."),
    ErrorCode.CONTEXT_UNSUPPORTED: ("refusal", "Continuing the previous chunk is not possible for this model or "
                                               "request; nothing was run."),
    ErrorCode.TOO_FEW_VALID_CANDIDATES: ("engine failure", "Fewer candidates than min_valid_candidates passed the "
                                                          "validity checks (NaN/Inf, limits); nothing was published."),
    ErrorCode.REDUCED_TRAJECTORY_INVALID: ("engine failure", "The reduced trajectory broke a limit although its "
                                                             "candidates passed; nothing was published."),
    ErrorCode.DEADLINE_UNMEETABLE: ("refusal", "The goal's deadline is shorter than one denoising step; nothing was "
                                               "run."),
    ErrorCode.LIMITS_FILE_INVALID: ("configuration", "The action limits file is unreadable, malformed or does not fit "
                                                     "the action width."),
    ErrorCode.NOVELTY_SCORER_INVALID: ("configuration", "The novelty scorer file is not a trajectory-ensemble "
                                                        "safetensors scorer, or does not fit the model's observation "
                                                        "embedding."),
    ErrorCode.REMOTE_UNREACHABLE: ("engine failure", "The remote engine (engine_url) could not be reached or refused "
                                                     "the handshake; nothing was run."),
    ErrorCode.REMOTE_DISCONNECTED: ("engine failure", "The connection to the remote engine dropped while it served "
                                                      "the goal; nothing was published."),
    ErrorCode.REMOTE_TIMEOUT: ("engine failure", "The remote engine did not reply within the goal's deadline (or "
                                                 "engine_timeout_s past its expected time); nothing was published."),
    ErrorCode.REMOTE_SCHEMA: ("configuration", "The remote engine's handshake does not fit the node's parameters "
                                               "(embodiment, action shape, dt, schema or extras)."),
    ErrorCode.REPLICA_LOST: ("engine failure", "The engine replica serving the request died (serve-ray); nothing was "
                                               "published. Ray restarts it and the next requests are served."),
}


def error_table() -> list[tuple[str, int, str, str]]:
    """Every :class:`ErrorCode` as ``(name, value, kind, meaning)``, in value order.

    ``kind`` is one of :data:`ERROR_KINDS`; ``meaning`` is one sentence for a robot operator. The README's error
    table is generated from this.

    Returns:
        `list[tuple[str, int, str, str]]`
    """
    return [(code.name, int(code), *_TABLE[code]) for code in sorted(ErrorCode)]
