"""Old path of :mod:`trajectory_ensemble_node.demo.sim_report`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..demo.sim_report import (
    BENCH_RTF, EpisodeRecord, SimRobot, SimSettings, episode_line, finite, node_params, plot_closed_loop, report,
    serving_node, simulate, summary, task,
)

__all__ = [
    "BENCH_RTF", "EpisodeRecord", "SimRobot", "SimSettings", "episode_line", "finite", "node_params",
    "plot_closed_loop", "report", "serving_node", "simulate", "summary", "task",
]
