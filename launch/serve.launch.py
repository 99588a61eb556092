"""Start the trajectory_ensemble node with a parameter file: ``ros2 launch trajectory_ensemble serve.launch.py``."""

from __future__ import annotations

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node


def generate_launch_description() -> LaunchDescription:
    """Declare ``params_file``, ``namespace`` and ``device``, and start one node with them."""
    default_params = os.path.join(get_package_share_directory("trajectory_ensemble"), "config", "serve.yaml")
    params_file = LaunchConfiguration("params_file")
    namespace = LaunchConfiguration("namespace")
    device = LaunchConfiguration("device")
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "params_file",
                default_value=default_params,
                description="YAML file with the node's ros__parameters",
            ),
            DeclareLaunchArgument("namespace", default_value="", description="namespace of the node"),
            DeclareLaunchArgument(
                "device",
                default_value="auto",
                description="torch device: auto, cpu, cuda or cuda:N (overrides params_file)",
            ),
            Node(
                package="trajectory_ensemble",
                executable="trajectory_ensemble_node",
                name="trajectory_ensemble",
                namespace=namespace,
                # Later entries win, so the device argument overrides the file.
                parameters=[params_file, {"device": device}],
                output="screen",
                emulate_tty=True,
            ),
        ]
    )
