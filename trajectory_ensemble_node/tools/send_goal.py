"""Old path of :mod:`trajectory_ensemble_node.cli.send_goal`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..cli.send_goal import (
    CANCEL_GRACE_S, ClientSession, DEFAULT_NODE, DISCOVERY_SETTLE_S, EXIT_ABORTED, EXIT_CANCELED, EXIT_CODES,
    EXIT_INTERRUPTED, EXIT_REJECTED, EXIT_SUCCEEDED, EXIT_TIMEOUT, EXIT_UNREACHABLE, EXIT_USAGE, ErrorCode,
    GOAL_RESPONSE_TIMEOUT_S, LAST_FEEDBACK_GRACE_S, NodeUnreachableError, TOY_FRAME_REPEATS, add_arguments,
    build_goal, check_node_name, domain_text, publish_toy_scene, result_lines, run, send_goal,
    subscribe_goal_feedback, toy_scene_frame, wait_with_progress,
)

__all__ = [
    "CANCEL_GRACE_S", "ClientSession", "DEFAULT_NODE", "DISCOVERY_SETTLE_S", "EXIT_ABORTED", "EXIT_CANCELED",
    "EXIT_CODES", "EXIT_INTERRUPTED", "EXIT_REJECTED", "EXIT_SUCCEEDED", "EXIT_TIMEOUT", "EXIT_UNREACHABLE",
    "EXIT_USAGE", "ErrorCode", "GOAL_RESPONSE_TIMEOUT_S", "LAST_FEEDBACK_GRACE_S", "NodeUnreachableError",
    "TOY_FRAME_REPEATS", "add_arguments", "build_goal", "check_node_name", "domain_text", "publish_toy_scene",
    "result_lines", "run", "send_goal", "subscribe_goal_feedback", "toy_scene_frame", "wait_with_progress",
]
