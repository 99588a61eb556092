"""launch_testing: ``serve.launch.py`` starts the node; its action server answers a goal end to end.

Needs a real ROS 2 install (``launch``, ``launch_ros``, ``launch_testing``, and the package built with colcon so
that ``ros2 launch trajectory_ensemble serve.launch.py`` resolves); none of them is on PyPI, so the conftest skips
this module here (marker ``launch_testing``). Run it in the Docker image or a sourced workspace with
``launch_test tests/packaging/test_launch.py`` or ``pytest tests/packaging/test_launch.py``.
"""

from __future__ import annotations

import os
import tempfile
import time
import unittest
import uuid

import pytest
import yaml

from _launch_testing import launch_testing_available

from trajectory_ensemble_node.cli.launcher import pick_domain_id

pytestmark = pytest.mark.launch_testing

# Small enough for a CPU: tiny model, chunk 8, 3 steps, 2 candidates.
TEST_PARAMETERS = {
    "model": "tiny",
    "device": "cpu",
    "domain_name": "droid_lerobot",
    "reducer": "mean",
    "chunk_size": 8,
    "num_inference_steps": 3,
    "candidate_count": 2,
    "max_candidates": 8,
    "max_observation_age_s": 60.0,
}
NS = "/trajectory_ensemble"
GOAL_TIMEOUT_S = 180.0


def _params_file() -> str:
    handle = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)  # noqa: SIM115 - outlives this call
    with handle:
        yaml.safe_dump({"trajectory_ensemble": {"ros__parameters": TEST_PARAMETERS}}, handle)
    return handle.name


def _generate_test_description():
    import launch
    import launch_testing.actions
    from ament_index_python.packages import get_package_share_directory
    from launch.actions import IncludeLaunchDescription
    from launch.launch_description_sources import PythonLaunchDescriptionSource

    # A domain of our own, so a developer's running nodes never answer this test's goal.
    os.environ.setdefault("ROS_DOMAIN_ID", str(pick_domain_id(environ={})))
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    launch_file = os.path.join(get_package_share_directory("trajectory_ensemble"), "launch", "serve.launch.py")
    serve = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(launch_file),
        launch_arguments={"params_file": _params_file(), "device": "cpu"}.items(),
    )
    return launch.LaunchDescription([serve, launch_testing.actions.ReadyToTest()])


if launch_testing_available():
    # The marker belongs to launch_testing's pytest plugin; without it the function is just not collected.
    generate_test_description = pytest.mark.launch_test(_generate_test_description)


class TestGoalRoundTrip(unittest.TestCase):
    """While the launched node runs: find its action server and get a trajectory for one image."""

    def test_action_server_answers_a_goal(self, proc_output=None):
        import rclpy
        from action_msgs.msg import GoalStatus
        from rclpy.action import ActionClient
        from sensor_msgs.msg import Image
        from trajectory_ensemble_msgs.action import GenerateTrajectory

        rclpy.init()
        node = rclpy.create_node(f"launch_test_client_{uuid.uuid4().hex[:8]}")
        try:
            if proc_output is not None:
                proc_output.assertWaitFor("] ready: action ", timeout=GOAL_TIMEOUT_S)
            client = ActionClient(node, GenerateTrajectory, f"{NS}/generate_trajectory")
            self.assertTrue(client.wait_for_server(timeout_sec=GOAL_TIMEOUT_S), "action server not found")
            publisher = node.create_publisher(Image, f"{NS}/observation/image", 10)
            deadline = time.monotonic() + 60
            while publisher.get_subscription_count() == 0 and time.monotonic() < deadline:
                rclpy.spin_once(node, timeout_sec=0.1)
            image = Image(height=48, width=64, encoding="rgb8", step=64 * 3, data=bytes(range(256)) * 36)
            image.header.stamp.sec = 4242
            for _ in range(3):
                publisher.publish(image)
                rclpy.spin_once(node, timeout_sec=0.1)

            sent = client.send_goal_async(GenerateTrajectory.Goal(use_seed=True, seed=7))
            rclpy.spin_until_future_complete(node, sent, timeout_sec=GOAL_TIMEOUT_S)
            handle = sent.result()
            self.assertTrue(handle.accepted)
            result_future = handle.get_result_async()
            rclpy.spin_until_future_complete(node, result_future, timeout_sec=GOAL_TIMEOUT_S)
            response = result_future.result()
            self.assertEqual(response.status, GoalStatus.STATUS_SUCCEEDED, response.result.error_message)
            trajectory = response.result.trajectory
            self.assertEqual((trajectory.horizon, trajectory.action_dim), (8, 10))
            self.assertEqual(trajectory.header.stamp.sec, 4242)
            self.assertEqual(response.result.base_seed, 7)
        finally:
            node.destroy_node()
            rclpy.shutdown()


if launch_testing_available():
    import launch_testing

    @launch_testing.post_shutdown_test()
    class TestShutdown(unittest.TestCase):
        """After launch stops it (SIGINT), the node exits cleanly."""

        def test_exit_code(self, proc_info):
            launch_testing.asserts.assertExitCodes(proc_info)
