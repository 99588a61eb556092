"""``trajectory-ensemble serve-openpi`` as a process: start-up refusals, SIGINT/SIGTERM with requests in flight, and
200 connect, request and disconnect cycles without a leak.

The server runs with ``TRAJECTORY_ENSEMBLE_TESTING=1`` and a test-only step delay (``serving/faults.py``), so a signal or
a disconnect lands while a group is denoising however fast the machine is. Its state is read from ``GET /stats``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

import pytest
from _openpi_harness import server_process, toy_image, wait_until

psutil = pytest.importorskip("psutil")
websockets_sync = pytest.importorskip("websockets.sync.client")
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
from websockets.exceptions import ConnectionClosed

from trajectory_ensemble_node.wire.codec import parse_error_frame
from trajectory_ensemble_node.openpi.cli import EXIT_DEADLINE_S

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]

TESTING = {"TRAJECTORY_ENSEMBLE_TESTING": "1"}
REQUEST = {"observation/image": toy_image(), "num_candidates": 1}


def stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=30) as response:
        return json.loads(response.read())


def connect(port: int):
    ws = websockets_sync.connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None)
    msgpack_numpy.unpackb(ws.recv())  # the metadata
    return ws


def test_a_non_loopback_address_without_a_key_is_refused_at_start_up():
    proc = subprocess.run([sys.executable, "-m", "trajectory_ensemble_node.cli", "serve-openpi", "--host", "0.0.0.0",
                           "--port", "0"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "--host '0.0.0.0'" in proc.stderr and "--api-key" in proc.stderr and "Traceback" not in proc.stderr
    assert "error: INVALID_PARAMETERS (52): " in proc.stderr  # the code, not the class


def test_an_invalid_params_file_is_refused_by_name(tmp_path):
    params = tmp_path / "bad.yaml"
    params.write_text("/**/trajectory_ensemble:\n  ros__parameters:\n    openpi_schema: aloha\n    openpi_max_queued: -1\n")
    proc = subprocess.run([sys.executable, "-m", "trajectory_ensemble_node.cli", "serve-openpi", "--params-file",
                           str(params), "--port", "0"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2 and "openpi_max_queued: must be >= 0, got -1" in proc.stderr
    assert "error: INVALID_PARAMETERS (52): invalid parameters" in proc.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_the_server_in_bounded_time_and_every_request_in_flight_gets_an_error_frame(tmp_path, signum):
    overrides = {"openpi_max_concurrent": 1, "openpi_max_queued": 4}
    env = {**TESTING, "TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S": "0.3"}
    with server_process(tmp_path, overrides, env=env) as server:
        running, queued = connect(server.port), connect(server.port)
        running.send(msgpack_numpy.packb(REQUEST))
        wait_until(lambda: stats(server.port)["running"] == 1, what="a request in the engine")
        queued.send(msgpack_numpy.packb(REQUEST))
        wait_until(lambda: stats(server.port)["waiting"] == 1, what="a request waiting")
        server.proc.send_signal(signum)
        for ws in (running, queued):
            frame = parse_error_frame(ws.recv(timeout=30))
            assert frame["error"] == "SHUTDOWN" and frame["code"] == 42, frame
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd.code == 1001 and "shutting down" in closed.value.rcvd.reason
        # Within the exit deadline, and by the graceful path (the watchdog would exit with 3).
        assert server.wait(timeout=EXIT_DEADLINE_S + 5) == 0, server.log()
        assert "Traceback" not in server.log()


def test_200_connect_request_disconnect_cycles_cancel_their_groups_and_do_not_grow_memory(tmp_path):
    env = {**TESTING, "TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S": "0.05"}
    with server_process(tmp_path, {}, env=env) as server:
        process = psutil.Process(server.proc.pid)

        def cycle() -> None:
            before = stats(server.port)["groups"].get("canceled", 0)
            ws = connect(server.port)
            ws.send(msgpack_numpy.packb(REQUEST))
            wait_until(lambda: stats(server.port)["in_engine"] == 1, what="the request's group in the engine")
            ws.close()
            wait_until(lambda: stats(server.port)["groups"].get("canceled", 0) == before + 1,
                       what="its group canceled")

        for _ in range(20):  # warm-up: allocator pools, the prefix cache, lazy imports
            cycle()
        warm_rss = process.memory_info().rss
        for _ in range(200):
            cycle()
        final = stats(server.port)
        rss = process.memory_info().rss
        assert final["groups"]["canceled"] == 220 and final["server"]["canceled_on_disconnect"] == 220
        assert final["groups"].get("succeeded", 0) == 0 and final["connections"] == 0
        assert rss <= 1.05 * warm_rss, f"RSS grew from {warm_rss / 2**20:.1f} MiB to {rss / 2**20:.1f} MiB"
