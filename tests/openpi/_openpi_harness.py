"""Shared helpers of the OpenPI tests: the toy policy behind a real server on a free port, and its observations.

The server runs in this process on its own event-loop thread (``ServerThread``), over real sockets; clients are the
real ``openpi_client.WebsocketClientPolicy`` or plain ``websockets`` sync clients. Tests that need the server as a
process (signals, memory) start ``trajectory-ensemble serve-openpi`` themselves (:func:`start_server_process`).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.openpi import OpenPIPolicy, OpenPIServer, ServerLimits, ServerThread
from trajectory_ensemble_node.serving.faults import FaultInjector
from trajectory_ensemble_node.serving.params import NodeParams, validate
from trajectory_ensemble_node.serving.request_path import build_request
from trajectory_ensemble_node.toy import heldout_scenes, render

STARTUP_TIMEOUT_S = 180.0


def toy_image(seed: int = 3) -> np.ndarray:
    """A rendered held-out toy scene ``[256, 256, 3]`` uint8 (what the toy policy was trained on)."""
    return render(heldout_scenes(1, seed=seed)[0])


def raw_client(url: str, headers: Mapping[str, str] | None = None, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """A plain ``websockets`` sync client (the library openpi-client uses) and the metadata it read first.

    Args:
        url (`str`): ``ws://HOST:PORT`` with the path.
        headers (`Mapping[str, str]`, *optional*): Extra handshake headers (``Authorization``).
        **kwargs: Passed to ``websockets.sync.client.connect``.
    """
    connect = pytest.importorskip("websockets.sync.client").connect
    unpackb = pytest.importorskip("openpi_client.msgpack_numpy").unpackb
    ws = connect(url, compression=None, max_size=None, additional_headers=headers, **kwargs)
    return ws, unpackb(ws.recv())


def wait_until(predicate, timeout: float = 60.0, what: str = "a condition") -> None:
    """Poll ``predicate`` every 10 ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


@pytest.fixture(scope="package")
def toy_policy() -> Iterator[OpenPIPolicy]:
    """The bundled toy policy with the node's default parameters, engine running, steps paced by a settable delay.

    ``policy.pacer.step_delay_s`` (0 by default) sleeps before every physical forward, so a disconnect, a queue or a
    shutdown lands mid-group however fast the machine is; tests that set it reset it.
    """
    policy = OpenPIPolicy.from_params(validate({}))
    policy.pacer = policy.model.instrument(lambda adapter: FaultInjector(adapter, step_delay_s=0.0))
    policy.start()
    yield policy
    policy.stop()


@contextlib.contextmanager
def serving(policy: OpenPIPolicy, *, api_key: str | None = None, **limits: Any) -> Iterator[ServerThread]:
    """An :class:`OpenPIServer` for ``policy`` on a free port, stopped on exit (the engine keeps running)."""
    server = OpenPIServer(policy, ServerLimits(**limits), port=0, api_key=api_key)
    thread = ServerThread(server).start()
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
def paced(toy_policy):
    """Set the toy policy's step delay for one test."""

    def set_delay(seconds: float) -> None:
        toy_policy.pacer.step_delay_s = seconds

    yield set_delay
    toy_policy.pacer.step_delay_s = 0.0


# --- the server as a process ---------------------------------------------------------------------------------------


def write_params(path: Path, overrides: Mapping[str, Any]) -> Path:
    """A node params YAML (``/**/trajectory_ensemble: ros__parameters:``) with ``overrides`` on the defaults."""
    path.write_text(yaml.safe_dump({"/**/trajectory_ensemble": {"ros__parameters": dict(overrides)}}))
    return path


class ServerProcess:
    """``trajectory-ensemble serve-openpi`` as a subprocess, its output in a log file."""

    def __init__(self, args: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen([sys.executable, "-m", "trajectory_ensemble_node.cli", "serve-openpi", *args],
                                     env={**os.environ, **(env or {})}, stdout=self._log, stderr=subprocess.STDOUT)
        self.port: int | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(r"ready: ws://[^:]+:(\d+)", self.log())
            if match:
                self.port = int(match.group(1))
                return self.port
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve-openpi exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise TimeoutError(f"serve-openpi not ready after {timeout} s:\n{self.log()}")

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@contextlib.contextmanager
def server_process(tmp_path: Path, overrides: Mapping[str, Any] | None = None, *, extra_args: list[str] = (),
                   env: Mapping[str, str] | None = None) -> Iterator[ServerProcess]:
    """Start ``serve-openpi`` on a free port with a params file of ``overrides``; killed on exit if still alive."""
    params = write_params(tmp_path / "openpi.yaml", overrides or {})
    server = ServerProcess(["--params-file", str(params), "--port", "0", *extra_args], tmp_path / "openpi.log", env)
    try:
        server.wait_ready()
        yield server
    finally:
        server.kill()


# --- a state-taking checkpoint (issue 58) --------------------------------------------------------------------------

STATE_NAMES = ("agent_x", "agent_y")
"""The state a PushT policy declares: the agent's position in env pixels (the contract of issue 58)."""
STATE_LOW, STATE_HIGH = (0.0, 0.0), (512.0, 512.0)
STATE_COUNT = 2
"""Candidates per request on the state checkpoint (the tiny model is quick, but every path runs it)."""


def state_params(checkpoint: Path, **overrides: Any) -> NodeParams:
    """The node's parameters serving the tiny state checkpoint at ``checkpoint`` (2 steps, :data:`STATE_COUNT`)."""
    return validate({"model": str(checkpoint), "num_inference_steps": 2, "candidate_count": STATE_COUNT, **overrides})


def state_request(state: Any, seed: int, image: np.ndarray, **extras: Any) -> dict[str, Any]:
    """An OpenPI request of the toy schema carrying ``observation/state`` (``None``: without it)."""
    obs = {"observation/image": image, "seed": seed, "num_candidates": STATE_COUNT, "return_candidates": True, **extras}
    if state is not None:
        obs["observation/state"] = state
    return obs


def served_in_process(model: Any, params: NodeParams, state: Any, seed: int, image: np.ndarray) -> Any:
    """The group a state request is, built by the faces' one builder and run on ``model`` in this process: the
    reference every other path must equal bit for bit.

    Returns:
        `EnsembleResult`: with ``candidates`` (returned, as the wire requests ask).
    """
    spec = CandidateTrajectorySpec(count=STATE_COUNT, reducer=params.reducer, return_candidates=True,
                                   max_count=params.max_candidates)
    request = build_request(model, params, prompt=params.instruction, spec=spec, base_seed=seed, image=image,
                            request_id=f"in-process-{seed}", context=None,
                            state=None if state is None else tuple(float(v) for v in np.asarray(state).tolist()))
    return model.wait(model.submit_request(request), timeout=120)
