"""Old path of :mod:`trajectory_ensemble_node.demo.demo`, kept as a re-export of the very same objects.

Issue 46 moved the tools by concern; docs and earlier issues name this path."""

from ..demo.demo import (
    CLOSED_LOOP_DELAY, CLOSED_LOOP_EPISODES, DEMO_CANDIDATES, DEMO_SEED, EXIT_BAD_INPUT, EXIT_NODE_FAILED,
    EXIT_UNREACHABLE, NodeProcess, NodeStartError, NodeUnreachableError, OPEN_LOOP_RUNS, ReplayOptions,
    TINY_SETTINGS, TrajectoryEnsembleError, add_arguments, bags, closed_loop, default_model, finish, model_notice,
    node_params, open_loop, pick_domain_id, replay, ros_env, run, toy_installed,
)

__all__ = [
    "CLOSED_LOOP_DELAY", "CLOSED_LOOP_EPISODES", "DEMO_CANDIDATES", "DEMO_SEED", "EXIT_BAD_INPUT",
    "EXIT_NODE_FAILED", "EXIT_UNREACHABLE", "NodeProcess", "NodeStartError", "NodeUnreachableError",
    "OPEN_LOOP_RUNS", "ReplayOptions", "TINY_SETTINGS", "TrajectoryEnsembleError", "add_arguments", "bags",
    "closed_loop", "default_model", "finish", "model_notice", "node_params", "open_loop", "pick_domain_id",
    "replay", "ros_env", "run", "toy_installed",
]
