"""Old path of :mod:`trajectory_ensemble_node.cli.ros_client`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..cli.ros_client import (
    ClientSession, DEFAULT_NODE, DISCOVERY_SETTLE_S, NodeUnreachableError, PROGRESS_EVERY_S, QUIET_S,
    TrajectoryEnsembleError, add_node_arguments, check_node_name, domain_text, node_basename,
    subscribe_goal_feedback, wait_with_progress,
)

__all__ = [
    "ClientSession", "DEFAULT_NODE", "DISCOVERY_SETTLE_S", "NodeUnreachableError", "PROGRESS_EVERY_S", "QUIET_S",
    "TrajectoryEnsembleError", "add_node_arguments", "check_node_name", "domain_text", "node_basename",
    "subscribe_goal_feedback", "wait_with_progress",
]
