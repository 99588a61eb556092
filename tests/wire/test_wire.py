"""The OpenPI wire codec against openpi-client's own msgpack_numpy, both ways, and what an untrusted peer is refused."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest

from trajectory_ensemble_node.errors import (
    ErrorCode,
    InvalidMessageError,
    UnknownReducerError,
)
from trajectory_ensemble_node.wire import codec

msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")


def test_what_openpi_client_packs_is_read_back_exactly():
    obs = {
        "observation/image": np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3),
        "observation/joint_position": np.linspace(-1, 1, 7),
        "observation/gripper_position": np.float32(0.25),
        "prompt": "pick up the cup",
        "seed": 2**64 - 1,
        "return_candidates": True,
    }
    decoded = codec.unpack(msgpack_numpy.packb(obs))
    assert decoded.keys() == obs.keys()
    np.testing.assert_array_equal(decoded["observation/image"], obs["observation/image"])
    assert decoded["observation/image"].dtype == np.uint8
    assert decoded["observation/joint_position"].dtype == np.float64
    assert decoded["observation/gripper_position"] == np.float32(0.25)
    assert isinstance(decoded["observation/gripper_position"], np.float32)
    assert decoded["seed"] == 2**64 - 1 and decoded["prompt"] == "pick up the cup" and decoded["return_candidates"]


def test_what_we_pack_openpi_client_unpacks_exactly():
    reply = {"actions": np.random.default_rng(0).standard_normal((8, 2)).astype(np.float32),
             "valid": np.array([True, False]), "base_seed": 7, "metrics": {"total_ms": 1.5, "fallback_reason": None}}
    decoded = msgpack_numpy.unpackb(codec.pack(reply))
    np.testing.assert_array_equal(decoded["actions"], reply["actions"])
    assert decoded["actions"].dtype == np.float32 and decoded["valid"].tolist() == [True, False]
    assert decoded["base_seed"] == 7 and decoded["metrics"] == {"total_ms": 1.5, "fallback_reason": None}


def test_markers_spelled_as_text_keys_are_read_too():
    frame = msgpack.packb({"a": {"__ndarray__": True, "data": b"\x01\x02", "dtype": "|u1", "shape": [2]}})
    np.testing.assert_array_equal(codec.unpack(frame)["a"], np.array([1, 2], np.uint8))


def _array(dtype: str, shape, data: bytes) -> bytes:
    return msgpack.packb({"x": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}})


@pytest.mark.parametrize(("frame", "quoted"), [
    (b"\xc1\xc1 not msgpack", "not msgpack"),
    ("a text frame", "text frame"),
    (msgpack.packb([1, 2, 3]), "got a list"),
    (msgpack.packb({1: 2}), "map key"),
    (msgpack.packb({b"prompt": "x"}), "keys must be strings"),
    (_array("|O", [1], b"\x00" * 8), "'|O'"),
    (_array("<c16", [1], b"\x00" * 16), "'<c16'"),
    (_array("|V4", [1], b"\x00" * 4), "'|V4'"),
    (_array("not-a-dtype", [1], b"\x00"), "'not-a-dtype'"),
    (_array("<f4", [2, 2], b"\x00" * 12), "needs 16 bytes, got 12"),
    (_array("<f4", [-1], b""), "[-1]"),
    (msgpack.packb({"x": {b"__npgeneric__": True, b"data": "text", b"dtype": "<f4"}}), "must be a number"),
])
def test_a_malformed_frame_is_a_named_error_quoting_what_was_wrong(frame, quoted):
    with pytest.raises(InvalidMessageError) as caught:
        codec.unpack(frame)
    assert quoted in str(caught.value)
    assert caught.value.code == ErrorCode.INVALID_MESSAGE


def test_an_array_from_the_wire_is_a_copy_free_read_only_view():
    # Nothing downstream may write into the message's buffer.
    decoded = codec.unpack(msgpack_numpy.packb({"x": np.zeros(3, np.float32)}))["x"]
    assert not decoded.flags.writeable


def test_the_error_frame_names_the_code_and_quotes_the_message_but_never_a_traceback():
    frame = json.loads(codec.error_frame(UnknownReducerError("unknown reducer 'nope'")))
    assert frame == {"error": "UNKNOWN_REDUCER", "code": 12, "type": "UnknownReducerError",
                     "message": "unknown reducer 'nope'"}
    try:
        raise KeyError("secret internal detail")
    except KeyError as error:
        internal = codec.parse_error_frame(codec.error_frame(error))
    assert internal["error"] == "ENGINE_FAILURE" and "secret" not in json.dumps(internal)
    assert "Traceback" not in json.dumps(internal)


LIMITS = codec.DecodeLimits.for_request(keys=12, max_message_bytes=16 * 2**20, max_image_bytes=1000)


@pytest.mark.parametrize(("frame", "quoted"), [
    (b"\x81\xa1a\xdd" + (10**6).to_bytes(4, "big") + b"\x80" * 10**6, "1000000 items in one array"),
    (b"\xdf" + (10**6).to_bytes(4, "big") + b"\x80\x80" * 10, "1000000 entries in one map"),
    (b"\x81\xa1a" + b"\x91" * 5000 + b"\xc0", "deeper than msgpack's own limit"),
    (msgpack.packb({"a": [[[[1]]]]}), "5 deep, above the limit of 4"),
    (msgpack.packb({f"k{i}": [[{}] * 60] * 20 for i in range(10)}), "map entries and array items in all"),
    (msgpack.packb({"a": b"\x00" * 1001}), "1001 bytes in one binary, above the limit of 1000"),
    (msgpack.packb({"a": msgpack.ExtType(1, b"x")}), "ext types are not part of the wire"),
])
def test_a_frame_past_a_decoding_bound_is_refused_naming_the_bound(frame, quoted):
    with pytest.raises(InvalidMessageError) as caught:
        codec.unpack(frame, LIMITS)
    assert quoted in str(caught.value) and caught.value.code == ErrorCode.INVALID_MESSAGE


def test_what_a_droid_client_sends_fits_the_bounds_derived_for_its_schema():
    obs = {"observation/exterior_image_1_left": np.zeros((180, 320, 3), np.uint8),
           "observation/exterior_image_2_left": np.zeros((180, 320, 3), np.uint8),
           "observation/wrist_image_left": np.zeros((180, 320, 3), np.uint8),
           "observation/joint_position": [0.1] * 7, "observation/gripper_position": np.zeros(1),
           "prompt": "pick up the cup", "session_id": "ep-1", "seed": 3, "num_candidates": 8}
    limits = codec.DecodeLimits.for_request(keys=18, max_message_bytes=16 * 2**20, max_image_bytes=64 * 2**20)
    decoded = codec.unpack(msgpack_numpy.packb(obs), limits)
    assert decoded.keys() == obs.keys() and decoded["observation/joint_position"] == [0.1] * 7
