"""Moved to :mod:`trajectory_ensemble_node.serving` (ROS-free): the types and decoding to
:mod:`~trajectory_ensemble_node.serving.observations`, the buffer to
:mod:`~trajectory_ensemble_node.serving.observation_buffer`, its waits to
:mod:`~trajectory_ensemble_node.serving.observation_wait`; this old path re-exports them (and, as before, the
observation errors and the codec's names)."""

from __future__ import annotations

from ..errors import (  # noqa: F401 - the observation errors are importable from here too
    FrameDataLengthError,
    FrameDimensionsError,
    FrameError,
    FrameStepError,
    GoalRequestError,
    NoObservationError,
    NonFiniteStateError,
    ObservationArrayError,
    ObservationError,
    ObservationNotReceivedError,
    StaleObservationError,
    UnsupportedEncodingError,
)
from ..serving.frames import BYTES_PER_PIXEL, SUPPORTED_ENCODINGS, image_to_rgb, tile_views  # noqa: F401
from ..serving.input_limits import check_image_dimensions, check_joint_state_shape, check_state  # noqa: F401
from ..serving.observation_buffer import ObservationBuffer  # noqa: F401 - the old public path
from ..serving.observations import (  # noqa: F401 - the old public path
    FRAME_REJECT_CAUSES,
    FUTURE_STAMP_TOLERANCE_S,
    Frame,
    JointStateSample,
    Observation,
    stamp_ns,
    state_positions,
)

__all__ = [
    "BYTES_PER_PIXEL",
    "FRAME_REJECT_CAUSES",
    "FUTURE_STAMP_TOLERANCE_S",
    "SUPPORTED_ENCODINGS",
    "Frame",
    "FrameDataLengthError",
    "FrameDimensionsError",
    "FrameError",
    "FrameStepError",
    "GoalRequestError",
    "JointStateSample",
    "NoObservationError",
    "NonFiniteStateError",
    "Observation",
    "ObservationArrayError",
    "ObservationBuffer",
    "ObservationError",
    "ObservationNotReceivedError",
    "StaleObservationError",
    "UnsupportedEncodingError",
    "check_image_dimensions",
    "check_joint_state_shape",
    "check_state",
    "image_to_rgb",
    "stamp_ns",
    "state_positions",
    "tile_views",
]
