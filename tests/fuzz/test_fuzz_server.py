"""Fuzz the OpenPI server end to end: one in-process server with the toy policy, one real websocket connection,
generated hostile frames.

Each frame is answered on the same connection, either with an error frame (a text frame ``parse_error_frame`` reads,
with a named code: never the anonymous ``InternalError`` that an unnamed exception becomes) or with a reply whose
``actions`` have the metadata's ``action_shape``; after the whole run the connection, and a fresh openpi-client, are
served a normal request. Frames: random bytes, text frames, and requests with generated observation keys and extras
(wrong types, huge and negative numbers, unknown reducers, NaN deadlines, over-long session ids, megabytes of text
or bytes in an extra or a key, ...); every error frame is a few KiB at most. Valid requests run the model, so this
target keeps its example count low in ``ci``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgpack
import numpy as np
import pytest
from _fuzz import MAX_REFUSAL_BYTES, TIMEOUT_S, check_named, fuzz_settings, large_bytes, large_text, record
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trajectory_ensemble_node.errors import ErrorCode, TrajectoryEnsembleError
from trajectory_ensemble_node.openpi import OpenPIPolicy, OpenPIServer, ServerLimits, ServerThread
from trajectory_ensemble_node.wire import codec
from trajectory_ensemble_node.wire.codec import parse_error_frame
from trajectory_ensemble_node.serving.params import validate
from trajectory_ensemble_node.toy import heldout_scenes, render

websockets_sync = pytest.importorskip("websockets.sync.client")
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(TIMEOUT_S),
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]

IMAGE = render(heldout_scenes(1, seed=3)[0])
GOOD = {"observation/image": IMAGE, "num_candidates": 1, "seed": 5}
REPLY_TIMEOUT_S = 300.0  # a generous bound on one reply on a loaded machine; a hang fails here


class Served:
    """The server, its connection and the metadata read on it."""

    def __init__(self, thread: ServerThread, ws: Any, metadata: dict[str, Any]) -> None:
        self.thread, self.ws, self.metadata = thread, ws, metadata


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    policy = OpenPIPolicy.from_params(validate({}))
    policy.start()
    thread = ServerThread(OpenPIServer(policy, ServerLimits(), port=0)).start()
    ws = websockets_sync.connect(thread.url, compression=None, max_size=None)
    try:
        yield Served(thread, ws, msgpack_numpy.unpackb(ws.recv()))
    finally:
        ws.close()
        thread.stop()
        policy.stop()


# --- frames ----------------------------------------------------------------------------------------------------------

big_ints = st.sampled_from([-(2**63), 2**63 - 1, 2**64 - 1, -1, 0, 2**31, 10**18])
numbers = st.one_of(st.integers(-3, 40), big_ints, st.floats(allow_nan=True, allow_infinity=True))
junk = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=10), st.binary(max_size=8),
                 st.lists(st.integers(-2, 2), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                           max_size=2))
images = st.one_of(
    st.just(IMAGE), st.just(IMAGE),
    hnp.arrays(np.uint8, st.tuples(st.integers(0, 40), st.integers(0, 40), st.sampled_from([3, 3, 1, 4]))),
    hnp.arrays(st.sampled_from([np.float32, np.int64, np.bool_, np.uint16]), hnp.array_shapes(max_dims=4, max_side=5)),
    st.sampled_from([(1, 300), (300, 1), (15, 16), (16, 16)]).map(lambda s: np.zeros((*s, 3), np.uint8)),
    junk,
)
EXTRAS: dict[str, st.SearchStrategy] = {
    "num_candidates": st.one_of(st.integers(1, 2), st.integers(1, 2), numbers, junk),
    "seed": st.one_of(st.integers(0, 2**31), big_ints, junk),
    "reducer": st.one_of(st.sampled_from(["mean", "medoid", "mode", "first", "none", "", "nope", "pose_gripper"]),
                         junk),
    "return_candidates": st.one_of(st.booleans(), junk),
    "deadline_ms": st.one_of(st.floats(0, 10_000), numbers, junk),
    "session_id": st.one_of(st.text(max_size=8), st.just("s" * 300), junk),
    "continue_previous": st.one_of(st.booleans(), junk),
    "inference_delay": st.one_of(st.integers(-2, 10), big_ints, junk),
    "stamp": st.one_of(st.floats(allow_nan=True, allow_infinity=True), junk),
    "endpoint": st.one_of(st.sampled_from(["infer", "reset", "metadata", ""]), junk),
    "prompt": st.one_of(st.text(max_size=40), st.just("x" * 20_000), junk),
    "guidance": st.one_of(st.sampled_from(["", "prefix", "nope"]), junk),
}
LARGE = ("reducer", "endpoint", "session_id", "session_scope", "guidance", "prompt", "seed")
"""Extras that sometimes carry megabytes (text or bytes): the refusal quotes them, briefly (issue 61)."""


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    # Half start from a request the toy policy serves (one candidate) and change a key or two, so the checks
    # deep in the request path run; the rest are built from anything.
    request: dict[str, Any] = {"observation/image": IMAGE, "num_candidates": 1} if draw(st.booleans()) else {}
    if not request and draw(st.integers(0, 5)):
        request["observation/image"] = draw(images)
    for key in draw(st.lists(st.sampled_from(sorted(EXTRAS)), max_size=3, unique=True)):
        request[key] = draw(EXTRAS[key])
    if not draw(st.integers(0, 4)):
        request[draw(st.sampled_from(LARGE))] = draw(st.one_of(large_text, large_bytes))
    if not draw(st.integers(0, 9)):
        request[draw(large_text)] = 1  # an unknown key of megabytes
    for key in draw(st.lists(st.text(max_size=10), max_size=1)) if not draw(st.integers(0, 3)) else ():
        request.setdefault(key, draw(junk))
    try:
        return codec.pack(request)
    except (TypeError, ValueError, OverflowError):
        return msgpack.packb({"observation/image": 7})  # a value msgpack cannot carry: send something else wrong


frames = st.one_of(requests(), requests(), requests(), st.binary(max_size=64), st.text(max_size=32),
                   st.binary(max_size=32).map(lambda b: b"\x81\xb1observation/image" + b))


# --- the targets -----------------------------------------------------------------------------------------------------


def _answer(served: Served, frame: bytes | str) -> None:
    served.ws.send(frame)
    reply = served.ws.recv(timeout=REPLY_TIMEOUT_S)
    if isinstance(reply, str):
        assert len(reply.encode()) <= MAX_REFUSAL_BYTES, f"a {len(reply.encode())}-byte error frame"
        payload = parse_error_frame(reply)
        code = ErrorCode(payload["code"])
        assert payload["error"] == code.name and payload["type"] != "InternalError", \
            f"an unnamed exception reached the client: {payload}"
        assert "Traceback" not in payload["message"]
        event(f"error frame: {code.name}")
        return
    answer = msgpack_numpy.unpackb(reply)
    if answer.get("reset"):
        event("reset")
        return
    assert np.asarray(answer["actions"]).shape == tuple(served.metadata["action_shape"]), answer.keys()
    event("served")


@fuzz_settings("server")
@given(frames)
def test_every_hostile_frame_gets_a_named_error_frame_or_a_reply_of_the_action_shape(served: Served,
                                                                                     frame: bytes | str) -> None:
    record("server")
    _answer(served, frame)


def test_after_the_hostile_frames_the_same_connection_and_a_fresh_client_are_served(served: Served) -> None:
    served.ws.send(msgpack_numpy.packb(GOOD))
    reply = msgpack_numpy.unpackb(served.ws.recv(timeout=REPLY_TIMEOUT_S))
    assert reply["actions"].shape == tuple(served.metadata["action_shape"])
    client = WebsocketClientPolicy(host="127.0.0.1", port=served.thread.port)
    assert client.infer(GOOD)["actions"].shape == tuple(served.metadata["action_shape"])
    stats = served.thread.server.stats()["server"]
    assert stats["replies"] >= 2


def test_the_error_frame_of_any_named_error_reads_back_with_its_code() -> None:
    """The server's side of the check above: every code's error frame parses, with its name."""
    for code in ErrorCode:
        error = type("Named", (TrajectoryEnsembleError,), {"code": code})("message")
        assert check_named(error) == code
        payload = parse_error_frame(codec.error_frame(error))
        assert (payload["error"], payload["code"]) == (code.name, int(code))
