"""Old path of :mod:`trajectory_ensemble_node.calibration.bag_calibration`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..calibration.bag_calibration import (
    DEFAULT_REPLAY_OUT, EXIT_BAD_INPUT, EXIT_NODE_FAILED, EXIT_OK, EXIT_UNREACHABLE, add_bag_arguments,
    calibrate_from_bags, conformal_threshold, git_commit, markdown, run, utc_now, wilson,
)

__all__ = [
    "DEFAULT_REPLAY_OUT", "EXIT_BAD_INPUT", "EXIT_NODE_FAILED", "EXIT_OK", "EXIT_UNREACHABLE", "add_bag_arguments",
    "calibrate_from_bags", "conformal_threshold", "git_commit", "markdown", "run", "utc_now", "wilson",
]
