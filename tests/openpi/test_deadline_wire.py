"""``deadline_ms`` edge cases on the wire (issue 45, row 8), against the toy policy behind a real server.

``deadline_ms: 1e-9`` used to round to a 0 s deadline, which means none, and was served with every step; and an
unmeetable deadline was refused only after the request's conditioning had been encoded ahead. Now any positive
deadline is a deadline, and a warm server refuses one it cannot meet with ``DEADLINE_UNMEETABLE`` (82) before the
adapter encodes anything (its ``encode`` calls are counted on the real adapter). A deadline that passed before the
group could be submitted is refused with the same 82 by the node's rule (``serving.request_path.deadline_left``),
whatever the engine has measured; before, the wire sent it as 1 microsecond left.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from _openpi_harness import serving, toy_image

from trajectory_ensemble_node.errors import DeadlineUnmeetableError, ErrorCode
from trajectory_ensemble_node.openpi.sessions import Caller
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


def test_a_deadline_that_passed_before_submission_is_refused_with_82_and_never_reaches_the_engine(toy_policy):
    caller, ended = Caller.anonymous(1), toy_policy.model.outcome_counts()
    # Passed before the build (its arrival a second ago, half a second to go): refused there, before the encode.
    late = toy_policy.prepare({**GOOD, "deadline_ms": 500.0}, request_id="late", caller=caller,
                              arrival=time.monotonic() - 1.0)
    with pytest.raises(DeadlineUnmeetableError, match=r"request late: its deadline 0\.500 s passed before it could "
                                                      r"start \(1\.\d{3} s after arrival\)") as refused:
        toy_policy.build(late)
    assert refused.value.code == ErrorCode.DEADLINE_UNMEETABLE == 82
    # Passed between the build and the submission (as for a request that waited for a slot): refused at submission.
    waited = toy_policy.prepare({**GOOD, "deadline_ms": 60_000.0}, request_id="waited", caller=caller,
                                arrival=time.monotonic())
    toy_policy.build(waited)
    waited.arrival -= 61.0
    with pytest.raises(DeadlineUnmeetableError, match="request waited: its deadline 60.000 s passed"):
        toy_policy.submit(waited)
    assert waited.handle is None and toy_policy.model.outcome_counts() == ended
