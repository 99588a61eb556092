"""Old path of :mod:`trajectory_ensemble_node.replay.open_loop`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..replay.open_loop import (
    ChannelMap, GateLimitError, GoalComparison, ReferenceError, ReferenceSeries, SKIP, TrajectoryEnsembleError,
    check_gate, check_limit_names, compare_goal, match_channels, parse_channel_limit, row_times_ns, summarize,
)

__all__ = [
    "ChannelMap", "GateLimitError", "GoalComparison", "ReferenceError", "ReferenceSeries", "SKIP",
    "TrajectoryEnsembleError", "check_gate", "check_limit_names", "compare_goal", "match_channels",
    "parse_channel_limit", "row_times_ns", "summarize",
]
