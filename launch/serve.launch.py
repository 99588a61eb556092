"""Start the trajectory_ensemble node with a parameter file: ``ros2 launch trajectory_ensemble serve.launch.py``.

The node is a managed (lifecycle) node. With ``autostart:=true`` (the default) it configures and activates itself,
as a plain node would; with ``autostart:=false`` it waits unconfigured for a lifecycle manager (nav2's
``lifecycle_manager``, ``ros2 lifecycle set``, ``trajectory-ensemble lifecycle set``).
"""

from __future__ import annotations

import os

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterValue


def generate_launch_description() -> LaunchDescription:
    """Declare ``params_file``, ``namespace``, ``device`` and ``autostart``, and start one managed node with them."""
    default_params = os.path.join(get_package_share_directory("trajectory_ensemble"), "config", "serve.yaml")
    params_file = LaunchConfiguration("params_file")
    namespace = LaunchConfiguration("namespace")
    device = LaunchConfiguration("device")
    autostart = LaunchConfiguration("autostart")
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
            DeclareLaunchArgument(
                "autostart",
                default_value="true",
                description="configure and activate at start; false: wait for a lifecycle manager (overrides "
                            "params_file)",
            ),
            # The node runs its own transitions when autostart is true, so launch_ros's autostart stays off.
            LifecycleNode(
                package="trajectory_ensemble",
                executable="trajectory_ensemble_node",
                name="trajectory_ensemble",
                namespace=namespace,
                # Later entries win, so the device and autostart arguments override the file.
                parameters=[params_file, {"device": device, "autostart": ParameterValue(autostart, value_type=bool)}],
                output="screen",
                emulate_tty=True,
            ),
        ]
    )
