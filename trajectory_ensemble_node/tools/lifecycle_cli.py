"""Old path of :mod:`trajectory_ensemble_node.cli.lifecycle`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..cli.lifecycle import (
    ANSWER_TIMEOUT_S, ClientSession, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, LifecycleClient,
    NodeUnreachableError, TRANSITIONS, add_arguments, add_node_arguments, check_node_name, domain_text, run,
)

__all__ = [
    "ANSWER_TIMEOUT_S", "ClientSession", "EXIT_OK", "EXIT_REFUSED", "EXIT_UNREACHABLE", "EXIT_USAGE",
    "LifecycleClient", "NodeUnreachableError", "TRANSITIONS", "add_arguments", "add_node_arguments",
    "check_node_name", "domain_text", "run",
]
