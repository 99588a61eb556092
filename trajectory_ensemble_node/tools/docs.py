"""Old path of :mod:`trajectory_ensemble_node.cli.docs`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..cli.docs import (
    ERRORS_BEGIN, ERRORS_DOC, ERRORS_END, EXIT_BAD_INPUT, EXIT_OK, EXIT_OUT_OF_DATE, PARAMETERS_DOC, README,
    add_arguments, expected_files, out_of_date, render_error_summary, render_errors, render_errors_doc,
    render_parameters, run, splice, yaml_value,
)

__all__ = [
    "ERRORS_BEGIN", "ERRORS_DOC", "ERRORS_END", "EXIT_BAD_INPUT", "EXIT_OK", "EXIT_OUT_OF_DATE", "PARAMETERS_DOC",
    "README", "add_arguments", "expected_files", "out_of_date", "render_error_summary", "render_errors",
    "render_errors_doc", "render_parameters", "run", "splice", "yaml_value",
]
