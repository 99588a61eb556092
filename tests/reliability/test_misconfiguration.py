"""Fail loud on misconfiguration (issue 20, item 4), over DDS against the node subprocess.

One node serves the module (``require_state``, weight updates under a temporary ``weights_dir``); a second node
with the *same name*, a params file keyed by another node name and a raw-space reducer without action statistics
is started beside it for the startup warnings. Tests run in file order: the first needs a topic that has never
delivered a good frame.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import NODE, RosClient, Stamps, serve_node, write_params  # noqa: E402
from _reliability_harness import publish_until_received, wait_for_log  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.reliability]

stamps = Stamps(23_000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("rel_misconfig")
    (tmp / "weights").mkdir()
    yield from serve_node(tmp, ros_domain_id, {"require_state": True, "enable_weight_updates": True,
                                               "weights_dir": str(tmp / "weights"), "max_observation_age_s": 5.0})


def publish_state(client, **fields) -> None:
    """A joint state of these fields, until the node reports it (a goal sent next is decided on it)."""
    client.publish_joint_state(JointState(name=[f"j{i}" for i in range(len(fields.get("position", [])))], **fields))


def test_frames_refused_for_their_encoding_are_the_root_cause_in_the_goal_error(served):
    _, client = served
    publish_state(client, position=[0.0] * 7)
    publish_until_received(client, stamps(), counted="frames_rejected_encoding", encoding="yuv422")
    outcome = client.run_goal()
    assert outcome.result.error_code == ErrorCode.NO_OBSERVATION, outcome.result.error_message
    message = outcome.result.error_message
    assert "frame(s) refused" in message and "'yuv422'" in message and "not supported" in message, message
    assert "no image received yet" not in message


def test_require_state_refuses_an_empty_state_and_non_finite_velocities(served):
    _, client = served
    publish_until_received(client, stamps())
    publish_state(client)  # empty JointState
    empty = client.run_goal()
    assert empty.result.error_code == ErrorCode.NON_FINITE_STATE, empty.result.error_message
    assert "empty" in empty.result.error_message
    publish_state(client, position=[0.0] * 7, velocity=[0.0] * 6 + [-math.inf])
    inf = client.run_goal()
    assert inf.result.error_code == ErrorCode.NON_FINITE_STATE, inf.result.error_message
    assert "velocities" in inf.result.error_message and "j6" in inf.result.error_message
    publish_state(client, position=[0.0] * 7, effort=[math.nan] * 7)
    nan = client.run_goal()
    assert nan.result.error_code == ErrorCode.NON_FINITE_STATE and "efforts" in nan.result.error_message
    publish_state(client, position=[0.0] * 7, velocity=[0.1] * 7)
    publish_until_received(client, stamps())
    ok = client.run_goal()
    assert ok.status == GoalStatus.STATUS_SUCCEEDED, ok.result.error_message


def test_a_wrongly_typed_fault_injection_is_refused(served):
    _, client = served
    result = client.set_parameter("fault_injection", 5)
    assert not result.successful
    assert "fault_injection" in result.reason and "expected a str" in result.reason
    assert client.set_parameter("fault_injection", "").successful


def test_update_weights_refusals_name_the_rule_and_reveal_nothing(served):
    node, client = served
    weights = node.log_path.parent / "weights"
    secret = node.log_path.parent / "secret_target.safetensors"
    secret.write_bytes(b"x")
    (weights / "link.safetensors").symlink_to(secret)
    answers = {}
    for path in (f"/proc/{node.proc.pid}/environ", "/definitely/missing.safetensors", "link.safetensors",
                 "missing.safetensors", str(secret)):
        response = client.update_weights(path)
        assert not response.success
        assert "an existing file inside weights_dir" in response.message, response.message
        assert "secret_target" not in response.message.replace(repr(path), ""), response.message
        answers[path] = response.message.replace(repr(path), "<path>")
    # Missing and outside get the same answer: the service cannot be used to probe what exists.
    assert len(set(answers.values())) == 1, answers


def test_a_second_node_with_the_same_name_a_foreign_params_file_and_a_raw_reducer_is_loud(served, tmp_path):
    node, _ = served
    from trajectory_ensemble_node.cli.launcher import ros_env

    own = write_params(tmp_path / "own.yaml", {"reducer": "pose_gripper"})
    foreign = tmp_path / "foreign.yaml"
    foreign.write_text(yaml.safe_dump({"some_other_node": {"ros__parameters": {"chunk_size": 4}}}))
    env = {**ros_env(int(os.environ["ROS_DOMAIN_ID"])), "TRAJECTORY_ENSEMBLE_TESTING": "1"}
    log = tmp_path / "second.log"
    with open(log, "wb") as out:
        second = subprocess.Popen(
            [sys.executable, "-m", "trajectory_ensemble_node.cli", "serve", "--params-file", str(own),
             "--ros-args", "--params-file", str(foreign)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180.0
        while "] ready: " not in log.read_text(errors="replace") and time.monotonic() < deadline:
            assert second.poll() is None, log.read_text(errors="replace")
            time.sleep(0.2)

        def text() -> str:
            return log.read_text(errors="replace")

        RosClient.wait(lambda: f"2 nodes named /{NODE}" in text(), 30.0, "the duplicate-name error in the second node")
        assert f"params file {str(foreign)!r} has no section for this node (/{NODE})" in text()
        assert "reducer 'pose_gripper' needs physical units" in text() and "action_stats_file" in text()
        # The first node notices too (its periodic check), so whichever started first also says so.
        assert wait_for_log(node, f"2 nodes named /{NODE}", timeout_s=30.0)
    finally:
        second.send_signal(signal.SIGINT)
        second.wait(30)
