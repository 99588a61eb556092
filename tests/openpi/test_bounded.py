"""Bounded everywhere on the OpenPI wire (issue 61, rows 1 and 2), each attack as it was first seen, then the bound.

- Row 1: a 15 MB bytes ``reducer`` or ``endpoint`` came back as a 75 MB error frame and a 60 MB log line (a 15 MB
  string 1:1). Every refusal now quotes a bounded prefix with the value's type and length
  (:func:`~trajectory_ensemble_node.quoting.quote_value`), so reply and log line stay under a few KiB.
- Row 2: 12 connections each sending 16 valid 11.4 MB frames before reading grew the server from 386 MB to 3.2 GB
  (``openpi_max_queued`` never triggered: each connection has one request in the engine at a time). Now each
  connection's queue is the websockets library's own (``max_queue``) and the bytes read but not yet served are held
  to ``openpi_max_inbound_bytes`` across connections; past it the server stops reading, and every request that was
  read is answered.
"""

from __future__ import annotations

import threading

import msgpack
import numpy as np
import pytest
from _openpi_harness import raw_client, server_process, toy_image

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.openpi import parse_error_frame

psutil = pytest.importorskip("psutil")
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]

IMAGE = toy_image()
BAD_BYTES = 15_000_000
FEW_KIB = 4096
"""What a reply or a log line may take, whatever the request held (the issue: "a few KiB")."""

BAD_VALUES = {
    "reducer bytes": ({"reducer": b"\x00" * BAD_BYTES}, ErrorCode.INVALID_SPEC, "bytes of 15000000, starting"),
    "reducer str": ({"reducer": "m" * BAD_BYTES}, ErrorCode.UNKNOWN_REDUCER, "str of 15000000 characters"),
    "endpoint bytes": ({"endpoint": b"\x00" * BAD_BYTES}, ErrorCode.INVALID_REQUEST, "bytes of 15000000, starting"),
    "endpoint str": ({"endpoint": "r" * BAD_BYTES}, ErrorCode.INVALID_REQUEST, "str of 15000000 characters"),
    "guidance str": ({"guidance": "g" * BAD_BYTES}, ErrorCode.INVALID_CONTEXT, "str of 15000000 characters"),
    "session_id str": ({"session_id": "s" * BAD_BYTES}, ErrorCode.INVALID_REQUEST, "str of 15000000 characters"),
    "unknown key": ({"k" * BAD_BYTES: 1}, ErrorCode.OBSERVATION_SCHEMA, "str of 15000000 characters"),
    "prompt": ({"prompt": "p" * BAD_BYTES}, ErrorCode.INSTRUCTION_TOO_LONG, "str of 15000000 characters"),
}


def test_refusals_of_15_mb_values_are_bounded_in_the_reply_and_the_log(tmp_path):
    with server_process(tmp_path, {}) as server:
        ws, _ = raw_client(f"ws://127.0.0.1:{server.port}")
        ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "num_candidates": 1}))
        assert not isinstance(ws.recv(timeout=120), str)
        for name, (extra, code, words) in BAD_VALUES.items():
            log_before = server.log_path.stat().st_size
            ws.send(msgpack_numpy.packb({"observation/image": IMAGE, **extra}))
            reply = ws.recv(timeout=120)
            assert isinstance(reply, str), name
            frame = parse_error_frame(reply)
            assert frame["code"] == int(code), (name, frame)
            assert words in frame["message"], (name, frame["message"])
            assert len(reply.encode()) < FEW_KIB, f"{name}: a {len(reply.encode())}-byte error frame"
            grown = server.log_path.stat().st_size - log_before
            assert grown < FEW_KIB, f"{name}: the log grew by {grown} bytes"
        # The same connection serves on.
        ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "num_candidates": 1}))
        assert not isinstance(ws.recv(timeout=120), str)
