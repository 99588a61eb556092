"""The ``trajectory-ensemble`` command: its dispatcher (:mod:`.dispatch`) and the operator commands.

Modules that talk to a node import rclpy inside the functions that need it, so this package imports without ROS.
``trajectory_ensemble_node.cli:main`` and ``:node_main`` stay the console scripts' entry points (pyproject.toml,
colcon's setup), so the dispatcher's names are re-exported here.
"""

from .dispatch import BROKEN_PIPE_EXIT, COMMAND_GROUP, commands, main, node_main

__all__ = ["BROKEN_PIPE_EXIT", "COMMAND_GROUP", "commands", "main", "node_main"]
