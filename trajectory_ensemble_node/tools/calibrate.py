"""Old path of :mod:`trajectory_ensemble_node.calibration.calibrate`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..calibration.calibrate import (
    DEFAULT_JSON, EXIT_NO_LAB, SCENE_CALIBRATION_MODULE, SCORER_KINDS, SHIFTED_MODULE, add_arguments,
    bag_calibration, novelty_calibration, run,
)

__all__ = [
    "DEFAULT_JSON", "EXIT_NO_LAB", "SCENE_CALIBRATION_MODULE", "SCORER_KINDS", "SHIFTED_MODULE", "add_arguments",
    "bag_calibration", "novelty_calibration", "run",
]
