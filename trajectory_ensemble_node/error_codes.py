"""The stable numeric error codes and what each means: one table for the node's result, the wire and the docs.

Every named error of :mod:`.errors` carries one of these codes, which the ROS node copies verbatim into
``GenerateTrajectory.Result.error_code`` and the OpenPI wire into its error frame. :func:`error_table` says, for every
code, what kind of outcome it is and what it means (the README's table is generated from it). The classes live in
:mod:`.errors`, grouped by the layer that raises them; this module holds only the codes, each defined once with its
kind and meaning, so the table stays in one place as the classes are split.
"""

from __future__ import annotations

import enum

ERROR_KINDS = ("ok", "refusal", "observation", "engine failure", "lifecycle", "configuration")
"""The kinds :func:`error_table` sorts codes into."""


class ErrorCode(enum.IntEnum):
    """Stable numeric codes for ``GenerateTrajectory.Result.error_code`` (0 = success), each with its ``kind`` (one
    of :data:`ERROR_KINDS`) and its ``meaning`` for a robot operator: one definition, from which :func:`error_table`
    reads.

    The values are part of the public interface: never renumber, only add new values.
    """

    kind: str
    meaning: str

    def __new__(cls, value: int, kind: str, meaning: str) -> ErrorCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.kind, member.meaning = kind, meaning
        return member

    OK = 0, "ok", "The trajectory was published and the goal succeeded."
    # Refusals: the request was rejected before any model work.
    INVALID_SPEC = 10, "refusal", ("The goal's candidate request is malformed (e.g. reducer none with several "
                                   "candidates, or a bad seed); nothing was run.")
    CANDIDATE_COUNT_ABOVE_MAX = 11, "refusal", ("The goal asked for more candidates than max_candidates (or fewer than "
                                                "one); nothing was run.")
    UNKNOWN_REDUCER = 12, "refusal", "The goal named a reducer that does not exist; nothing was run."
    REDUCER_INVALID_FOR_ACTION_SPACE = 13, "refusal", ("The reducer does not fit this robot's action layout (e.g. "
                                                       "pose_gripper on a 2-wide action); nothing was run.")
    INVALID_REQUEST = 14, "refusal", ("The goal asks for something this node is not configured for (e.g. a rollout "
                                      "without rollout_dir); nothing was run.")
    CAPACITY = 15, "refusal", ("The node is at capacity (goal_policy reject, a full queue, or too many candidates for "
                               "one batch); retry later.")
    INVALID_MESSAGE = 16, "refusal", ("An OpenPI wire message is not a msgpack map in openpi-client's encoding (e.g. "
                                      "not msgpack, or an array whose bytes do not fit its dtype and shape); nothing "
                                      "was run.")
    UNAUTHORIZED = 17, "refusal", ("An OpenPI connection carried no key or the wrong one (Authorization: Api-Key or "
                                   "Bearer); refused at the handshake, before any work.")
    # Observations.
    NO_OBSERVATION = 20, "observation", "No camera image (or joint state) has arrived yet."
    STALE_OBSERVATION = 21, "observation", ("The newest camera image (or joint state) is older than "
                                            "max_observation_age_s.")
    NON_FINITE_STATE = 22, "observation", "The joint state holds NaN or Inf."
    INVALID_FRAME = 23, "observation", ("A camera image could not be decoded (encoding, step or size) or is too small "
                                        "for the model (a side under 16 px); it was dropped and the last good frame "
                                        "kept.")
    OBSERVATION_NOT_RECEIVED = 24, "observation", ("No frame stamped at or after the goal's min_observation_stamp "
                                                   "arrived within observation_wait_s.")
    OBSERVATION_SCHEMA = 25, "observation", ("An OpenPI request misses a key its observation schema needs, has a key "
                                             "it does not know, or an array of the wrong dtype or shape (or the node's "
                                             "joint state lacks a joint the model reads); nothing was run.")
    STATE_SKEW = 26, "observation", ("The joint state nearest the image's stamp is further from it than "
                                     "max_state_skew_s (a model that takes state); nothing was run.")
    # Model / engine (ROLLOUT_FAILURE and UNSUPPORTED_MODE are refusals: nothing was run).
    NON_FINITE_CANDIDATES = 30, "engine failure", "The model produced NaN or Inf actions; nothing was published."
    ENGINE_FAILURE = 31, "engine failure", "The model failed while running the goal; nothing was published."
    OUT_OF_MEMORY = 32, "engine failure", "The GPU (or CPU) ran out of memory while running the goal."
    UNSUPPORTED_MODE = 33, "refusal", "The model cannot serve this mode correctly, so it was refused."
    ROLLOUT_FAILURE = 34, "refusal", ("The rollout was refused because its log-probabilities would not be valid; "
                                      "nothing was written.")
    # Lifecycle.
    CANCELED = 40, "lifecycle", "The client canceled the goal."
    PREEMPTED = 41, "lifecycle", "A newer goal took this goal's place (goal_policy preempt)."
    SHUTDOWN = 42, "lifecycle", "The node shut down before the goal finished."
    NOT_ACTIVE = 43, "lifecycle", ("The node is not active (not configured yet, or deactivated by its lifecycle "
                                   "manager): the goal was not served, or was ended when the node was deactivated; "
                                   "nothing was published.")
    # Configuration and weights.
    STATS_FILE_INVALID = 50, "configuration", ("The action statistics file is missing, unreadable or has the wrong "
                                               "width.")
    WEIGHTS_REJECTED = 51, "configuration", "A weight update was refused; the weights serving did not change."
    INVALID_PARAMETERS = 52, "configuration", "A node parameter is invalid; the node did not start."
    MODEL_LOAD_FAILED = 53, "configuration", ("The model could not be loaded (path, format, device or dtype); the node "
                                              "did not start.")
    # Input size limits (refused before any model work).
    INSTRUCTION_TOO_LONG = 60, "refusal", ("The instruction is longer than max_instruction_chars or "
                                           "max_instruction_tokens; nothing was run.")
    IMAGE_TOO_LARGE = 61, "observation", ("A camera image is larger than max_image_bytes or max_image_pixels; it was "
                                          "dropped and the last good frame kept.")
    # Closed-loop execution context (the previous chunk a new one must continue).
    INVALID_CONTEXT = 70, "refusal", ("The continuation context is malformed (shape, width, stamps or dt); nothing was "
                                      "run.")
    NEGATIVE_DELAY = 71, "refusal", "The inference delay (frozen actions) is negative; nothing was run."
    DELAY_TOO_LONG = 72, "refusal", ("The inference delay reaches the chunk length or the end of the previous chunk; "
                                     "nothing was run.")
    CONTEXT_UNSUPPORTED = 73, "refusal", ("Continuing the previous chunk is not possible for this model or request; "
                                          "nothing was run.")
    # Trustworthy output: validity, deadlines (issue 17).
    TOO_FEW_VALID_CANDIDATES = 80, "engine failure", ("Fewer candidates than min_valid_candidates passed the validity "
                                                      "checks (NaN/Inf, limits); nothing was published.")
    REDUCED_TRAJECTORY_INVALID = 81, "engine failure", ("The reduced trajectory broke a limit although its candidates "
                                                        "passed; nothing was published.")
    DEADLINE_UNMEETABLE = 82, "refusal", "The goal's deadline is shorter than one denoising step; nothing was run."
    LIMITS_FILE_INVALID = 83, "configuration", ("The action limits file is unreadable, malformed or does not fit the "
                                                "action width.")
    # Observation novelty (issue 33).
    NOVELTY_SCORER_INVALID = 84, "configuration", ("The novelty scorer file is not a trajectory-ensemble safetensors "
                                                   "scorer, or does not fit the model's observation embedding.")
    # A remote engine (engine: openpi; issue 48).
    REMOTE_UNREACHABLE = 90, "engine failure", ("The remote engine (engine_url) could not be reached or refused the "
                                                "handshake; nothing was run.")
    REMOTE_DISCONNECTED = 91, "engine failure", ("The connection to the remote engine dropped while it served the "
                                                 "goal; nothing was published.")
    REMOTE_TIMEOUT = 92, "engine failure", ("The remote engine did not reply within the goal's deadline (or "
                                            "engine_timeout_s past its expected time); nothing was published.")
    REMOTE_SCHEMA = 93, "configuration", ("The remote engine's handshake does not fit the node's parameters "
                                          "(embodiment, action shape, dt, schema or extras).")
    # Replicas behind Ray Serve (issue 48).
    REPLICA_LOST = 95, "engine failure", ("The engine replica serving the request died (serve-ray); nothing was "
                                          "published. Ray restarts it and the next requests are served.")


def error_table() -> list[tuple[str, int, str, str]]:
    """Every :class:`ErrorCode` as ``(name, value, kind, meaning)``, in value order.

    ``kind`` is one of :data:`ERROR_KINDS`; ``meaning`` is one sentence for a robot operator. The README's error
    table is generated from this.

    Returns:
        `list[tuple[str, int, str, str]]`
    """
    return [(code.name, int(code), code.kind, code.meaning) for code in sorted(ErrorCode)]
