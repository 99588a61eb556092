"""``serve-ray`` on a local Ray instance with 2 CPU replicas, beside ``serve-openpi`` (issue 48, acceptance 3).

One Ray instance for the module (4 logical CPUs, no dashboard, a small object store); the application is the one
``serve-ray`` and ``serve run`` deploy (:func:`trajectory_ensemble_node.fleet.app.application`), its ingress on a free
port, the replicas paced (``TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S``) so a kill lands while requests are in them. The
reference is ``serve-openpi``'s server in this process (``ServerThread``) on the same toy model.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from _openpi_harness import raw_client, serving, toy_image, wait_until

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.fleet.protocol import REPLICA_ACTOR
from trajectory_ensemble_node.openpi import OpenPIPolicy
from trajectory_ensemble_node.wire.codec import parse_error_frame
from trajectory_ensemble_node.serving.faults import STEP_DELAY_ENV
from trajectory_ensemble_node.serving.model_factory import TESTING_ENV
from trajectory_ensemble_node.serving.params import validate

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")
WebsocketClientPolicy = pytest.importorskip("openpi_client.websocket_client_policy").WebsocketClientPolicy
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")
InvalidStatus = pytest.importorskip("websockets.exceptions").InvalidStatus

KEY = "fleet-key"
APP = "fleet_test"
IMAGE = toy_image()
STEP_DELAY_S = 0.1  # 10 steps: about a second a group, so a kill lands mid-group however fast the machine is
READY = re.compile(r"ready: ws://([^:]+):(\d+)")


@dataclass
class Fleet:
    port: int
    ingress: Any  # the ingress deployment's handle

    def client(self) -> Any:
        return WebsocketClientPolicy(host="127.0.0.1", port=self.port, api_key=KEY)


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    from trajectory_ensemble_node.fleet.app import application

    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=80 * 1024 * 1024, log_to_driver=False,
             runtime_env={"env_vars": {TESTING_ENV: "1", STEP_DELAY_ENV: str(STEP_DELAY_S)}})
    try:
        serve.start(proxy_location="Disabled")
        ingress = serve.run(application({}, replicas=2, port=0, api_keys=[KEY]), name=APP, route_prefix=None)
        match = READY.search(ingress.ready_line.remote().result())
        assert match, "no ready line"
        yield Fleet(int(match.group(2)), ingress)
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def local() -> Iterator[Any]:
    """``serve-openpi``'s server on the same toy model, with the same key."""
    policy = OpenPIPolicy.from_params(validate({}))
    policy.start()
    with serving(policy, api_key=KEY) as server:
        yield server
    policy.stop()


def _local_client(server: Any) -> Any:
    return WebsocketClientPolicy(host="127.0.0.1", port=server.port, api_key=KEY)


def test_replies_equal_serve_openpi_bitwise(fleet, local):
    remote, reference = fleet.client(), _local_client(local)
    got_meta, want_meta = remote.get_server_metadata(), reference.get_server_metadata()
    # The same handshake, but the ingress admits max_concurrent per replica.
    assert got_meta.pop("limits") == {**want_meta.pop("limits"), "max_concurrent": 2 * 8}
    assert got_meta == want_meta
    for seed in (1, 2, 3):
        obs = {"observation/image": IMAGE, "num_candidates": 4, "seed": seed, "return_candidates": True}
        got, want = remote.infer(obs), reference.infer(obs)
        assert got["metrics"][REPLICA_ACTOR].startswith(f"SERVE_REPLICA::{APP}#")
        for key in ("actions", "candidates", "valid"):
            assert np.array_equal(got[key], want[key]), key
        assert got["seeds"] == want["seeds"] and got["base_seed"] == want["base_seed"] == seed


def test_a_continued_session_keeps_its_frozen_rows_across_replicas(fleet, local):
    remote, reference = fleet.client(), _local_client(local)
    base = {"observation/image": IMAGE, "num_candidates": 4, "session_id": "episode-1"}
    replicas, previous = [], None
    for k in range(12):
        obs = {**base, "stamp": 10.0 + 0.25 * k, "seed": 20 + k}
        if k:
            obs.update(continue_previous=True, inference_delay=1)
        got, want = remote.infer(obs), reference.infer(obs)
        assert np.array_equal(got["actions"], want["actions"]) and got["continuity"] == want["continuity"]
        if previous is not None:
            # Two actions (dt 0.125 s) later, one frozen: action 0 continues the previous chunk's action 2.
            assert got["continuity"] == "continued" and got["metrics"]["context_frozen"] == 1
            np.testing.assert_allclose(got["actions"][0], previous["actions"][2], atol=1e-4)
        replicas.append(got["metrics"][REPLICA_ACTOR])
        previous = got
        if k >= 2 and len(set(replicas[1:])) == 2:
            break  # continued requests were served by both replicas
    assert len(set(replicas[1:])) == 2, f"every continued request went to one replica: {replicas}"


def _infer_all(fleet: Fleet, count: int) -> tuple[list[dict[str, Any] | str], list[threading.Thread]]:
    """``count`` requests at once, each on its own connection: the reply dict, or the error frame's text."""
    out: list[dict[str, Any] | str] = [""] * count

    def one(i: int) -> None:
        ws, _ = raw_client(f"ws://127.0.0.1:{fleet.port}", {"Authorization": f"Api-Key {KEY}"})
        ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "num_candidates": 2, "seed": 100 + i}))
        reply = ws.recv(timeout=120)
        out[i] = reply if isinstance(reply, str) else msgpack_numpy.unpackb(reply)
        ws.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    return out, threads


def _replica_states() -> dict[str, int]:
    app = serve.status().applications.get(APP)
    return dict(app.deployments["EngineReplica"].replica_states) if app else {}


def _replicas(fleet: Fleet) -> dict[str, dict[str, Any]]:
    """Each replica's ``identify()`` (outcome counts, groups in its engine), by actor name (Serve routes each call to
    one replica: ask until both answered)."""
    engine = serve.get_deployment_handle("EngineReplica", app_name=APP)
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(40):
        info = engine.identify.remote().result()
        seen[info[REPLICA_ACTOR]] = info
        if len(seen) == 2:
            break
    return seen


def _ongoing() -> dict[str, int]:
    """Each live replica's ongoing requests, asked of its actor directly. Serve's router sends a call to the replica
    with the shorter queue, so calls through a handle (``_replicas``) may never reach the busier one while groups are
    in flight; the count the router itself reads does not depend on where a call is routed."""
    prefix = f"SERVE_REPLICA::{APP}#EngineReplica#"
    counts: dict[str, int] = {}
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["namespace"] == "serve" and entry["name"].startswith(prefix):
            try:
                actor = ray.get_actor(entry["name"], namespace="serve")
                counts[entry["name"]] = ray.get(actor.get_num_ongoing_requests.remote(), timeout=30)
            except (ValueError, ray.exceptions.RayError):
                continue  # gone between the listing and the call
    return counts


def _pace(delay_s: float, replicas: set[str] | None = None) -> set[str]:
    """Set the step delay of every replica (or of ``replicas``); returns the names that acknowledged."""
    engine = serve.get_deployment_handle("EngineReplica", app_name=APP)
    seen: set[str] = set()
    for _ in range(80):
        try:
            seen.add(engine.pace.remote(delay_s).result()[REPLICA_ACTOR])
        except ray.exceptions.RayError:
            continue  # routed to a replica that is gone
        if (replicas is not None and replicas <= seen) or (replicas is None and len(seen) == 2):
            return seen
    raise AssertionError(f"only {sorted(seen)} acknowledged the step delay")


def test_a_killed_replica_fails_its_inflight_requests_by_name_and_the_next_are_served(fleet):
    names = _pace(1.0)  # 10 s a group: every group is still running when the kill lands
    replies, threads = _infer_all(fleet, 6)
    inflight: dict[str, int] = {}

    def all_on_replicas() -> bool:
        inflight.clear()
        inflight.update(_ongoing())
        return sum(inflight.values()) == 6

    wait_until(all_on_replicas, 60, "the 6 requests on the replicas")
    victim = max(inflight, key=inflight.__getitem__)  # the replica holding the most of them
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    _pace(STEP_DELAY_S, names - {victim})
    for thread in threads:
        thread.join(120)
    lost = [r for r in replies if isinstance(r, str)]
    served = [r for r in replies if not isinstance(r, str)]
    # Every request ends, lost by name or served. A request the victim had taken but whose acceptance the ingress's
    # router had not yet heard when it died is routed again by Serve and served elsewhere (a slower reply, not a loss),
    # so the victim's count bounds the losses rather than fixing them.
    assert len(lost) + len(served) == 6 and 1 <= len(lost) <= inflight[victim]
    for text in lost:
        frame = parse_error_frame(text)
        assert (frame["error"], frame["code"], frame["type"]) == ("REPLICA_LOST", int(ErrorCode.REPLICA_LOST),
                                                                 "ReplicaLostError")
        assert "Traceback" not in frame["message"]
    assert all(r["metrics"][REPLICA_ACTOR] != victim for r in served)
    assert fleet.ingress.stats.remote().result()["groups"]["replica_lost"] == len(lost)
    # Serve replaces the replica; the same server serves the next requests.
    def replaced() -> bool:
        try:
            names = set(_replicas(fleet))
        except ray.exceptions.RayError:  # routed to the dead replica before the router heard of it
            return False
        return _replica_states() == {"RUNNING": 2} and len(names) == 2 and victim not in names

    wait_until(replaced, 120, "Serve to replace the replica")
    client = fleet.client()  # connected now: the server closes a connection idle past openpi_idle_timeout_s
    after = {client.infer({"observation/image": IMAGE, "seed": 200 + i})["metrics"][REPLICA_ACTOR] for i in range(4)}
    assert victim not in after


def test_a_client_that_leaves_mid_request_cancels_its_group_on_the_replica(fleet):
    def canceled() -> int:
        return sum(info["outcomes"].get("canceled", 0) for info in _replicas(fleet).values())

    wait_until(lambda: _replica_states() == {"RUNNING": 2} and len(_ongoing()) == 2, 120, "two running replicas")
    before = canceled()
    ws, _ = raw_client(f"ws://127.0.0.1:{fleet.port}", {"Authorization": f"Api-Key {KEY}"})
    ws.send(msgpack_numpy.packb({"observation/image": IMAGE, "num_candidates": 2, "seed": 7}))
    wait_until(lambda: sum(_ongoing().values()) == 1, 60, "the request on a replica")
    ws.close()
    wait_until(lambda: canceled() == before + 1, 60, "the replica to cancel the group")
    assert fleet.ingress.stats.remote().result()["server"]["canceled_on_disconnect"] >= 1


def _handshake(port: int, headers: dict[str, str]) -> tuple[int, bytes]:
    with pytest.raises(InvalidStatus) as refused:
        raw_client(f"ws://127.0.0.1:{port}", headers)
    return refused.value.response.status_code, refused.value.response.body


def test_bad_keys_and_bad_frames_get_serve_openpis_refusals(fleet, local):
    for headers in ({}, {"Authorization": "Api-Key wrong"}, {"Authorization": "Bearer wrong"}):
        got, want = _handshake(fleet.port, headers), _handshake(local.port, headers)
        assert got == want and got[0] == 401
    frames = [b"\x00not msgpack", msgpack_numpy.packb({"prompt": "no image"}),
              msgpack_numpy.packb({"observation/image": IMAGE, "num_candidates": 10_000}),
              msgpack_numpy.packb({"observation/image": IMAGE, "reducer": "no-such-reducer"})]
    for frame in frames:
        replies = []
        for port in (fleet.port, local.port):
            ws, _ = raw_client(f"ws://127.0.0.1:{port}", {"Authorization": f"Api-Key {KEY}"})
            ws.send(frame)
            replies.append(parse_error_frame(ws.recv(timeout=60)))
            ws.close()
        assert replies[0] == replies[1]
    with urllib.request.urlopen(f"http://127.0.0.1:{fleet.port}/healthz", timeout=10) as response:
        assert response.read() == b"OK\n"


def test_the_serve_ray_command_prints_the_ready_line_and_serves(fleet, tmp_path):
    address = ray.get_runtime_context().gcs_address
    log = tmp_path / "serve-ray.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "trajectory_ensemble_node.cli", "serve-ray", "--replicas", "1",
                                 "--port", "0", "--ray-address", address, "--app-name", "fleet_cli"],
                                stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: READY.search(log.read_text(errors="replace")) or proc.poll() is not None, 150,
                       "the ready line")
            match = READY.search(log.read_text(errors="replace"))
            assert match, log.read_text(errors="replace")
            client = WebsocketClientPolicy(host="127.0.0.1", port=int(match.group(2)))
            assert client.infer({"observation/image": IMAGE, "seed": 5})["actions"].shape == (8, 2)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert "fleet_cli" not in serve.status().applications
