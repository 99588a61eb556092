"""``deadline_ms`` edge cases on the wire (issue 45, row 8), against the toy policy behind a real server.

``deadline_ms: 1e-9`` used to round to a 0 s deadline, which means none, and was served with every step; and an
unmeetable deadline was refused only after the request's conditioning had been encoded ahead. Now any positive
deadline is a deadline, and a warm server refuses one it cannot meet with ``DEADLINE_UNMEETABLE`` (82) before the
adapter encodes anything (its ``encode`` calls are counted on the real adapter).
"""

from __future__ import annotations

from typing import Any

import pytest
from _openpi_harness import serving, toy_image

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.wire.codec import parse_error_frame

websockets_sync = pytest.importorskip("websockets.sync.client")
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]

GOOD = {"observation/image": toy_image(), "num_candidates": 1, "seed": 5}


class EncodeCount:
    """Counts the adapter's ``encode`` calls (an instance attribute shadows the method; every call passes through)."""

    def __init__(self, adapter: Any) -> None:
        self.calls = 0
        encode = adapter.encode

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return encode(*args, **kwargs)

        adapter.encode = counted


def test_a_1e_9_ms_deadline_is_refused_with_82_before_any_encode_and_the_connection_serves_on(toy_policy):
    encodes = toy_policy.model.instrument(EncodeCount)
    with serving(toy_policy) as server:
        ws = websockets_sync.connect(server.url, compression=None, max_size=None)
        msgpack_numpy.unpackb(ws.recv())  # the metadata
        ws.send(msgpack_numpy.packb(GOOD))  # warms the engine: its costs are measured
        reply = msgpack_numpy.unpackb(ws.recv(timeout=120))
        assert reply["actions"].shape[0] > 0 and toy_policy.model.engine.costs.minimum_ms() is not None
        before = encodes.calls
        ws.send(msgpack_numpy.packb({**GOOD, "deadline_ms": 1e-9}))
        frame = ws.recv(timeout=120)
        assert isinstance(frame, str), f"served instead of refused: {msgpack_numpy.unpackb(frame)['metrics']}"
        error = parse_error_frame(frame)
        assert error["code"] == ErrorCode.DEADLINE_UNMEETABLE == 82 and error["error"] == "DEADLINE_UNMEETABLE"
        assert "1e-12 s" in error["message"], error
        assert encodes.calls == before  # refused from the measured costs, not after encoding
        ws.send(msgpack_numpy.packb(GOOD))
        assert msgpack_numpy.unpackb(ws.recv(timeout=120))["actions"].shape[0] > 0
        ws.close()
