"""The bundled ``model: pusht`` takes the agent's position (issue 58's contract, item 7).

Served by name, with the settings it was trained with: its handshake names the state ``agent_x``, ``agent_y``; a
request without ``observation/state`` is ``OBSERVATION_SCHEMA`` (25) naming the key; the same frame and seed with two
states give two answers; the same frame, state and seed give the same bits through ``serve-openpi`` (openpi-client)
as in process. The node's side (a JointState by name) is ``lab/tests/pusht/test_pusht_train_states.py``'s, on a
checkpoint of the same shape.
"""

from __future__ import annotations

import numpy as np
import pytest
from _openpi_harness import served_in_process, serving, state_request

from trajectory_ensemble_node import bundled
from trajectory_ensemble_node.models.cosmos3 import read_state_input
from trajectory_ensemble_node.openpi import OpenPIPolicy
from trajectory_ensemble_node.serving.params import validate
from trajectory_ensemble_node.wire.codec import parse_error_frame

WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

FRAME = np.full((96, 96, 3), 255, np.uint8)
FRAME[40:56, 30:70] = (119, 136, 153)  # a grey bar where a T might be
SEED = 5


@pytest.fixture(scope="module")
def pusht_policy():
    if not (bundled.bundled_policy("pusht").directory / "model_index.json").is_file():
        pytest.skip("this install has no bundled PushT weights")
    params = validate({"model": "pusht", **bundled.PUSHT_SETTINGS, "num_inference_steps": 2, "candidate_count": 2,
                       "openpi_schema": "toy"})
    policy = OpenPIPolicy.from_params(params)
    policy.start()
    yield policy, params
    policy.stop()


def test_the_bundle_declares_the_agents_position_in_env_pixels():
    declared = read_state_input(bundled.bundled_policy("pusht").directory)
    assert declared is not None and declared.names == ("agent_x", "agent_y")
    assert declared.normalizer.method == "minmax"
    assert [float(v) for v in declared.normalizer.stats["min"]] == [0.0, 0.0]
    assert [float(v) for v in declared.normalizer.stats["max"]] == [512.0, 512.0]


def test_served_by_name_it_takes_the_state_and_the_wire_gives_the_in_process_bits(pusht_policy):
    policy, params = pusht_policy
    with serving(policy) as server:
        client = WebsocketClientPolicy(host="127.0.0.1", port=server.port)
        metadata = client.get_server_metadata()
        assert metadata["state"]["names"] == ["agent_x", "agent_y"] and metadata["state"]["width"] == 2
        with pytest.raises(RuntimeError) as missing:
            client.infer(state_request(None, SEED, FRAME))
        # openpi-client raises the server's error frame after its own first line.
        frame = parse_error_frame(str(missing.value).split("\n", 1)[1])
        assert frame["code"] == 25 and frame["error"] == "OBSERVATION_SCHEMA" and "observation/state" in frame["message"]
        here = client.infer(state_request(np.array([100.0, 400.0]), SEED, FRAME))
        again = client.infer(state_request(np.array([100.0, 400.0]), SEED, FRAME))
        there = client.infer(state_request(np.array([420.0, 80.0]), SEED, FRAME))
    assert np.array_equal(here["candidates"], again["candidates"])
    assert not np.array_equal(here["candidates"], there["candidates"])
    local = served_in_process(policy.model, params, np.array([100.0, 400.0]), SEED, FRAME)
    assert np.array_equal(np.asarray(local.candidates, dtype=np.float32), here["candidates"])
