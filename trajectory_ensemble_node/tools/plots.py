"""Old path of :mod:`trajectory_ensemble_node.replay.plots`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..replay.plots import (
    GoalPlot, MAX_CHANNEL_ROWS, ReferenceGoalPlot, TOY_REDUCERS, candidate_spread, channel_names, plot_channels,
    plot_error_by_step, plot_reference, plot_toy_scenes, reduce_offline,
)

__all__ = [
    "GoalPlot", "MAX_CHANNEL_ROWS", "ReferenceGoalPlot", "TOY_REDUCERS", "candidate_spread", "channel_names",
    "plot_channels", "plot_error_by_step", "plot_reference", "plot_toy_scenes", "reduce_offline",
]
