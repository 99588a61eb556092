"""Old path of :mod:`trajectory_ensemble_node.demo.sim_robot`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..demo.sim_model import episode_end
from ..demo.sim_robot import (
    CLOCK_PERIOD_S, ClockPublisher, EpisodeRecord, FIRST_GOAL_TRIES, GOAL_TIMEOUT_S, GoalRecord, NS_PER_S, Plan,
    SimClock, SimRobot, SimSettings, handover_seam, row_times, should_request, stamp_ns,
)
from ..toy import task
from ..toy.episodes import scene_seed

__all__ = [
    "CLOCK_PERIOD_S", "ClockPublisher", "EpisodeRecord", "FIRST_GOAL_TRIES", "GOAL_TIMEOUT_S", "GoalRecord",
    "NS_PER_S", "Plan", "SimClock", "SimRobot", "SimSettings", "episode_end", "handover_seam", "row_times",
    "scene_seed", "should_request", "stamp_ns", "task",
]
