"""``serve-ray`` carries the robot's state bitwise (issue 58, item 5): a state checkpoint behind Ray Serve.

One Ray instance for the module, one engine replica loading the tiny state checkpoint written into tmp (as
``tests/openpi/test_wire_state.py`` serves it), its ingress on a free port. The same frame, state and seed give the
same bits as the model in this process; another state gives another answer; a request without the state is refused
at the ingress with ``OBSERVATION_SCHEMA`` (25) naming the key. Without Ray installed this module skips; the fleet's
path that runs without Ray (the description an ingress sends a replica, rebuilt there) is tested in
``tests/openpi/test_wire_state.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _node_harness import write_state_checkpoint
from _openpi_harness import (
    STATE_HIGH,
    STATE_LOW,
    STATE_NAMES,
    served_in_process,
    state_params,
    state_request,
    toy_image,
)

from trajectory_ensemble_node.fleet.protocol import REPLICA_ACTOR
from trajectory_ensemble_node.serving.model_factory import build_model

ray = pytest.importorskip("ray", reason="serve-ray needs the optional extra .[fleet] (Ray)")
serve = pytest.importorskip("ray.serve", reason="serve-ray needs the optional extra .[fleet] (Ray Serve)")
WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]

APP = "fleet_state_test"
IMAGE = toy_image()
STATE = np.array([212.0, 340.1])  # 340.1 has no float32: a lossy cast on the way would change the bits
OTHER = np.array([40.25, 96.0])
SEED = 33
READY = re.compile(r"ready: ws://([^:]+):(\d+)")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_state_checkpoint(tmp_path_factory.mktemp("fleet_state") / "pusht_state", STATE_NAMES, STATE_LOW,
                                  STATE_HIGH)


@pytest.fixture(scope="module")
def fleet_port(checkpoint) -> Iterator[int]:
    from trajectory_ensemble_node.fleet.app import application

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=80 * 1024 * 1024, log_to_driver=False)
    try:
        serve.start(proxy_location="Disabled")
        raw = {"model": str(checkpoint), "num_inference_steps": 2, "candidate_count": 2}
        ingress = serve.run(application(raw, replicas=1, port=0), name=APP, route_prefix=None)
        match = READY.search(ingress.ready_line.remote().result())
        assert match, "no ready line"
        yield int(match.group(2))
    finally:
        serve.shutdown()
        ray.shutdown()


def test_serve_ray_carries_the_state_bitwise_and_refuses_a_request_without_it(fleet_port, checkpoint):
    params = state_params(checkpoint)
    model = build_model(params)
    model.start()
    try:
        here, other_here = (served_in_process(model, params, s, SEED, IMAGE) for s in (STATE, OTHER))
    finally:
        model.stop()
    client = WebsocketClientPolicy(host="127.0.0.1", port=fleet_port)
    assert client.get_server_metadata()["state"]["names"] == list(STATE_NAMES)
    there = client.infer(state_request(STATE, SEED, IMAGE))
    assert there["metrics"][REPLICA_ACTOR].startswith(f"SERVE_REPLICA::{APP}#")
    for reply, result in ((there, here), (client.infer(state_request(OTHER, SEED, IMAGE)), other_here)):
        assert np.array_equal(reply["actions"], result.action.numpy().astype(np.float32))
        assert np.array_equal(reply["candidates"], result.candidates.numpy().astype(np.float32))
    assert not np.array_equal(here.action, other_here.action)
    with pytest.raises(RuntimeError) as refused:  # openpi-client raises a text frame as an error
        client.infer(state_request(None, SEED, IMAGE))
    assert '"code": 25' in str(refused.value) and "observation/state" in str(refused.value)
