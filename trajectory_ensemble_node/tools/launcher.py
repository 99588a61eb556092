"""Old path of :mod:`trajectory_ensemble_node.cli.launcher`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..cli.launcher import (
    NodeProcess, NodeStartError, READY_MARKER, RTPS_DOMAIN_GAIN, RTPS_PORT_BASE, TrajectoryEnsembleError,
    format_param, pick_domain_id, ros_env, unused_domain_id,
)

__all__ = [
    "NodeProcess", "NodeStartError", "READY_MARKER", "RTPS_DOMAIN_GAIN", "RTPS_PORT_BASE",
    "TrajectoryEnsembleError", "format_param", "pick_domain_id", "ros_env", "unused_domain_id",
]
