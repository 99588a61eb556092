"""Acceptance 1: one seeded request, three faces, one answer, bitwise.

For the same toy observation, base seed, count and reducer:

- openpi-client's ``WebsocketClientPolicy`` (unchanged, from PyPI) against ``trajectory-ensemble serve-openpi``;
- the Python API, ``Cosmos3ActionModel.generate`` in this process;
- the ROS node, over DDS, for a goal with ``use_seed`` (``tests/_node_harness.py``).

The server and the node are separate processes reading the same params file; the three ``actions`` are equal bitwise.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")
WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy

from _node_harness import serve_node, succeeded
from _openpi_harness import ServerProcess, toy_image

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_node.toy import ACTION_SETTINGS, INSTRUCTION, load_toy_pipeline, request_kwargs

pytestmark = [
    pytest.mark.ros,
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]

PARAMS = {**ACTION_SETTINGS, "model": "toy", "instruction": INSTRUCTION, "reducer": "mode", "candidate_count": 8,
          "max_candidates": 16, "max_batch_candidates": 16, "max_observation_age_s": 120.0}
CASES = [(4, "mode", 2**63 + 5), (1, "mode", 7), (8, "medoid", 123456789)]


@pytest.fixture(scope="module")
def faces(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("openpi_parity")
    nodes = serve_node(tmp, ros_domain_id, PARAMS)
    _node, ros = next(nodes)
    # The node's own params file serves the OpenPI face too: one configuration, two faces.
    server = ServerProcess(["--params-file", str(tmp / "params.yaml"), "--port", "0"], tmp / "openpi.log")
    try:
        server.wait_ready()
        yield ros, WebsocketClientPolicy(host="127.0.0.1", port=server.port), Cosmos3ActionModel(load_toy_pipeline())
    finally:
        server.kill()
        nodes.close()


@pytest.mark.parametrize(("count", "reducer", "seed"), CASES)
def test_openpi_client_the_python_api_and_the_node_agree_bitwise(faces, count, reducer, seed):
    ros, openpi, api = faces
    image = toy_image(seed=count)
    wire = openpi.infer({"observation/image": image, "seed": seed, "num_candidates": count, "reducer": reducer})
    python = api.generate(**request_kwargs(image), spec=CandidateTrajectorySpec(count=count, reducer=reducer),
                          base_seed=seed)
    ros.publish_rgb(image, stamp_sec=1000.0 + count)
    goal = succeeded(ros.run_goal(use_seed=True, seed=seed, candidate_count=count, reducer=reducer))
    node = np.asarray(goal.trajectory.data, dtype=np.float32).reshape(8, 2)
    assert openpi.get_server_metadata()["action_shape"] == [8, 2]
    assert wire["base_seed"] == python.base_seed == goal.base_seed == seed
    assert wire["seeds"] == list(python.seeds)
    assert wire["actions"].dtype == np.float32 and wire["actions"].shape == (8, 2)
    np.testing.assert_array_equal(wire["actions"], python.action.numpy())
    np.testing.assert_array_equal(wire["actions"], node)
