"""Old path of :mod:`trajectory_ensemble_node.demo.sim`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..demo.sim import (
    DEFAULT_RTF, EXECUTE, STEP_BUDGET, SimSettings, add_arguments, run, settings_from, task,
)

__all__ = [
    "DEFAULT_RTF", "EXECUTE", "STEP_BUDGET", "SimSettings", "add_arguments", "run", "settings_from", "task",
]
