"""The robot's state on the OpenPI wire, and wherever a request travels (issue 58, items 4 and 5).

A tiny Cosmos 3 checkpoint that declares a state input (``agent_x``, ``agent_y`` in env pixels, the PushT contract) is
written into tmp and loaded by its path, as a team's checkpoint is. ``serve-openpi`` then requires
``observation/state`` of that width, says so in its handshake, and feeds it to the model: the same frame, state and
seed give the same bits in process, through the server (openpi-client; the server in this process, and the
``serve-openpi`` command as a process), through the node's remote engine (``engine: openpi``, batched and one sample
per request) and through what ``serve-ray``'s ingress sends a replica (the fleet's description, rebuilt on the
replica's model; Ray itself in ``tests/fleet/test_serve_ray_state.py``). Two states give two answers. A missing,
wrong-width, NaN or ragged state is ``OBSERVATION_SCHEMA`` (25) naming the key, and the connection serves on. A model
without a state input keeps today's schema.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _node_harness import write_state_checkpoint
from _openpi_harness import (
    STATE_HIGH,
    STATE_LOW,
    STATE_NAMES,
    raw_client,
    served_in_process,
    server_process,
    serving,
    state_params,
    state_request,
    toy_image,
)

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.errors import (
    ErrorCode,
    MissingObservationKeyError,
    ObservationArrayError,
    ObservationSchemaError,
    RemoteSchemaError,
    UnknownObservationKeyError,
)
from trajectory_ensemble_node.fleet.protocol import describe, request_from_description
from trajectory_ensemble_node.openpi import OpenPIPolicy
from trajectory_ensemble_node.openpi.extras import EXTRA_KEYS
from trajectory_ensemble_node.openpi.sessions import Caller
from trajectory_ensemble_node.remote import RemoteModel
from trajectory_ensemble_node.remote.client import check_metadata, served_state_names
from trajectory_ensemble_node.serving.input_limits import InputLimits
from trajectory_ensemble_node.serving.params import validate
from trajectory_ensemble_node.serving.request_path import build_request
from trajectory_ensemble_node.wire.codec import parse_error_frame
from trajectory_ensemble_node.wire.schemas import STATE_KEY, get_schema

WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

IMAGE = toy_image()
STATE = np.array([212.0, 340.1])  # 340.1 has no float32: a lossy cast on the way would change the bits
OTHER = np.array([40.25, 96.0])
SEED = 21
LIMITS = InputLimits(2000, 0, 64 * 1024 * 1024, 4096 * 4096, min_image_side=1)
TOY = get_schema("toy")
RGB = np.zeros((6, 8, 3), np.uint8)


# --- the schema's rule, without a model ----------------------------------------------------------------------------


def parse(schema, obs):
    return schema.parse(obs, extras=EXTRA_KEYS, limits=LIMITS)


def test_a_state_taking_model_requires_observation_state_of_its_width_and_gets_its_bits():
    schema = TOY.for_model(STATE_NAMES)
    assert schema.state_names == STATE_NAMES and STATE_KEY in schema.keys()
    assert schema.describe()["state"] == {STATE_KEY: "[2] float, fed to the model: agent_x, agent_y"}
    assert f"{STATE_KEY} ([2] float, fed to the model: agent_x, agent_y, required)" in schema.expected()
    parsed = parse(schema, {"observation/image": RGB, STATE_KEY: STATE})
    assert parsed.model_state == (212.0, 340.1) and all(type(v) is float for v in parsed.model_state)
    # A float32 or integer state reaches the model as its exact value, a list as well.
    assert parse(schema, {"observation/image": RGB, STATE_KEY: STATE.astype(np.float32)}).model_state == tuple(
        float(v) for v in STATE.astype(np.float32))
    assert parse(schema, {"observation/image": RGB, STATE_KEY: [3, 4]}).model_state == (3.0, 4.0)


@pytest.mark.parametrize(("state", "error", "quoted"), [
    (None, MissingObservationKeyError, "missing ['observation/state']: this model takes the robot's state"),
    (np.zeros(3), ObservationArrayError, "observation/state must have shape [2] float"),
    (np.zeros((1, 2)), ObservationArrayError, "got [1, 2]: [[0.0, 0.0]]"),
    (1.5, ObservationArrayError, "got []: 1.5"),
    (np.array([1.0, np.nan]), ObservationArrayError, "observation/state holds NaN or Inf: [1.0, nan]"),
    ([1.0, [2.0, 3.0]], ObservationArrayError, "observation/state is a ragged list"),
    (["1", "2"], ObservationArrayError, "observation/state must be numbers"),
])
def test_a_missing_wrong_width_nan_or_ragged_state_is_25_naming_the_key(state, error, quoted):
    obs = {"observation/image": RGB} if state is None else {"observation/image": RGB, STATE_KEY: state}
    with pytest.raises(error) as caught:
        parse(TOY.for_model(STATE_NAMES), obs)
    assert isinstance(caught.value, ObservationSchemaError) and caught.value.code == ErrorCode.OBSERVATION_SCHEMA
    assert quoted in str(caught.value), str(caught.value)


def test_a_model_without_a_state_input_keeps_todays_schema():
    assert TOY.for_model(()) is TOY and TOY.state_names == ()
    with pytest.raises(UnknownObservationKeyError, match="observation/state"):
        parse(TOY, {"observation/image": RGB, STATE_KEY: STATE})
    droid = get_schema("droid")
    parsed = parse(droid, {"observation/image": RGB, "observation/joint_position": np.zeros(7)})
    assert parsed.model_state is None and parsed.state["observation/joint_position"].shape == (7,)


# --- a served state checkpoint -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_state_checkpoint(tmp_path_factory.mktemp("wire_state") / "pusht_state", STATE_NAMES, STATE_LOW,
                                  STATE_HIGH)


@pytest.fixture(scope="module")
def state_policy(checkpoint) -> Iterator[OpenPIPolicy]:
    policy = OpenPIPolicy.from_params(state_params(checkpoint))
    policy.start()
    yield policy
    policy.stop()


@pytest.fixture(scope="module")
def server(state_policy) -> Iterator[Any]:
    with serving(state_policy) as server:
        yield server


def in_process(policy: OpenPIPolicy, state: Any, seed: int = SEED):
    return served_in_process(policy.model, policy.params, state, seed, IMAGE)


def client(server) -> Any:
    return WebsocketClientPolicy(host="127.0.0.1", port=server.port)


def assert_same_bits(reply: dict[str, Any], result) -> None:
    assert np.array_equal(reply["actions"], result.action.numpy().astype(np.float32))
    assert np.array_equal(reply["candidates"], result.candidates.numpy().astype(np.float32))
    assert reply["seeds"] == list(result.seeds)


def test_the_handshake_states_the_key_width_names_and_range(server):
    meta = client(server).get_server_metadata()
    assert meta["state"] == {"key": "observation/state", "width": 2, "names": ["agent_x", "agent_y"],
                             "range": [[0.0, 0.0], [512.0, 512.0]], "out_of_range": "clipped"}
    assert meta["observation_schema"]["state"] == {STATE_KEY: "[2] float, fed to the model: agent_x, agent_y"}


def test_the_toy_policys_handshake_has_no_state_block(toy_policy):
    meta = toy_policy.metadata()
    assert "state" not in meta and meta["observation_schema"]["state"] == {}


def test_the_same_frame_state_and_seed_give_the_same_bits_in_process_and_through_serve_openpi(state_policy, server):
    here = in_process(state_policy, STATE)
    wire = client(server)
    there = wire.infer(state_request(STATE, SEED, IMAGE))
    assert_same_bits(there, here)
    assert there["metrics"]["state_clipped"] == 0
    # Two states, the same frame and seed: two answers (every candidate differs).
    other = wire.infer(state_request(OTHER, SEED, IMAGE))
    assert other["seeds"] == there["seeds"]
    assert all(not np.array_equal(a, b) for a, b in zip(other["candidates"], there["candidates"]))
    assert_same_bits(other, in_process(state_policy, OTHER))
    # Outside the statistics' range: clipped (docs/state.md), and the reply's metrics count the clipped channels.
    assert wire.infer(state_request([600.0, 20.0], SEED, IMAGE))["metrics"]["state_clipped"] == 1


@pytest.mark.slow
def test_the_serve_openpi_process_serves_the_checkpoints_state_bitwise(state_policy, checkpoint, tmp_path):
    # The command as a user starts it, on the checkpoint's path from a params file.
    overrides = {"model": str(checkpoint), "num_inference_steps": 2, "candidate_count": 2}
    with server_process(tmp_path, overrides) as process:
        wire = WebsocketClientPolicy(host="127.0.0.1", port=process.port)
        assert wire.get_server_metadata()["state"]["names"] == list(STATE_NAMES)
        there = wire.infer(state_request(STATE, SEED, IMAGE))
    assert_same_bits(there, in_process(state_policy, STATE))


def test_a_missing_wrong_width_nan_or_ragged_state_is_refused_with_25_and_the_connection_serves_on(server):
    ws, _ = raw_client(server.url)
    refusals = (
        (None, "missing ['observation/state']"),
        (np.zeros(3), "observation/state must have shape [2]"),
        (np.array([np.nan, 1.0]), "observation/state holds NaN or Inf"),
        ([1.0, [2.0, 3.0]], "observation/state is a ragged list"),
    )
    try:
        for state, quoted in refusals:
            ws.send(msgpack_numpy.packb(state_request(state, SEED, IMAGE)))
            reply = ws.recv()
            assert isinstance(reply, str), "a refusal is a text frame"
            frame = parse_error_frame(reply)
            assert (frame["error"], frame["code"]) == ("OBSERVATION_SCHEMA", 25), frame
            assert quoted in frame["message"], frame["message"]
        ws.send(msgpack_numpy.packb(state_request(STATE, SEED, IMAGE)))
        served = msgpack_numpy.unpackb(ws.recv())
        assert np.asarray(served["actions"]).shape == (8, 2)
    finally:
        ws.close()


@pytest.mark.parametrize("block", [
    {"key": "observation/joint_position", "width": 2, "names": ["agent_x", "agent_y"]},
    {"key": STATE_KEY, "width": 3, "names": ["agent_x", "agent_y"]},
    {"key": STATE_KEY, "width": 1, "names": [7]},
    ["agent_x", "agent_y"],
])
def test_a_node_refuses_a_server_whose_state_block_it_cannot_read(block):
    meta = {"state": block}
    with pytest.raises(RemoteSchemaError, match="state block this node cannot read") as caught:
        check_metadata(meta, validate({}), batched=True)
    assert caught.value.code == ErrorCode.REMOTE_SCHEMA
    assert served_state_names({}) == () and served_state_names({"state": None}) == ()


def remote_model(url: str) -> RemoteModel:
    model = RemoteModel(validate({"engine": "openpi", "engine_url": url, "num_inference_steps": 2,
                                  "candidate_count": 2}))
    model.start()
    return model


def remote_group(model: RemoteModel, state: Any, seed: int = SEED):
    p = model.params
    spec = CandidateTrajectorySpec(count=2, reducer=p.reducer, return_candidates=True, max_count=p.max_candidates)
    request = build_request(model, p, prompt=p.instruction, spec=spec, base_seed=seed, image=IMAGE,
                            request_id=f"remote-{seed}", context=None,
                            state=None if state is None else tuple(float(v) for v in state))
    return model.wait(model.submit_request(request), timeout=120)


@pytest.mark.parametrize("samples_per_request", [0, 1], ids=["batched", "one-sample"])
def test_the_remote_engine_carries_the_state_bitwise(state_policy, samples_per_request):
    policy = OpenPIPolicy(state_policy.model, state_params(Path(state_policy.params.model),
                                                          openpi_samples_per_request=samples_per_request),
                          notice=state_policy.notice)
    with serving(policy) as server:
        model = remote_model(server.url)
        try:
            # The node picks its JointState by these names (the server's handshake), as it would for a local model.
            assert model.capabilities.uses_state and model.capabilities.state_names == STATE_NAMES
            there = remote_group(model, STATE)
            # As a local model with a state input: refused before anything is sent.
            with pytest.raises(MissingObservationKeyError) as missing:
                remote_group(model, None)
        finally:
            model.stop()
        assert server.server.counts["replies"] == (1 if samples_per_request == 0 else 2)
    here = in_process(state_policy, STATE)
    assert there.seeds == here.seeds
    assert torch.equal(there.action, here.action) and torch.equal(there.candidates, here.candidates)
    assert missing.value.code == ErrorCode.OBSERVATION_SCHEMA and "observation/state" in str(missing.value)


def test_the_fleets_description_carries_the_state_to_a_replica_bitwise(state_policy):
    # What serve-ray's ingress sends an engine replica, without Ray: the built job described (pickled, as Ray does),
    # rebuilt on the replica's model by the same builder, run there.
    job = state_policy.prepare(state_request(STATE, SEED, IMAGE), request_id="fleet-1",
                               caller=Caller("connection-1", 1), arrival=time.monotonic())
    state_policy.build(job)
    description = pickle.loads(pickle.dumps(describe(job)))
    assert description["state"] == (212.0, 340.1)
    request = request_from_description(state_policy.model, state_policy.params, description)
    replica = state_policy.model.wait(state_policy.model.submit_request(request), timeout=120)
    here = in_process(state_policy, STATE)
    assert torch.equal(replica.action, here.action) and torch.equal(replica.candidates, here.candidates)
