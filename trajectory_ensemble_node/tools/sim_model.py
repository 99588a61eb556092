"""Old path of :mod:`trajectory_ensemble_node.demo.sim_model`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..demo.sim_model import (
    CLOCK_PERIOD_S, DEFAULT_RTF, EXECUTE, Episode, EpisodeRecord, FIRST_GOAL_TRIES, GOAL_TIMEOUT_S, GoalRecord,
    NS_PER_S, Plan, START_NS, STEP_BUDGET, SimClock, SimSettings, Switch, episode_end, episode_line, handover_seam,
    row_times, should_request, task,
)

__all__ = [
    "CLOCK_PERIOD_S", "DEFAULT_RTF", "EXECUTE", "Episode", "EpisodeRecord", "FIRST_GOAL_TRIES", "GOAL_TIMEOUT_S",
    "GoalRecord", "NS_PER_S", "Plan", "START_NS", "STEP_BUDGET", "SimClock", "SimSettings", "Switch", "episode_end",
    "episode_line", "handover_seam", "row_times", "should_request", "task",
]
