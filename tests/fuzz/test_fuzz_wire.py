"""Fuzz the OpenPI wire decoder (``wire/codec.py:unpack``) with generated hostile frames.

Random bytes, valid msgpack of arbitrary nested structure, deep nesting, containers whose headers declare more
elements than the frame holds, and openpi-client's ``__ndarray__`` / ``__npgeneric__`` marker maps with wrong
dtypes, shapes and data lengths (huge declared shapes included), and megabytes of text or bytes where a refusal
quotes them. Each frame must decode to a dict with string keys (every array in it of an accepted dtype and exactly
its declared shape) or be refused with a named error whose error frame is a few KiB; nothing else may escape.
Written against the public contract of ``unpack(frame)``, so it holds whatever bounds the decoder
adds.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from _fuzz import TIMEOUT_S, check_named, fuzz_settings, large_bytes, large_text, record
from hypothesis import example, given
from hypothesis import strategies as st

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.wire import codec

pytestmark = pytest.mark.timeout(TIMEOUT_S)  # a hang in the decoder fails here, not at the suite's 600 s

WIRE_CODES = {ErrorCode.INVALID_MESSAGE}

# --- strategies ------------------------------------------------------------------------------------------------------

ints = st.one_of(st.integers(-(2**63), 2**64 - 1), st.sampled_from([0, -1, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=20), st.binary(max_size=20))
keys = st.one_of(st.text(max_size=12), st.binary(max_size=12),
                 st.sampled_from(["__ndarray__", b"__ndarray__", "__npgeneric__", b"__npgeneric__", "dtype",
                                  b"dtype", "shape", b"shape", "data", b"data", "observation/image", "prompt"]))
trees = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                      st.dictionaries(keys, inner, max_size=5)), max_leaves=25)

DTYPES = ["<f4", "<f8", "<f2", "|u1", "|i1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8", "|b1", ">f4", ">i8", "=f4",
          "float32", "uint8", "bool", "O", "|O", "V8", "|V4", "<U4", "|S3", "<c8", "<c16", "<M8[ns]", "<m8", "f16",
          "", "bogus", "<f4,<f4", "[('a', '<f4')]", "(2,)f4", "i4, i4"]
dtype_values = st.one_of(st.sampled_from(DTYPES), st.sampled_from(DTYPES).map(str.encode), st.none(), ints,
                         st.lists(st.text(max_size=3), max_size=2))
dims = st.one_of(st.integers(0, 4), st.sampled_from([-1, 2**31, 2**32, 2**62, 2**63, 2**64 - 1]))
shape_values = st.one_of(st.lists(dims, max_size=5), st.lists(st.just(1), min_size=60, max_size=80),
                         st.just([0, 2**63]), st.just([0, 2**64 - 1]), st.just([2**32, 2**32, 0]),
                         st.lists(st.one_of(st.booleans(), st.floats(), st.text(max_size=2)), max_size=3),
                         st.none(), ints, st.text(max_size=5))


@st.composite
def array_maps(draw: st.DrawFn) -> dict[Any, Any]:
    """An ``__ndarray__`` or ``__npgeneric__`` map, usually slightly wrong, sometimes exactly right."""
    text_keys = draw(st.booleans())

    def key(name: str) -> Any:
        return name if text_keys else name.encode()

    if draw(st.booleans()):
        dtype, shape = draw(dtype_values), draw(shape_values)
        try:
            size = math.prod(shape) * np.dtype(dtype.decode() if isinstance(dtype, bytes) else dtype).itemsize
        except (TypeError, ValueError, OverflowError):  # a nonsense dtype or shape: any data will do
            size = None
        if isinstance(size, int) and 0 <= size <= 4096 and draw(st.booleans()):
            data = draw(st.binary(min_size=size, max_size=size))  # exactly right: must decode
        else:
            data = draw(st.one_of(st.binary(max_size=64), st.text(max_size=8), ints, st.none(), st.lists(ints,
                                                                                                        max_size=3)))
        out = {key("__ndarray__"): draw(st.one_of(st.just(True), scalars)), key("dtype"): dtype, key("shape"): shape,
               key("data"): data}
    else:
        out = {key("__npgeneric__"): True, key("dtype"): draw(dtype_values), key("data"): draw(scalars)}
    # Drop a field now and then, or add one.
    if draw(st.booleans()):
        out.pop(draw(st.sampled_from(sorted(out, key=str))), None)
    return out


def nested_requests(arrays: st.SearchStrategy) -> st.SearchStrategy:
    return st.dictionaries(keys, st.one_of(arrays, trees, st.lists(arrays, max_size=3)), max_size=4)


def _deep(depth: int, opener: bytes) -> bytes:
    return opener * depth + b"\xc0"


hostile_frames = st.one_of(
    st.binary(max_size=512),
    trees.map(msgpack.packb),
    nested_requests(array_maps()).map(msgpack.packb),
    # Deep nesting: arrays of one, maps of one (key "k"), far past any sane depth.
    st.integers(1, 20_000).map(lambda n: _deep(n, b"\x91")),
    st.integers(1, 20_000).map(lambda n: b"\x81\xa1k" * n + b"\xc0"),
    # Headers that declare huge containers (array32, map32, bin32, str32) and hold almost nothing.
    st.tuples(st.sampled_from([b"\xdd", b"\xdf", b"\xc6", b"\xdb"]), st.integers(0, 2**32 - 1),
              st.binary(max_size=16)).map(lambda t: t[0] + struct.pack(">I", t[1]) + t[2]),
    st.tuples(trees.map(msgpack.packb), st.binary(min_size=1, max_size=8)).map(lambda t: t[0] + t[1]),  # trailing
    trees.map(msgpack.packb).map(lambda b: b[: max(0, len(b) - 1)]),  # truncated
    st.text(max_size=40),  # a text frame
    # Large values where a refusal quotes them (issue 61): a dtype, a shape, a key, data of the wrong type, a text
    # frame. Each refusal's error frame must stay a few KiB (check_named).
    st.one_of(large_text, large_bytes).map(lambda v: msgpack.packb(
        {"x": {b"__ndarray__": True, b"dtype": v, b"shape": [1], b"data": b"\x00"}})),
    large_text.map(lambda v: msgpack.packb({"x": {b"__ndarray__": True, b"dtype": "|u1", b"shape": v,
                                                  b"data": b""}})),
    large_bytes.map(lambda v: msgpack.packb({v: 1})),
    large_text.map(lambda v: msgpack.packb({"x": {b"__npgeneric__": True, b"dtype": "<f4", b"data": v}})),
    large_text.map(lambda v: msgpack.packb([v])),
    large_text,
)


def _check_decoded(value: Any) -> None:
    # Every array a decoded request holds has an accepted dtype; numpy scalars too.
    if isinstance(value, np.ndarray):
        assert value.dtype.kind in "biuf" and not value.dtype.hasobject, value.dtype
    elif isinstance(value, dict):
        for item in value.values():
            _check_decoded(item)
    elif isinstance(value, list):
        for item in value:
            _check_decoded(item)


def _unpack_outcome(frame: bytes | str) -> dict[str, Any] | None:
    try:
        obj = codec.unpack(frame)
    except Exception as error:  # noqa: BLE001 - the property: only named errors
        check_named(error, WIRE_CODES)
        return None
    assert isinstance(obj, dict) and all(isinstance(k, str) for k in obj), obj
    _check_decoded(obj)
    return obj


# --- the targets -----------------------------------------------------------------------------------------------------


@fuzz_settings("wire")
@given(hostile_frames)
@example(b"\x91" * 100_000 + b"\xc0")
@example(b"\xdd\xff\xff\xff\xff")
@example(msgpack.packb({"x": {b"__ndarray__": True, b"dtype": "|u1", b"shape": [0, 2**63], b"data": b""}}))
@example(msgpack.packb({"x": {b"__ndarray__": True, b"dtype": "|u1", b"shape": [1] * 100, b"data": b"\x00"}}))
@example(msgpack.packb({"x": {b"__npgeneric__": True, b"dtype": "|i1", b"data": 2**64 - 1}}))
@example(msgpack.packb({"x": {b"__npgeneric__": True, b"dtype": "<i8", b"data": float("nan")}}))
def test_any_frame_decodes_to_a_request_or_is_refused_with_a_named_error(frame: bytes | str) -> None:
    record("wire")
    _unpack_outcome(frame)


@fuzz_settings("wire_arrays")
@given(st.data())
def test_a_well_formed_array_of_any_accepted_dtype_and_shape_decodes_exactly(data: st.DataObject) -> None:
    """The accepting side of the property: what openpi-client's encoding sends comes back equal, dtype and shape."""
    record("wire_arrays")
    dtype = np.dtype(data.draw(st.sampled_from(["<f4", "<f8", "<f2", "|u1", "|i1", "<i2", "<u4", "<i8", "|b1",
                                                ">f4", ">i8"])))
    shape = data.draw(st.lists(st.integers(0, 6), max_size=4))
    raw = data.draw(st.binary(min_size=math.prod(shape) * dtype.itemsize, max_size=math.prod(shape) * dtype.itemsize))
    sent = np.frombuffer(raw, dtype=dtype).reshape(shape)
    text = data.draw(st.booleans())
    marker = {("__ndarray__" if text else b"__ndarray__"): True, ("data" if text else b"data"): raw,
              ("dtype" if text else b"dtype"): dtype.str, ("shape" if text else b"shape"): shape}
    obj = _unpack_outcome(msgpack.packb({"observation/image": marker, "seed": 3}))
    assert obj is not None, "a well-formed array was refused"
    got = obj["observation/image"]
    assert got.dtype == dtype and got.shape == tuple(shape) and got.tobytes() == sent.tobytes()
