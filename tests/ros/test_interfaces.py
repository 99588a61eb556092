"""The trajectory_ensemble_msgs interfaces: generated classes, exact public fields, and a real action round trip."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from typing import Any

import pytest

# Field order is part of the wire format, so the expected fields are ordered lists, not sets.
ACTION_TRAJECTORY_FIELDS = [
    ("header", "std_msgs/Header"),
    ("domain_name", "string"),
    ("horizon", "uint32"),
    ("action_dim", "uint32"),
    ("dt", "float"),
    ("data", "sequence<float>"),
    ("reducer", "string"),
    ("candidate_count", "uint32"),
    ("base_seed", "uint64"),
    ("normalized", "boolean"),
]
CANDIDATE_ARRAY_FIELDS = [
    ("header", "std_msgs/Header"),
    ("candidate_ids", "sequence<uint32>"),
    ("seeds", "sequence<uint64>"),
    ("horizon", "uint32"),
    ("action_dim", "uint32"),
    ("data", "sequence<float>"),
    ("domain_name", "string"),
    ("dt", "float"),
    ("normalized", "boolean"),
    ("valid", "sequence<boolean>"),
]
GOAL_FIELDS = [
    ("instruction", "string"),
    ("candidate_count", "uint32"),
    ("reducer", "string"),
    ("return_candidates", "boolean"),
    ("use_seed", "boolean"),
    ("seed", "uint64"),
    ("rollout", "boolean"),
    ("continue_previous", "boolean"),
    ("reset_context", "boolean"),
    ("inference_delay", "int32"),
    ("guidance", "string"),
    ("deadline", "builtin_interfaces/Duration"),
    ("min_observation_stamp", "builtin_interfaces/Time"),
]
RESULT_FIELDS = [
    ("error_code", "uint16"),
    ("error_message", "string"),
    ("trajectory", "trajectory_ensemble_msgs/ActionTrajectory"),
    ("candidates", "trajectory_ensemble_msgs/CandidateArray"),
    ("base_seed", "uint64"),
    ("rollout_path", "string"),
    ("weights_version", "uint64"),
    ("metrics", "sequence<diagnostic_msgs/KeyValue>"),
    ("steps_planned", "uint16"),
    ("steps_fitted", "uint16"),
    ("steps_used", "uint16"),
    ("uncertain", "boolean"),
    ("uncertainty", "trajectory_ensemble_msgs/Uncertainty"),
    ("validity", "trajectory_ensemble_msgs/CandidateValidity"),
    ("continuity", "trajectory_ensemble_msgs/Continuity"),
]
FEEDBACK_FIELDS = [
    ("step", "uint32"),
    ("total_steps", "uint32"),
    ("stage", "string"),
    ("frozen_actions", "uint16"),
    ("guidance", "string"),
    ("metrics", "sequence<diagnostic_msgs/KeyValue>"),
]
UNCERTAINTY_FIELDS = [
    ("score", "float"),
    ("threshold", "float"),
    ("modes", "uint16"),
    ("mode_share", "float"),
    ("spread", "float"),
    ("step_std", "sequence<float>"),
    # Observation novelty and the alarm rule (issue 33).
    ("novelty_score", "float"),
    ("novelty_threshold", "float"),
    ("novel", "boolean"),
    ("rule", "string"),
    ("window", "uint16"),
    ("window_score", "float"),
    ("window_novelty_score", "float"),
]
CANDIDATE_VALIDITY_FIELDS = [
    ("valid", "uint16"),
    ("dropped", "uint16"),
    ("clamped", "uint16"),
    ("drop_reasons", "sequence<string>"),
    ("drop_counts", "sequence<uint16>"),
    ("action_clamped", "boolean"),
]
CONTINUITY_FIELDS = [
    ("continued", "boolean"),
    ("status", "string"),
    ("frozen_actions", "uint16"),
    ("shift", "int32"),
    ("guidance", "string"),
    ("seam_jump", "float"),
    ("previous_stamp", "builtin_interfaces/Time"),
]
UPDATE_WEIGHTS_REQUEST_FIELDS = [("path", "string"), ("strict", "boolean")]
UPDATE_WEIGHTS_RESPONSE_FIELDS = [
    ("success", "boolean"),
    ("message", "string"),
    ("weights_version", "uint64"),
]


def _fields(cls: Any) -> list[tuple[str, str]]:
    """Return the generated class's fields as ordered (name, type) pairs."""
    return list(cls.get_fields_and_field_types().items())


def test_interfaces_import() -> None:
    """The generated Python packages import from the venv (the line README and CI rely on)."""
    from trajectory_ensemble_msgs.action import GenerateTrajectory
    from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateArray
    from trajectory_ensemble_msgs.srv import UpdateWeights

    for cls in (ActionTrajectory, CandidateArray, GenerateTrajectory.Goal, UpdateWeights.Request):
        cls()  # constructing touches the C type support, not just the .py files


def test_message_fields() -> None:
    """ActionTrajectory and CandidateArray carry exactly the public fields, in order."""
    from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateArray

    from trajectory_ensemble_msgs.msg import CandidateValidity, Continuity, Uncertainty

    assert _fields(ActionTrajectory) == ACTION_TRAJECTORY_FIELDS
    assert _fields(CandidateArray) == CANDIDATE_ARRAY_FIELDS
    assert _fields(Uncertainty) == UNCERTAINTY_FIELDS
    assert _fields(CandidateValidity) == CANDIDATE_VALIDITY_FIELDS
    assert _fields(Continuity) == CONTINUITY_FIELDS


def test_action_fields() -> None:
    """GenerateTrajectory's goal, result and feedback carry exactly the public fields, in order."""
    from trajectory_ensemble_msgs.action import GenerateTrajectory

    assert _fields(GenerateTrajectory.Goal) == GOAL_FIELDS
    assert _fields(GenerateTrajectory.Result) == RESULT_FIELDS
    assert _fields(GenerateTrajectory.Feedback) == FEEDBACK_FIELDS


def test_service_fields() -> None:
    """UpdateWeights' request and response carry exactly the public fields, in order."""
    from trajectory_ensemble_msgs.srv import UpdateWeights

    assert _fields(UpdateWeights.Request) == UPDATE_WEIGHTS_REQUEST_FIELDS
    assert _fields(UpdateWeights.Response) == UPDATE_WEIGHTS_RESPONSE_FIELDS


def test_message_round_trips_through_serialization() -> None:
    """An ActionTrajectory survives the C serializer unchanged (float32 data, uint64 seed)."""
    from rclpy.serialization import deserialize_message, serialize_message
    from trajectory_ensemble_msgs.msg import ActionTrajectory

    msg = ActionTrajectory(
        domain_name="droid_lerobot",
        horizon=2,
        action_dim=3,
        dt=0.0625,  # exactly representable in float32, so == is fair
        data=[0.5, -1.0, 0.25, 1.0, 0.0, -0.5],
        reducer="mean",
        candidate_count=8,
        base_seed=2**64 - 1,
        normalized=True,
    )
    msg.header.stamp.sec = 12
    msg.header.frame_id = "base"
    back = deserialize_message(serialize_message(msg), ActionTrajectory)
    assert back == msg


# A GenerateTrajectory action server, run in its own process. It answers one goal with feedback for
# three steps and a result derived from the goal, so the client can check both directions. rclpy's ActionClient
# drops feedback that lands after the result, and feedback and result travel on different DDS channels: the server
# succeeds only once the client has said (on <action>/test_feedback_seen) that the last feedback reached it.
_SERVER_SCRIPT = r"""
import sys
import threading
import time

import rclpy
from rclpy.action import ActionServer
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from diagnostic_msgs.msg import KeyValue
from std_msgs.msg import UInt32
from trajectory_ensemble_msgs.action import GenerateTrajectory

action_name = sys.argv[1]
feedback_topic = action_name + "/_action/feedback"
rclpy.init()
node = rclpy.create_node("te_test_action_server")
group = ReentrantCallbackGroup()
seen = []
seen_cond = threading.Condition()


def on_seen(msg):
    with seen_cond:
        seen.append(msg.data)
        seen_cond.notify_all()


node.create_subscription(UInt32, action_name + "/test_feedback_seen", on_seen, 10, callback_group=group)


def wait_for(predicate, timeout_s, what):
    # Bounded, for a client that never comes: the test then fails on what is missing.
    with seen_cond:
        if not seen_cond.wait_for(predicate, timeout=timeout_s):
            print("TIMEOUT " + what, flush=True)


def execute(goal_handle):
    goal = goal_handle.request
    # Feedback is reliable: once the client's feedback subscription is matched, it reaches the client.
    deadline = time.monotonic() + 10.0
    while node.count_subscribers(feedback_topic) < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    total = 3
    for step in range(1, total + 1):
        goal_handle.publish_feedback(
            GenerateTrajectory.Feedback(step=step, total_steps=total, stage="denoising")
        )
    wait_for(lambda: total in seen, 30.0, "the client's word that the last feedback arrived")
    goal_handle.succeed()
    result = GenerateTrajectory.Result()
    result.error_code = 0
    result.base_seed = goal.seed if goal.use_seed else 7
    result.weights_version = 3
    traj = result.trajectory
    traj.domain_name = "droid_lerobot"
    traj.horizon = 2
    traj.action_dim = 3
    traj.dt = 0.5
    traj.data = [float(goal.candidate_count)] * 6
    traj.reducer = goal.reducer
    traj.candidate_count = goal.candidate_count
    traj.base_seed = result.base_seed
    result.metrics = [KeyValue(key="instruction", value=goal.instruction)]
    return result


server = ActionServer(node, GenerateTrajectory, action_name, execute_callback=execute, callback_group=group)
executor = MultiThreadedExecutor(num_threads=2)
executor.add_node(node)
print("READY", flush=True)
# Bounded life: the test terminates this process, but never leave a DDS participant behind.
end = time.monotonic() + 120.0
while rclpy.ok() and time.monotonic() < end:
    executor.spin_once(timeout_sec=0.1)
"""


def _wait_for_line(proc: subprocess.Popen[str], expected: str, timeout_s: float) -> None:
    """Read ``proc``'s stdout until a line equals ``expected``; fail with its output otherwise."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()
            if line.strip() == expected:
                return
            if line:
                seen.append(line)
        if proc.poll() is not None:
            break
    raise AssertionError(f"server did not print {expected!r} (exit {proc.poll()}): {''.join(seen)}")


@pytest.mark.ros
def test_action_round_trip_over_dds(ros_env: dict[str, str]) -> None:
    """A goal sent from this process reaches a server in another process over Fast DDS; feedback and
    the result come back with the values the goal asked for."""
    import rclpy
    from action_msgs.msg import GoalStatus
    from rclpy.action import ActionClient
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import UInt32
    from trajectory_ensemble_msgs.action import GenerateTrajectory

    action_name = f"/te_test_{os.getpid()}/generate_trajectory"
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER_SCRIPT, action_name],
        env=ros_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # A context of our own, so this test neither depends on nor disturbs rclpy's global one.
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        _wait_for_line(server, "READY", timeout_s=60.0)
        node = rclpy.create_node("te_test_action_client", context=context)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        client = ActionClient(node, GenerateTrajectory, action_name)
        assert client.wait_for_server(timeout_sec=30.0), "action server not discovered"
        # Reliable, so once the server's subscription is matched, what is published here reaches it.
        seen = node.create_publisher(UInt32, action_name + "/test_feedback_seen", 10)
        deadline = time.monotonic() + 30.0
        while seen.get_subscription_count() < 1 and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
        assert seen.get_subscription_count() >= 1, "the server's feedback_seen subscription not discovered"

        feedback: list[Any] = []

        def on_feedback(msg: Any) -> None:
            feedback.append(msg.feedback)
            seen.publish(UInt32(data=int(msg.feedback.step)))

        goal = GenerateTrajectory.Goal(
            instruction="pick up the cup",
            candidate_count=4,
            reducer="medoid",
            return_candidates=False,
            use_seed=True,
            seed=2**63 + 5,
            rollout=False,
        )
        send_future = client.send_goal_async(goal, feedback_callback=on_feedback)
        executor.spin_until_future_complete(send_future, timeout_sec=30.0)
        assert send_future.done(), "goal response never arrived"
        goal_handle = send_future.result()
        assert goal_handle is not None and goal_handle.accepted

        result_future = goal_handle.get_result_async()
        executor.spin_until_future_complete(result_future, timeout_sec=30.0)
        assert result_future.done(), "result never arrived"
        response = result_future.result()
        # rclpy's ActionClient drops a goal's feedback callback once the result arrives, so feedback landing later
        # is lost; the server answers only after this side has reported the last feedback.

        assert response.status == GoalStatus.STATUS_SUCCEEDED
        result = response.result
        assert result.error_code == 0
        assert result.base_seed == 2**63 + 5
        assert result.weights_version == 3
        assert result.trajectory.horizon == 2 and result.trajectory.action_dim == 3
        assert list(result.trajectory.data) == [4.0] * 6
        assert result.trajectory.reducer == "medoid"
        assert result.trajectory.candidate_count == 4
        assert [(kv.key, kv.value) for kv in result.metrics] == [("instruction", "pick up the cup")]

        assert feedback, "no feedback arrived"
        assert [(f.step, f.total_steps, f.stage) for f in feedback] == [
            (step, 3, "denoising") for step in range(4 - len(feedback), 4)
        ]
        client.destroy()
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
