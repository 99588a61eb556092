"""Hostile clients against the OpenPI server (issue 45, rows 1, 2, 6 and the wire part of 8 and 9), each attack as it
was first seen, then the fix:

- one client takes over another's session by naming it (``connection-1``), resets it, and learns from ``had_chunk``
  whether it had one;
- a 15 MB msgpack bomb (15 M empty maps) froze ``/healthz`` for 13 s and took a gigabyte; a 15 M deep nesting too;
- 64 idle connections holding the key locked every new client out;
- the metadata listed ``pose_gripper`` for a 2-wide action, and a request naming it was refused;
- a connect right after SIGTERM was refused at TCP where the docs promise 503.

Clients are raw ``websockets`` and ``msgpack`` (what an attacker writes) and the real openpi-client (what a user runs).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import msgpack
import numpy as np
import pytest
from _openpi_harness import raw_client, server_process, serving, toy_image, wait_until

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.wire.codec import parse_error_frame

psutil = pytest.importorskip("psutil")
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy
from websockets.exceptions import InvalidStatus
from websockets.protocol import State

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]

IMAGE = toy_image()
FIRST = {"observation/image": IMAGE, "num_candidates": 2, "stamp": 10.0}
CONTINUE = {"observation/image": IMAGE, "num_candidates": 2, "stamp": 10.25, "continue_previous": True,
            "inference_delay": 1, "seed": 3}


def connect(port: int, key: str | None = None, **kwargs):
    """A raw websockets client (its metadata read), as an attacker would write one."""
    return raw_client(f"ws://127.0.0.1:{port}", {"Authorization": f"Bearer {key}"} if key else None, **kwargs)


def ask(ws, request: dict):
    ws.send(msgpack_numpy.packb(request))
    frame = ws.recv(timeout=120)
    return parse_error_frame(frame) if isinstance(frame, str) else msgpack_numpy.unpackb(frame)


# --- row 1: sessions belong to their owner ----------------------------------------------------------------------------


def test_naming_another_connections_session_neither_freezes_its_actions_nor_resets_it(toy_policy):
    with serving(toy_policy) as server:
        a, _ = connect(server.port)
        b, _ = connect(server.port)
        mine = ask(a, {**FIRST, "seed": 1})  # A's own session: the server called it "connection-1" before the fix
        theirs = ask(b, {**FIRST, "seed": 2, "session_id": "connection-1"})
        assert not np.allclose(mine["actions"][2], theirs["actions"][2], atol=1e-3)  # the two chunks differ
        ask(b, {"endpoint": "reset", "session_id": "connection-1"})  # B resets its own "connection-1", not A's
        continued = ask(a, CONTINUE)
        assert continued["continuity"] == "continued"
        # A's frozen action is A's own old action 2, not B's.
        np.testing.assert_allclose(continued["actions"][0], mine["actions"][2], atol=1e-4)
        assert not np.allclose(continued["actions"][0], theirs["actions"][2], atol=1e-3)
        # A third client learns nothing: A's session answers as a name never used.
        c, _ = connect(server.port)
        for name in ("connection-1", "connection-2", "never-used"):
            assert ask(c, {"endpoint": "reset", "session_id": name})["had_chunk"] is False, name


def test_two_keys_with_the_same_session_name_stay_apart(toy_policy):
    with serving(toy_policy, api_key=["key-a", "key-b"]) as server:
        a, _ = connect(server.port, "key-a")
        b, _ = connect(server.port, "key-b")
        shared = {"session_id": "episode-1", "session_scope": "key"}
        mine = ask(a, {**FIRST, **shared, "seed": 1})
        ask(b, {**FIRST, **shared, "seed": 2})
        # B resets "its" episode-1; A's is untouched, and A's continue continues A's chunk.
        assert ask(b, {"endpoint": "reset", **shared}) == {"reset": True, "session_id": "episode-1",
                                                           "had_chunk": True}
        continued = ask(a, {**CONTINUE, **shared})
        assert continued["continuity"] == "continued"
        np.testing.assert_allclose(continued["actions"][0], mine["actions"][2], atol=1e-4)
        # had_chunk reveals nothing across owners: a name only key A used answers as a name never used.
        ask(a, {**FIRST, "session_id": "only-a", "session_scope": "key", "seed": 4})
        never = ask(b, {"endpoint": "reset", "session_id": "never-used", "session_scope": "key"})
        other = ask(b, {"endpoint": "reset", "session_id": "only-a", "session_scope": "key"})
        assert never["had_chunk"] is False and other["had_chunk"] is False
        assert ask(a, {"endpoint": "reset", "session_id": "only-a", "session_scope": "key"})["had_chunk"] is True


def test_a_named_session_is_private_to_its_connection_unless_the_request_shares_it_with_its_key(toy_policy):
    with serving(toy_policy, api_key="fleet-key") as server:
        first, _ = connect(server.port, "fleet-key")
        ask(first, {**FIRST, "session_id": "robot-7", "seed": 1})
        ask(first, {**FIRST, "session_id": "robot-7", "session_scope": "key", "seed": 1})
        first.close()
        # The same key on a new connection (a reconnect): the private session went with its connection; the
        # key-scoped one is resumed.
        second, _ = connect(server.port, "fleet-key")
        private = ask(second, {**CONTINUE, "session_id": "robot-7"})
        resumed = ask(second, {**CONTINUE, "session_id": "robot-7", "session_scope": "key"})
        assert private["continuity"] == "no previous chunk" and resumed["continuity"] == "continued"


def test_a_key_scope_on_a_server_without_a_key_is_refused_by_name(toy_policy):
    with serving(toy_policy) as server:
        ws, _ = connect(server.port)
        frame = ask(ws, {**FIRST, "session_id": "x", "session_scope": "key"})
        assert (frame["error"], frame["code"]) == ("INVALID_REQUEST", int(ErrorCode.INVALID_REQUEST))
        assert "needs a server key" in frame["message"]
        frame = ask(ws, {**FIRST, "session_scope": "everyone"})
        assert frame["code"] == int(ErrorCode.INVALID_REQUEST) and "'everyone'" in frame["message"]


# --- row 2: bounded decoding off the event loop -----------------------------------------------------------------------

BOMB_BYTES = 15_000_000


def _maps_bomb() -> bytes:
    """{"a": [{}, {}, ...]}: 15 M empty maps, one byte each (before the fix: 16 s and 1.1 GB to decode)."""
    return b"\x81\xa1a\xdd" + BOMB_BYTES.to_bytes(4, "big") + b"\x80" * BOMB_BYTES


def _deep_bomb() -> bytes:
    """{"a": [[[[...]]]]} 15 M deep."""
    return b"\x81\xa1a" + b"\x91" * BOMB_BYTES + b"\xc0"


def _wide_bomb() -> bytes:
    """Within every per-container bound, but thousands of containers, then 14 MB of padding to reach 15 MB."""
    nested = {f"k{i}": [[{} for _ in range(60)] for _ in range(60)] for i in range(20)}
    return msgpack.packb({**nested, "prompt": "x" * (BOMB_BYTES - 1_000_000)})


HEALTH_POLLER = """
import sys, time, urllib.request
url = sys.argv[1]
print("ready", flush=True)
while True:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.read() == b"OK\\n"
    print(f"{time.time():.4f} {time.perf_counter() - started:.6f}", flush=True)
    time.sleep(0.005)
"""


class HealthPoller:
    """``GET /healthz`` over and over from a process of its own (so this process's work cannot delay it), and the
    server's RSS from a thread here; keeps every latency and the peak RSS."""

    def __init__(self, port: int, pid: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", HEALTH_POLLER, f"http://127.0.0.1:{port}/healthz"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.latencies: list[tuple[float, float]] = []  # (wall time, seconds)
        self.process, self.peak_rss = psutil.Process(pid), 0
        self.stopped = threading.Event()
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._rss, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            stamp, seconds = line.split()
            self.latencies.append((float(stamp), float(seconds)))

    def _rss(self) -> None:
        while not self.stopped.wait(0.005):
            self.peak_rss = max(self.peak_rss, self.process.memory_info().rss)

    def stop(self) -> None:
        self.stopped.set()
        self.proc.kill()
        self.proc.wait(30)
        for thread in self._threads:
            thread.join(30)


FAVOURED_NICE = -10


def favour(pid: int) -> bool:
    """Run every thread of ``pid`` at ``FAVOURED_NICE``; False where this user may not raise a priority.

    The health bound (100 ms beyond what a normal frame of the bombs' size stalls it) is about the server: with a core
    of its own it answers within it whatever a bomb holds.
    On a host loaded on purpose (both cores busy beside the suite), the server and the poller otherwise wait their turn
    behind the load for longer than that (249 ms seen at load 4, with the bombs refused in 63-327 ms), which measures
    the host. Linux keeps a nice value per thread, so each existing thread is set; later ones inherit it.
    """
    try:
        for thread in psutil.Process(pid).threads():
            os.setpriority(os.PRIO_PROCESS, thread.id, FAVOURED_NICE)
    except (PermissionError, psutil.AccessDenied):
        return False
    return True


def test_msgpack_bombs_are_refused_by_name_while_health_answers_and_memory_stays_flat(tmp_path):
    with server_process(tmp_path, {}) as server:
        ws, _ = connect(server.port)
        assert ask(ws, {"observation/image": IMAGE, "num_candidates": 1})["actions"].shape == (8, 2)
        bombs = {"maps": _maps_bomb(), "deep": _deep_bomb(), "wide": _wide_bomb()}
        poller = HealthPoller(server.port, server.proc.pid)
        favoured = favour(server.proc.pid) and favour(poller.proc.pid)
        wait_until(lambda: len(poller.latencies) >= 20, what="health checks before the bombs")
        quiet = max(seconds for _, seconds in poller.latencies)
        # A normal frame of the bombs' size (a 15 MB prompt, refused by its own limit) warms the allocator and
        # measures what receiving 15 MB costs the server's loop on this host (130-260 ms seen on an idle host), so
        # what is asserted next is what the bombs' content costs beyond their size.
        before = len(poller.latencies)
        sent = time.time()
        assert ask(ws, {"observation/image": IMAGE, "prompt": "x" * BOMB_BYTES})["error"] == "INSTRUCTION_TOO_LONG"
        normal_ms = (time.time() - sent) * 1000
        wait_until(lambda: len(poller.latencies) >= before + 5, what="health checks after the normal frame")
        normal_worst = max(seconds for _, seconds in poller.latencies[before:])
        baseline = psutil.Process(server.proc.pid).memory_info().rss
        poller.peak_rss = 0  # the bombs' peak, not the normal frame's
        after_normal = len(poller.latencies)
        refusals, spans = {}, {}
        for name, bomb in bombs.items():
            before = len(poller.latencies)
            sent = time.time()
            ws.send(bomb)
            refusals[name] = parse_error_frame(ws.recv(timeout=120))
            spans[name] = (sent, time.time())
            wait_until(lambda: len(poller.latencies) >= before + 5, what=f"health checks after the {name} bomb")
        poller.stop()
        for name, frame in refusals.items():
            assert (frame["error"], frame["code"]) == ("INVALID_MESSAGE", 16), (name, frame)
        assert "15000000 items in one array" in refusals["maps"]["message"]
        assert "deeper than" in refusals["deep"]["message"]
        assert "map entries and array items in all" in refusals["wide"]["message"]
        worst = max(seconds for _, seconds in poller.latencies[after_normal:])
        grown = (poller.peak_rss - baseline) / 2**20
        print(f"healthz: {len(poller.latencies)} checks, worst {worst * 1000:.1f} ms (before the bombs "
              f"{quiet * 1000:.1f} ms); bombs answered in "
              f"{ {name: round((end - start) * 1000) for name, (start, end) in spans.items()} } ms (a normal frame of "
              f"that size: {normal_ms:.0f} ms, /healthz worst {normal_worst * 1000:.1f} ms meanwhile); RSS "
              f"{baseline / 2**20:.0f} MiB, peak +{grown:.1f} MiB; server and poller at nice "
              f"{FAVOURED_NICE if favoured else 'unchanged (not permitted)'}")
        assert worst < normal_worst + 0.100, (f"/healthz took {worst * 1000:.0f} ms during the bombs, "
                                              f"{normal_worst * 1000:.0f} ms during a normal frame of their size")
        assert grown < 50, f"the server's RSS grew by {grown:.0f} MiB"
        # The same connection serves on.
        assert ask(ws, {"observation/image": IMAGE, "num_candidates": 1})["actions"].shape == (8, 2)


# --- row 6: connection fairness, and 503 after a signal -------------------------------------------------------------


def test_64_idle_connections_holding_the_key_do_not_stop_a_65th_client(toy_policy):
    with serving(toy_policy, api_key="shared-key") as server:
        idle = [connect(server.port, "shared-key")[0] for _ in range(64)]
        client = WebsocketClientPolicy(host="127.0.0.1", port=server.port, api_key="shared-key")
        assert client.infer({"observation/image": IMAGE, "num_candidates": 1})["actions"].shape == (8, 2)
        cap = server.server.limits.max_connections_per_client
        reclaimed = 64 + 1 - cap  # the idle ones past the client's cap were closed to make room
        wait_until(lambda: sum(ws.protocol.state is State.CLOSED for ws in idle) == reclaimed,
                   what="the reclaimed connections closed")
        wait_until(lambda: server.server.stats()["connections"] == cap, what="their handlers ended")
        counts = server.server.stats()["server"]
        assert counts["closed_reclaimed"] == reclaimed and counts.get("refused_capacity", 0) == 0
        reasons = [(ws.protocol.close_rcvd.code, ws.protocol.close_rcvd.reason) for ws in idle
                   if ws.protocol.state is State.CLOSED]
        assert all(code == 1013 and "openpi_max_connections_per_client=16" in reason for code, reason in reasons)
        for ws in idle:
            ws.close()


def test_one_peer_holding_many_idle_connections_leaves_room_for_another(toy_policy):
    with serving(toy_policy, max_connections=4, max_connections_per_client=2) as server:
        hoarder = [connect(server.port, source_address=("127.0.0.2", 0))[0] for _ in range(6)]
        assert len(server.server.connections) == 2  # the hoarder keeps at most its cap
        served = [connect(server.port)[0] for _ in range(2)]
        for ws in served:
            assert ask(ws, {"observation/image": IMAGE, "num_candidates": 1})["actions"].shape == (8, 2)
        # Full, and nobody idle long enough to reclaim: a third client of this peer is refused, saying why.
        with pytest.raises(InvalidStatus) as full:
            connect(server.port)
        body = full.value.response.body.decode()
        assert full.value.response.status_code == 503 and body.startswith("CAPACITY (15): ")
        assert "openpi_max_connections_per_client=2" in body
        for ws in hoarder + served:
            ws.close()


def test_handshakes_that_fail_after_admission_do_not_keep_their_slots(toy_policy):
    with serving(toy_policy, max_connections=2, handshake_idle_s=60.0) as server:
        for _ in range(5):  # no Sec-WebSocket-Key: admitted by the hook, then refused by the library (400)
            with socket.create_connection(("127.0.0.1", server.port)) as raw:
                raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                            b"Sec-WebSocket-Version: 13\r\n\r\n")
                assert raw.recv(4096).startswith(b"HTTP/1.1 400")
        served = [connect(server.port)[0] for _ in range(2)]
        for ws in served:
            assert ask(ws, {"observation/image": IMAGE, "num_candidates": 1})["actions"].shape == (8, 2)
            ws.close()


def test_a_connect_after_sigterm_gets_503_while_the_server_drains(tmp_path):
    env = {"TRAJECTORY_ENSEMBLE_TESTING": "1", "TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S": "0.2"}
    with server_process(tmp_path, {}, env=env) as server:
        running, _ = connect(server.port)
        running.send(msgpack_numpy.packb({"observation/image": IMAGE, "num_candidates": 1}))
        # A peer that never answers the closing handshake keeps the drain open for its bounded flush.
        stubborn = socket.create_connection(("127.0.0.1", server.port))
        stubborn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
        assert stubborn.recv(4096).startswith(b"HTTP/1.1 101")
        server.proc.send_signal(signal.SIGTERM)
        outcomes = []
        while not outcomes or outcomes[-1] == 101:
            try:
                ws, _ = connect(server.port)  # before the signal is handled: served as usual
                ws.close()
                outcomes.append(101)
            except InvalidStatus as refused:
                outcomes.append((refused.response.status_code, refused.response.body.decode()))
        status, body = outcomes[-1]
        assert status == 503 and body.startswith("SHUTDOWN (42): "), outcomes[-1]
        frame = parse_error_frame(running.recv(timeout=30))
        assert frame["error"] == "SHUTDOWN"
        stubborn.close()
        assert server.wait(timeout=15) == 0, server.log()


# --- row 9 (wire part): the metadata lists only what a request may name -----------------------------------------------


def test_the_metadata_lists_only_reducers_valid_for_the_action_width_and_each_is_accepted(toy_policy):
    with serving(toy_policy) as server:
        ws, metadata = connect(server.port)
        valid = metadata["extras"]["reducer"]["valid"]
        assert metadata["action_dim"] == 2 and metadata["embodiment"] == "pusht"
        assert "pose_gripper" not in valid and {"mean", "mode", "medoid"} <= set(valid)
        for reducer in valid:
            reply = ask(ws, {"observation/image": IMAGE, "num_candidates": 2, "seed": 1, "reducer": reducer})
            assert reply["actions"].shape == (8, 2), (reducer, reply)
        refused = ask(ws, {"observation/image": IMAGE, "num_candidates": 2, "reducer": "pose_gripper"})
        assert refused["code"] == int(ErrorCode.REDUCER_INVALID_FOR_ACTION_SPACE)
        assert json.dumps(metadata["limits"]) and metadata["limits"]["max_connections_per_client"] == 16
