"""The node on a remote engine (``engine: openpi``) serves a model that takes the robot's state (issue 58, item 5 and
acceptance 3), over DDS.

``serve-openpi`` (a process) serves a tiny checkpoint written here that declares a state input (``agent_x``,
``agent_y``). The node holds no model: it learns from the server's handshake which joints the model reads, pairs the
frame with its ``JointState``, picks the joints by name and sends them as ``observation/state``, float64. What a user
checks: the node's result equals the in-process model's for the same frame, state and seed, bit for bit, and
another state gives another result. Before the node started its model ahead of reading what it takes, a remote
state-taking model was never sent a state.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openpi"))  # the OpenPI tests' harness

from _node_harness import (  # noqa: E402
    BASE_PARAMS,
    Stamps,
    image_msg,
    metrics_dict,
    serve_node,
    succeeded,
    write_state_checkpoint,
)
from _openpi_harness import ServerProcess, served_in_process, write_params  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402

from trajectory_ensemble_node.serving.model_factory import build_model  # noqa: E402
from trajectory_ensemble_node.serving.params import validate  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

NAMES = ("agent_x", "agent_y")
LOW, HIGH = [0.0, 0.0], [512.0, 512.0]
STATE = {"agent_x": 212.0, "agent_y": 340.1}  # 340.1 has no float32: a lossy cast on the way would change the bits
OTHER = {"agent_x": 40.25, "agent_y": 96.0}
SEED = 29
# The server and the node agree on every setting the handshake checks (embodiment, chunk, steps, ...).
SERVED = {**BASE_PARAMS, "candidate_count": 2, "num_inference_steps": 2, "max_observation_age_s": 120.0}
stamps = Stamps(7000)


@pytest.fixture(scope="module")
def remote(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_remote_state")
    checkpoint = write_state_checkpoint(tmp / "state_model", NAMES, LOW, HIGH)
    served = {**SERVED, "model": str(checkpoint)}
    server = ServerProcess(["--params-file", str(write_params(tmp / "server.yaml", served)), "--port", "0"],
                           tmp / "server.log")
    try:
        server.wait_ready()
        nodes = serve_node(tmp, ros_domain_id, {**served, "engine": "openpi",
                                                "engine_url": f"ws://127.0.0.1:{server.port}",
                                                "engine_timeout_s": 60.0})
        _node, ros = next(nodes)
        try:
            yield ros, served
        finally:
            nodes.close()
    finally:
        server.kill()


def observe(ros, positions: dict[str, float]) -> None:
    """The harness's frame (pixels of seed 0) stamped anew, and a joint state of the same stamp with one more joint
    than the model reads, in another order."""
    stamp = stamps()
    msg = JointState(name=["wrist", *reversed(list(positions))], position=[9.0, *reversed(list(positions.values()))])
    msg.header.stamp.sec = stamp
    ros.publish_joint_state(msg)
    ros.publish_image(stamp)


def test_the_node_on_a_remote_engine_feeds_the_state_and_equals_the_in_process_model(remote):
    ros, served = remote
    observe(ros, STATE)
    first = succeeded(ros.run_goal(use_seed=True, seed=SEED))
    assert metrics_dict(first)["remote_requests"] == "1"
    observe(ros, OTHER)
    other = succeeded(ros.run_goal(use_seed=True, seed=SEED))

    # The same checkpoint, frame, state and seed in this process, through the faces' one builder.
    params = validate(served)
    frame = image_msg(0)
    rgb = np.frombuffer(bytes(frame.data), dtype=np.uint8).reshape(frame.height, frame.width, 3)
    model = build_model(params)
    model.start()
    try:
        here, other_here = (served_in_process(model, params, [s[name] for name in NAMES], SEED, rgb)
                            for s in (STATE, OTHER))
    finally:
        model.stop()
    for goal, result in ((first, here), (other, other_here)):
        np.testing.assert_array_equal(np.asarray(goal.trajectory.data, dtype=np.float32).reshape(8, 10),
                                      result.action.numpy())
    assert not np.array_equal(here.action.numpy(), other_here.action.numpy())
