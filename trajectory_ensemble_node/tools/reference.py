"""Old path of :mod:`trajectory_ensemble_node.replay.reference`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..replay.reference import (
    ChannelSeries, FLOAT32_ARRAY_TYPE, FLOAT64_ARRAY_TYPE, JOINT_STATE_TYPE, JOINT_TRAJECTORY_TYPE, REFERENCE_TYPES,
    ReferenceError, ReferenceSeries, bags, check_reference_topic, read_reference,
)

__all__ = [
    "ChannelSeries", "FLOAT32_ARRAY_TYPE", "FLOAT64_ARRAY_TYPE", "JOINT_STATE_TYPE", "JOINT_TRAJECTORY_TYPE",
    "REFERENCE_TYPES", "ReferenceError", "ReferenceSeries", "bags", "check_reference_topic", "read_reference",
]
