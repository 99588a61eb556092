"""The pieces of the remote engine that need no server: the ``context`` extra, error frames read back, the
handshake checks, and how a server's handshake says it draws (whole groups or one sample per request)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trajectory_ensemble_node.errors import (
    DelayTooLongError,
    ErrorCode,
    ExecutionContextError,
    GoalRequestError,
    GroupCanceledError,
    InstructionTooLongError,
    RemoteRefusalError,
    RemoteSchemaError,
)
from trajectory_ensemble_node.wire import codec
from trajectory_ensemble_node.openpi.extras import parse_extras
from trajectory_ensemble_node.remote.client import check_metadata, error_from_frame, samples_per_request
from trajectory_ensemble_node.serving.params import validate

PREVIOUS = np.linspace(-1, 1, 16, dtype=np.float32).reshape(8, 2)


def context(**changes) -> dict:
    return {"previous": PREVIOUS, "previous_stamp": 10.0, "stamp": 10.25, "dt": 0.125, "frozen": 1, **changes}


def test_the_context_extra_becomes_the_execution_context_it_describes():
    got = parse_extras({"context": context(guidance="mask")}).context
    assert torch.equal(got.previous, torch.from_numpy(PREVIOUS))
    assert (got.previous_stamp, got.stamp, got.dt, got.frozen, got.guidance) == (10.0, 10.25, 0.125, 1, "mask")
    assert got.shift == 2
    # What the node sends (its fields, remote.groups.request_frame) is what the server reads back, bit for bit.
    again = parse_extras(codec.unpack(codec.pack({"context": got.fields()}))).context
    assert torch.equal(again.previous, got.previous)
    assert (again.previous_stamp, again.stamp, again.dt, again.frozen, again.guidance, again.max_guidance_weight) == (
        got.previous_stamp, got.stamp, got.dt, got.frozen, got.guidance, got.max_guidance_weight)
    assert parse_extras({}).context is None


@pytest.mark.parametrize(("bad", "error", "match"), [
    ({"previous": np.zeros((8,), np.float32)}, ExecutionContextError, "2-D float array"),
    ({"previous": np.zeros((8, 2), np.int32)}, ExecutionContextError, "2-D float array"),
    ({"frozen": 1.5}, ExecutionContextError, "frozen must be an integer"),
    ({"frozen": 7}, DelayTooLongError, "frozen count 7"),
    ({"dt": 0.0}, ExecutionContextError, "dt must be > 0"),
    ({"stamp": 9.0}, ExecutionContextError, "before the previous chunk's stamp"),
    ({"guidance": "magic"}, ExecutionContextError, "guidance must be one of"),
    ({"extra": 1}, ExecutionContextError, r"unknown \['extra'\]"),
])
def test_a_malformed_context_is_refused_by_name(bad, error, match):
    with pytest.raises(error, match=match):
        parse_extras({"context": context(**bad)})


def test_a_context_is_no_map_or_combined_with_continue_previous_is_refused():
    with pytest.raises(ExecutionContextError, match="context must be a map"):
        parse_extras({"context": [1, 2]})
    with pytest.raises(GoalRequestError, match="cannot be combined"):
        parse_extras({"context": context(), "continue_previous": True})


def test_error_frames_come_back_as_the_class_and_code_the_server_sent():
    canceled = error_from_frame(codec.error_frame(GroupCanceledError("g-1", "client went away")), "g-1")
    assert type(canceled) is GroupCanceledError and canceled.request_id == "g-1"
    long = error_from_frame(codec.error_frame(InstructionTooLongError("too long")), "g-2")
    assert type(long) is InstructionTooLongError and str(long) == "too long"
    unknown = error_from_frame('{"error": "X", "code": 17, "type": "SomeOtherError", "message": "m"}', "g-3")
    assert type(unknown) is RemoteRefusalError and unknown.code == ErrorCode.UNAUTHORIZED
    assert error_from_frame("not json at all", "g-4").code == ErrorCode.ENGINE_FAILURE


def test_the_handshake_must_fit_the_nodes_parameters():
    params = validate({"engine": "openpi", "engine_url": "ws://127.0.0.1:1"})
    fits = {"embodiment": "pusht", "action_shape": [8, 2], "dt": 0.125,
            "extras": {"keys": ["seed", "num_candidates", "reducer", "return_candidates"]}}
    check_metadata(fits, params, batched=True)
    check_metadata({}, params, batched=True)  # a field not sent is not checked (vLLM-Omni sends fewer)
    with pytest.raises(RemoteSchemaError, match=r"dt is 0.1 there but 0.125 here"):
        check_metadata({**fits, "dt": 0.1}, params, batched=True)
    with pytest.raises(RemoteSchemaError, match=r"embodiment is 'droid_lerobot' there but 'pusht' here"):
        check_metadata({**fits, "embodiment": "droid_lerobot"}, params, batched=True)
    with pytest.raises(RemoteSchemaError, match=r"extras.keys is \['seed'\] there"):
        check_metadata({**fits, "extras": {"keys": ["seed"]}}, params, batched=True)
    check_metadata({**fits, "extras": {"keys": ["seed"]}}, params, batched=False)


def test_a_server_without_a_count_extra_or_advertising_one_draws_one_sample_per_request():
    assert samples_per_request({"policy_server_config": {"action_space": "pusht"}}) == 1  # vLLM-Omni
    whole = {"extras": {"num_candidates": {"default": 8, "max": 32}}}
    assert samples_per_request(whole) == 32
    assert samples_per_request({**whole, "policy_server_config": {"samples_per_request": 1}}) == 1
