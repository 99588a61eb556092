"""The OpenPI server on the toy policy, through the real openpi-client and plain websockets clients.

Bad input in a loop, auth, routes and health, limits, co-batching, queueing and capacity, per-connection order,
disconnects, sessions and a RoboLab-style client. The server runs in this process on its own event loop thread; every
client talks to it over a real socket.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from _openpi_harness import raw_client, serving, toy_image, wait_until

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.openpi import OpenPIPolicy
from trajectory_ensemble_node.wire.codec import parse_error_frame
from trajectory_ensemble_node.wire.schemas import get_schema

websockets_sync = pytest.importorskip("websockets.sync.client")
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy
from websockets.exceptions import ConnectionClosed, InvalidStatus

pytestmark = [
    pytest.mark.slow,
    # websockets >= 14 asks for `with connect(...)`; openpi-client 0.1.2 (and these helpers) keep the connection open.
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]

IMAGE = toy_image()
GOOD = {"observation/image": IMAGE, "num_candidates": 1, "seed": 5}


def connect(url: str, path: str = "/", headers: dict[str, str] | None = None):
    """A plain websockets client (the library openpi-client uses), its metadata already read."""
    return raw_client(url + path, headers)


def error_of(frame) -> dict:
    assert isinstance(frame, str), f"expected an error text frame, got {type(frame).__name__}"
    return parse_error_frame(frame)


# --- acceptance 2: bad input in a loop -------------------------------------------------------------------------------

BAD_REQUESTS = [
    ("not msgpack", b"\xc1\xc1 this is not msgpack", ErrorCode.INVALID_MESSAGE, "not msgpack"),
    ("missing image", {"prompt": "go"}, ErrorCode.OBSERVATION_SCHEMA, "missing ['observation/image']"),
    ("wrong dtype", {"observation/image": IMAGE.astype(np.float32)}, ErrorCode.OBSERVATION_SCHEMA, "dtype float32"),
    ("unknown reducer", {**GOOD, "num_candidates": 2, "reducer": "nope"}, ErrorCode.UNKNOWN_REDUCER, "'nope'"),
    ("count above max", {**GOOD, "num_candidates": 33}, ErrorCode.CANDIDATE_COUNT_ABOVE_MAX, "33"),
    ("2 MB prompt", {**GOOD, "prompt": "x" * 2_000_000}, ErrorCode.INSTRUCTION_TOO_LONG, "2000000 characters"),
    ("wrong key", {**GOOD, "num_candidate": 2}, ErrorCode.OBSERVATION_SCHEMA, "['num_candidate']"),
    ("wrong image key", {"observation/imag": IMAGE}, ErrorCode.OBSERVATION_SCHEMA, "observation/image"),
]


def test_every_bad_request_gets_a_named_error_frame_and_the_same_connection_serves_the_next(toy_policy):
    with serving(toy_policy, max_message_bytes=4 * 1024 * 1024) as server:
        ws, _ = connect(server.url)
        client = WebsocketClientPolicy(host="127.0.0.1", port=server.port)
        for _round in range(2):
            for name, request, code, quoted in BAD_REQUESTS:
                ws.send(request if isinstance(request, bytes) else msgpack_numpy.packb(request))
                frame = error_of(ws.recv())
                assert (frame["error"], frame["code"]) == (code.name, int(code)), (name, frame)
                assert quoted in frame["message"], (name, frame)
                assert "Traceback" not in frame["message"]
                ws.send(msgpack_numpy.packb(GOOD))
                reply = msgpack_numpy.unpackb(ws.recv())
                assert reply["actions"].shape == (8, 2), name
                if not isinstance(request, bytes):
                    # The real client raises the text frame, then serves the next request on the same socket.
                    with pytest.raises(RuntimeError, match=code.name):
                        client.infer(request)
                    assert client.infer(GOOD)["actions"].shape == (8, 2)
        ws.close()
        # A message over the limit closes its connection with a reason that says so; the server goes on.
        big, _ = connect(server.url)
        big.send(msgpack_numpy.packb({"observation/image": np.zeros((1400, 1400, 3), np.uint8)}))
        with pytest.raises(ConnectionClosed) as closed:
            big.recv(timeout=60)
        assert closed.value.rcvd.code == 1009 and "exceeds limit of 4194304 bytes" in closed.value.rcvd.reason
        fresh = WebsocketClientPolicy(host="127.0.0.1", port=server.port)
        assert fresh.infer(GOOD)["actions"].shape == (8, 2)
        counts = server.server.stats()["server"]
        assert counts["error_frames"] == 2 * (2 * len(BAD_REQUESTS) - 1)


# --- acceptance 3: auth ----------------------------------------------------------------------------------------------


def test_both_header_schemes_with_the_key_are_served_and_anything_else_is_refused_before_any_work(toy_policy):
    with serving(toy_policy, api_key="s3cret-key") as server:
        before = toy_policy.model.outcome_counts()
        for headers in (None, {"Authorization": "Api-Key wrong"}, {"Authorization": "Bearer wrong"},
                        {"Authorization": "s3cret-key"}, {"Authorization": "Basic s3cret-key"}):
            with pytest.raises(InvalidStatus) as refused:
                connect(server.url, headers=headers)
            assert refused.value.response.status_code == 401
            assert b"UNAUTHORIZED (17)" in refused.value.response.body
        with pytest.raises(InvalidStatus):
            WebsocketClientPolicy(host="127.0.0.1", port=server.port, api_key="wrong")
        counts = server.server.stats()["server"]
        assert counts["refused_unauthorized"] == 6
        assert counts.get("connections", 0) == 0 and counts.get("requests", 0) == 0  # no metadata, no decode
        assert toy_policy.model.outcome_counts() == before  # no group

        openpi = WebsocketClientPolicy(host="127.0.0.1", port=server.port, api_key="s3cret-key")  # Api-Key
        assert openpi.infer(GOOD)["actions"].shape == (8, 2)
        bearer, metadata = connect(server.url, "/v1/realtime/robot/openpi", {"Authorization": "Bearer s3cret-key"})
        bearer.send(msgpack_numpy.packb(GOOD))
        assert msgpack_numpy.unpackb(bearer.recv())["action"].shape == (8, 2)
        assert metadata["action_shape"] == [8, 2]
        # Health needs no key, on both paths; the counts do.
        for path in ("/healthz", "/health"):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=30) as response:
                assert response.status == 200 and response.read() == b"OK\n"
        stats_url = f"http://127.0.0.1:{server.port}/stats"
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(stats_url, timeout=30)
        assert no_key.value.code == 401
        request = urllib.request.Request(stats_url, headers={"Authorization": "Bearer s3cret-key"})
        with urllib.request.urlopen(request, timeout=30) as response:
            stats = json.loads(response.read())
        assert stats["server"]["replies"] == 2 and stats["groups"]["succeeded"] >= 2


def test_metadata_and_reply_carry_what_the_issue_fixes(toy_policy):
    with serving(toy_policy) as server:
        client = WebsocketClientPolicy(host="127.0.0.1", port=server.port)
        metadata = client.get_server_metadata()
        assert metadata["model"] == "toy" and metadata["action_shape"] == [8, 2] and metadata["dt"] == 0.125
        assert metadata["embodiment"] == "pusht" and metadata["observation_schema"]["name"] == "toy"
        assert metadata["extras"]["num_candidates"] == {"default": 8, "max": 32}
        first = client.infer({"observation/image": IMAGE, "seed": 9, "num_candidates": 3, "return_candidates": True})
        second = client.infer({"observation/image": IMAGE})
        assert first["actions"].dtype == np.float32 and np.array_equal(first["actions"], first["action"])
        assert first["candidates"].shape == (3, 8, 2) and first["valid"].tolist() == [True] * 3
        assert first["base_seed"] == 9 and first["seeds"][0] == 9 and len(first["seeds"]) == 3
        assert first["steps_used"] == 10 and first["uncertain"] is None  # no calibrated threshold configured
        assert first["metrics"]["candidate_count"] == 3 and "uncertainty_score" in first["metrics"]
        assert set(first["server_timing"]) == {"infer_ms"} and set(second["server_timing"]) == {"infer_ms",
                                                                                                "prev_total_ms"}
        assert "candidates" not in second and second["metrics"]["candidate_count"] == 8
        with pytest.raises(InvalidStatus) as missing:
            connect(server.url, "/elsewhere")
        assert missing.value.response.status_code == 404


# --- co-batching, queue, capacity, order, disconnects ---------------------------------------------------------------


def test_requests_from_different_connections_share_engine_batches(toy_policy, paced):
    paced(0.05)
    with serving(toy_policy, max_concurrent=4) as server:
        clients = [WebsocketClientPolicy(host="127.0.0.1", port=server.port) for _ in range(4)]
        barrier, replies = threading.Barrier(4), [None] * 4

        def run(i: int) -> None:
            barrier.wait()
            replies[i] = clients[i].infer({**GOOD, "seed": 100 + i})

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        shared = [r["metrics"]["co_batched_groups_max"] for r in replies]
        assert all(n >= 2 for n in shared), shared
        assert [r["base_seed"] for r in replies] == [100, 101, 102, 103]


def test_beyond_the_concurrency_requests_queue_and_past_the_queue_get_a_capacity_error(toy_policy, paced):
    paced(0.1)
    with serving(toy_policy, max_concurrent=1, max_queued=1) as server:
        gate = server.server.dispatcher.gate
        running, _ = connect(server.url)
        queued, _ = connect(server.url)
        refused, _ = connect(server.url)
        running.send(msgpack_numpy.packb({**GOOD, "seed": 1}))
        wait_until(lambda: gate.active == 1, what="the first request in the engine")
        queued.send(msgpack_numpy.packb({**GOOD, "seed": 2}))
        wait_until(lambda: gate.waiting == 1, what="the second request waiting")
        refused.send(msgpack_numpy.packb({**GOOD, "seed": 3}))
        frame = error_of(refused.recv(timeout=60))
        assert frame["error"] == "CAPACITY" and "openpi_max_queued=1" in frame["message"]
        assert msgpack_numpy.unpackb(running.recv(timeout=120))["base_seed"] == 1
        assert msgpack_numpy.unpackb(queued.recv(timeout=120))["base_seed"] == 2


def test_a_connections_replies_keep_its_request_order(toy_policy):
    with serving(toy_policy) as server:
        ws, _ = connect(server.url)
        for request in ({**GOOD, "seed": 11}, {"prompt": "no image"}, {**GOOD, "seed": 13}, {**GOOD, "seed": 12}):
            ws.send(msgpack_numpy.packb(request))  # all sent before any reply is read
        first, second, third, fourth = (ws.recv(timeout=120) for _ in range(4))
        assert msgpack_numpy.unpackb(first)["base_seed"] == 11
        assert error_of(second)["error"] == "OBSERVATION_SCHEMA"
        assert [msgpack_numpy.unpackb(f)["base_seed"] for f in (third, fourth)] == [13, 12]


def test_a_client_that_disconnects_mid_request_has_its_group_canceled(toy_policy, paced):
    paced(0.1)
    with serving(toy_policy) as server:
        canceled = toy_policy.model.outcome_counts().get("canceled", 0)
        ws, _ = connect(server.url)
        ws.send(msgpack_numpy.packb({**GOOD, "num_candidates": 2}))
        wait_until(lambda: toy_policy.model.num_running == 1, what="the group denoising")
        ws.close()
        wait_until(lambda: toy_policy.model.outcome_counts().get("canceled", 0) == canceled + 1,
                   what="the engine ending the group canceled")
        assert server.server.stats()["server"]["canceled_on_disconnect"] == 1
        wait_until(lambda: server.server.dispatcher.gate.active == 0, what="the slot given back")
        assert WebsocketClientPolicy(host="127.0.0.1", port=server.port).infer(GOOD)["actions"].shape == (8, 2)


def test_idle_connections_close_with_a_reason_and_the_connection_limit_refuses_at_the_handshake(toy_policy):
    # handshake_idle_s: 60 keeps both connections from being reclaimed for the newcomer (test_hostile.py).
    with serving(toy_policy, idle_timeout_s=0.5, max_connections=2, handshake_idle_s=60.0) as server:
        first, _ = connect(server.url)
        _second, _ = connect(server.url)
        with pytest.raises(InvalidStatus) as full:
            connect(server.url)
        assert full.value.response.status_code == 503 and b"CAPACITY (15)" in full.value.response.body
        assert b"openpi_max_connections=2" in full.value.response.body
        with pytest.raises(ConnectionClosed) as idle:
            first.recv(timeout=60)
        assert idle.value.rcvd.code == 1001 and "idle for 0.5 s" in idle.value.rcvd.reason


# --- sessions -------------------------------------------------------------------------------------------------------


def test_continue_previous_continues_the_sessions_last_chunk_and_reset_drops_it(toy_policy):
    with serving(toy_policy) as server:
        client = WebsocketClientPolicy(host="127.0.0.1", port=server.port)
        base = {"observation/image": IMAGE, "num_candidates": 4, "session_id": "episode-1"}
        first = client.infer({**base, "stamp": 10.0, "seed": 1})
        assert first["continuity"] == "not requested"
        # Two actions (dt 0.125 s) later, one frozen: action 0 continues old action 2.
        second = client.infer({**base, "stamp": 10.25, "seed": 2, "continue_previous": True, "inference_delay": 1})
        assert second["continuity"] == "continued" and second["metrics"]["context_frozen"] == 1
        assert second["metrics"]["context_shift"] == 2
        np.testing.assert_allclose(second["actions"][0], first["actions"][2], atol=1e-4)
        other = client.infer({**base, "session_id": "episode-2", "stamp": 10.5, "continue_previous": True})
        assert other["continuity"] == "no previous chunk"
        # From another connection, the name is that connection's own (sessions belong to their connection unless a
        # keyed request shares them: test_hostile.py): nothing to reset there.
        ws, _ = connect(server.url)
        ws.send(msgpack_numpy.packb({"endpoint": "reset", "session_id": "episode-1"}))
        assert msgpack_numpy.unpackb(ws.recv()) == {"reset": True, "session_id": "episode-1", "had_chunk": False}
        # vLLM-Omni's reset on the session's own connection drops its chunk.
        assert client.infer({"endpoint": "reset", "session_id": "episode-1"}) == {
            "reset": True, "session_id": "episode-1", "had_chunk": True}
        after = client.infer({**base, "stamp": 10.5, "continue_previous": True})
        assert after["continuity"] == "no previous chunk"


# --- a client written the way RoboLab's transport works ---------------------------------------------------------------


class RoboLabStyleClient:
    """Bearer auth, vLLM-Omni's path, one composite ``observation/image``, reads ``action`` (or ``actions``)."""

    def __init__(self, url: str, token: str) -> None:
        self.ws = websockets_sync.connect(url + "/v1/realtime/robot/openpi", max_size=None,
                                          additional_headers={"Authorization": f"Bearer {token}"})
        self.metadata = msgpack_numpy.unpackb(self.ws.recv())

    def act(self, composite: np.ndarray, joints: np.ndarray, gripper: float, prompt: str) -> np.ndarray:
        self.ws.send(msgpack_numpy.packb({
            "observation/image": composite, "observation/joint_position": joints,
            "observation/gripper_position": np.array([gripper]), "prompt": prompt, "session_id": "robolab-0"}))
        reply = self.ws.recv()
        if isinstance(reply, str):
            raise RuntimeError(reply)  # noqa: TRY004 - as openpi-client: a text reply is the server's error
        reply = msgpack_numpy.unpackb(reply)
        if isinstance(reply, np.ndarray):
            return reply
        return np.asarray(reply.get("action", reply.get("actions")))


def test_a_robolab_style_client_on_the_droid_schema(toy_policy):
    droid = OpenPIPolicy(toy_policy.model, toy_policy.params, notice=toy_policy.notice, schema=get_schema("droid"))
    with serving(droid, api_key="robolab-token") as server:
        client = RoboLabStyleClient(server.url, "robolab-token")
        assert client.metadata["observation_schema"]["name"] == "droid"
        assert client.metadata["policy_server_config"]["needs_wrist_camera"] is True
        composite = np.random.default_rng(0).integers(0, 256, (540, 640, 3), dtype=np.uint8)
        action = client.act(composite, np.zeros(7), 0.0, "move the blue robot to the green target")
        assert action.shape == (8, 2) and action.dtype == np.float32 and np.isfinite(action).all()
        with pytest.raises(RuntimeError) as bad:
            client.act(composite, np.zeros(6), 0.0, "")
        assert json.loads(str(bad.value))["error"] == "OBSERVATION_SCHEMA"
