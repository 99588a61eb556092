"""Old path of :mod:`trajectory_ensemble_node.cli.diagnostics`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..cli.diagnostics import (
    ClientSession, DEFAULT_NODE, EXIT_NOTHING, EXIT_OK, EXIT_USAGE, LEVELS, add_arguments, check_node_name,
    domain_text, echo, node_basename, run, status_lines,
)

__all__ = [
    "ClientSession", "DEFAULT_NODE", "EXIT_NOTHING", "EXIT_OK", "EXIT_USAGE", "LEVELS", "add_arguments",
    "check_node_name", "domain_text", "echo", "node_basename", "run", "status_lines",
]
