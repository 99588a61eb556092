"""Old path of :mod:`trajectory_ensemble_node.replay.playback`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..replay.playback import (
    DEFAULT_WAIT_S, ErrorCode, GoalComparison, GoalOutcome, GoalPlot, PlaybackClock, ReferenceGoalPlot,
    ReferenceSeries, ReplayOptions, ReplayReport, bags, candidate_spread, compare_goal, goal_times, match_channels,
    plot_channels, plot_error_by_step, plot_reference, plot_toy_scenes, resolve_inputs, summarize,
)

__all__ = [
    "DEFAULT_WAIT_S", "ErrorCode", "GoalComparison", "GoalOutcome", "GoalPlot", "PlaybackClock",
    "ReferenceGoalPlot", "ReferenceSeries", "ReplayOptions", "ReplayReport", "bags", "candidate_spread",
    "compare_goal", "goal_times", "match_channels", "plot_channels", "plot_error_by_step", "plot_reference",
    "plot_toy_scenes", "resolve_inputs", "summarize",
]
