"""Old path of :mod:`trajectory_ensemble_node.cli.params`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..cli.params import (
    ANSWER_TIMEOUT_S, ClientSession, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, ErrorCode,
    NodeUnreachableError, ParamClient, ParameterRefusedError, ParameterValueError, TYPES, TrajectoryEnsembleError,
    add_arguments, add_node_arguments, check_node_name, convert, domain_text, format_value, params, python_value,
    run, type_name, wait_with_progress,
)

__all__ = [
    "ANSWER_TIMEOUT_S", "ClientSession", "EXIT_OK", "EXIT_REFUSED", "EXIT_UNREACHABLE", "EXIT_USAGE", "ErrorCode",
    "NodeUnreachableError", "ParamClient", "ParameterRefusedError", "ParameterValueError", "TYPES",
    "TrajectoryEnsembleError", "add_arguments", "add_node_arguments", "check_node_name", "convert", "domain_text",
    "format_value", "params", "python_value", "run", "type_name", "wait_with_progress",
]
