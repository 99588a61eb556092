"""A node that is ready when its action server appears (issue 45, row 4).

The README's client (``wait_for_server()``, then a goal while the camera starts publishing) succeeds on its first
goal against a node that was just started; with no camera at all, the goal ends ``NO_OBSERVATION`` after
``startup_goal_wait_s`` while ``/diagnostics`` say what the node waits for; a waiting goal can be canceled and ends
``SHUTDOWN`` when the node stops. The gate and the buffer's wait are tested without DDS first.
"""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import (  # noqa: E402
    NS,
    NodeProcess,
    RosClient,
    image_msg,
    succeeded,
    write_params,
)
from action_msgs.msg import GoalStatus  # noqa: E402
from builtin_interfaces.msg import Time  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402
from trajectory_ensemble_node.errors import GroupCanceledError, NoObservationError  # noqa: E402
from trajectory_ensemble_node.ros.diagnostics import DiagnosticsInputs, build_diagnostics  # noqa: E402
from trajectory_ensemble_node.serving.observation_buffer import ObservationBuffer  # noqa: E402
from trajectory_ensemble_node.ros.readiness import FirstObservationGate, readiness_text  # noqa: E402

IMAGE_TOPIC = f"{NS}/observation/image"
WAITING = f"waiting for first frame on {IMAGE_TOPIC}"


def frame(sec: int) -> Image:
    msg = Image(height=16, width=16, encoding="rgb8", step=48, data=bytes(16 * 16 * 3))
    msg.header.stamp.sec = sec
    return msg


# --- without DDS -----------------------------------------------------------------------------------------------------


def test_only_image_topics_that_delivered_nothing_are_waited_for():
    buffer = ObservationBuffer(["/a", "/b"], "/s", min_image_side=16)
    assert buffer.silent() == ["/a", "/b"]
    buffer.offer_image("/a", frame(1))
    assert buffer.silent() == ["/b"] and readiness_text(buffer.silent()) == "waiting for first frame on /b"
    buffer.offer_image("/b", frame(2))
    assert buffer.silent() == [] and readiness_text([]) == "ready"
    # Frames that were all refused are a reason a goal gives at once: nothing is waited for then.
    refused = ObservationBuffer(["/a", "/b"], "/s", min_image_side=16)
    refused.offer_image("/b", Image(height=1, width=1, encoding="rgb8", step=3, data=bytes(3)))
    assert refused.silent() == []
    cleared = ObservationBuffer(["/a"])
    cleared.clear("the clock jumped back")
    assert cleared.silent() == []  # the goal says why at once


def test_a_waiting_goal_is_served_by_the_first_frame_and_woken_by_it():
    buffer = ObservationBuffer(["/a"])
    lines: list[str] = []
    gate = FirstObservationGate(600.0, 2, lines.append)
    arrived = threading.Event()

    def publish_when_waiting() -> None:
        # The gate logs before it waits: the frame comes after the goal started waiting, and wakes it.
        while not lines:
            threading.Event().wait(0.01)
        buffer.offer_image("/a", frame(3))
        arrived.set()

    threading.Thread(target=publish_when_waiting, daemon=True).start()
    gate.await_first("g1", buffer, stopped=lambda: None)
    assert arrived.is_set() and "goal g1: waiting up to 600 s" in lines[0] and "/a" in lines[0]
    assert buffer.latest(60.0).stamp.sec == 3


def test_a_goal_with_nothing_after_the_wait_ends_no_observation_naming_the_topics():
    gate = FirstObservationGate(0.05, 2, lambda _: None)
    with pytest.raises(NoObservationError, match=r"nothing received yet on /a within startup_goal_wait_s=0\.05 s"):
        gate.await_first("g", ObservationBuffer(["/a"]), stopped=lambda: None)
    off = FirstObservationGate(0.0, 2, lambda _: None)
    off.await_first("g", ObservationBuffer(["/a"]), stopped=lambda: None)  # 0: refuse later


def test_a_stop_ends_the_wait_at_once_and_the_slots_are_bounded():
    buffer = ObservationBuffer(["/a"])
    gate = FirstObservationGate(600.0, 1, lambda _: None)
    stop: list[BaseException] = []
    waiting, ended = threading.Event(), threading.Event()
    outcome: list[BaseException] = []

    def wait() -> None:
        waiting.set()
        try:
            gate.await_first("g1", buffer, stopped=lambda: stop[0] if stop else None)
        except BaseException as error:  # noqa: BLE001 - the test inspects it
            outcome.append(error)
        ended.set()

    threading.Thread(target=wait, daemon=True).start()
    waiting.wait(60.0)
    # The one slot is taken (or about to be): a second goal is refused at once rather than holding a thread.
    while not gate._waiting:
        threading.Event().wait(0.01)
    with pytest.raises(NoObservationError, match="1 goal\\(s\\) already wait"):
        gate.await_first("g2", buffer, stopped=lambda: None)
    stop.append(GroupCanceledError("g1", "goal g1 canceled by the client"))
    buffer.wake_waiters()
    assert ended.wait(60.0) and isinstance(outcome[0], GroupCanceledError)
    assert gate._waiting == 0


def test_diagnostics_say_what_an_active_node_waits_for():
    inputs = DiagnosticsInputs(node_name="te", hardware_id="cpu", model="tiny", notice="n", weights_version=0,
                               engine_alive=True, readiness=WAITING, lifecycle_state="active")
    engine = build_diagnostics(inputs, Time()).status[0]
    assert engine.level == b"\x00" and engine.message == f"active: {WAITING} (n)"
    assert {kv.key: kv.value for kv in engine.values}["readiness"] == WAITING


# --- the node, over DDS ----------------------------------------------------------------------------------------------


@pytest.mark.ros
@pytest.mark.slow
def test_a_just_started_node_serves_the_readme_clients_first_goal(tmp_path, ros_domain_id):
    """Start the node; at once wait_for_server() and send a goal; the camera starts publishing only once the goal
    waits, so the goal certainly arrived before the node's first frame; it succeeds on that frame."""
    from trajectory_ensemble_node.cli.launcher import ros_env

    node = NodeProcess(write_params(tmp_path / "params.yaml", {}), ros_env(ros_domain_id), tmp_path / "node.log")
    client = RosClient(domain_id=ros_domain_id)
    camera_stop = threading.Event()
    try:
        assert client.action.wait_for_server(timeout_sec=180.0), "action server not found"
        outcome = client.send_goal(candidate_count=2)  # at once, as the README's client does
        assert outcome.accepted
        client.wait(lambda: "for the first frame on" in node.log(), 180.0, "the goal waiting for the first frame")
        _, engine = client.latest_status("engine", timeout=60.0, predicate=lambda v: v.get("readiness") == WAITING)
        assert engine["lifecycle_state"] == "active"
        stamp = 45_901

        def camera() -> None:
            while not camera_stop.is_set():
                client.image_pubs[IMAGE_TOPIC].publish(image_msg(stamp))
                camera_stop.wait(0.1)

        threading.Thread(target=camera, daemon=True).start()
        result = succeeded(client.result(outcome))
        assert result.trajectory.header.stamp.sec == stamp and result.trajectory.horizon == 8
        client.latest_status("engine", predicate=lambda v: v.get("readiness") == "ready")
    finally:
        camera_stop.set()
        client.close()
        assert node.stop() == 0


@pytest.fixture(scope="module")
def cameraless(tmp_path_factory, ros_domain_id):
    """A node no camera ever publishes to (a goal's wait is bounded by startup_goal_wait_s: 20 s)."""
    from trajectory_ensemble_node.cli.launcher import ros_env

    tmp = tmp_path_factory.mktemp("readiness")
    node = NodeProcess(write_params(tmp / "params.yaml", {"startup_goal_wait_s": 20.0}), ros_env(ros_domain_id),
                       tmp / "node.log")
    client = None
    try:
        node.wait_ready()
        client = RosClient(domain_id=ros_domain_id)
        assert client.action.wait_for_server(timeout_sec=60.0)
        yield node, client
    finally:
        if client is not None:
            client.close()
        node.stop()


@pytest.mark.ros
@pytest.mark.slow
def test_without_a_camera_a_goal_ends_no_observation_after_the_bounded_wait(cameraless):
    node, client = cameraless
    status, engine = client.latest_status("engine", predicate=lambda v: v.get("readiness") == WAITING)
    assert status.level == b"\x00" and WAITING in status.message
    outcome = client.run_goal()
    assert outcome.status == GoalStatus.STATUS_ABORTED
    assert outcome.result.error_code == ErrorCode.NO_OBSERVATION, outcome.result.error_message
    assert f"nothing received yet on {IMAGE_TOPIC} within startup_goal_wait_s=20 s" in outcome.result.error_message
    assert f"goal {outcome.goal_id}: waiting up to 20 s" in node.log()
    client.latest_status("engine", predicate=lambda v: v.get("readiness") == WAITING)  # still waiting, still said


@pytest.mark.ros
@pytest.mark.slow
def test_a_goal_waiting_for_the_first_frame_can_be_canceled(cameraless):
    node, client = cameraless
    outcome = client.send_goal()
    client.wait(lambda: f"goal {outcome.goal_id}: waiting up to" in node.log(), 60.0, "the goal waiting")
    assert client.cancel(outcome).return_code == 0
    ended = client.result(outcome)
    assert ended.status == GoalStatus.STATUS_CANCELED and ended.result.error_code == ErrorCode.CANCELED


@pytest.mark.ros
@pytest.mark.slow
def test_a_goal_waiting_for_the_first_frame_ends_shutdown_when_the_node_stops(cameraless):
    node, client = cameraless
    outcome = client.send_goal()
    client.wait(lambda: f"goal {outcome.goal_id}: waiting up to" in node.log(), 60.0, "the goal waiting")
    assert node.stop() == 0
    ended = client.result(outcome, timeout=60.0)
    assert ended.status == GoalStatus.STATUS_ABORTED and ended.result.error_code == ErrorCode.SHUTDOWN
