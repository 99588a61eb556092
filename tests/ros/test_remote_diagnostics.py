"""/diagnostics of a node on a remote engine: its state, round trip and version, and ERROR while it is away."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from trajectory_ensemble_node.ros import diagnostics  # noqa: E402


def remote_inputs(state: str) -> diagnostics.DiagnosticsInputs:
    return diagnostics.DiagnosticsInputs(
        node_name="trajectory_ensemble", hardware_id="cpu", model="toy", notice="toy policy", weights_version=3,
        engine_alive=True, remote={"state": state, "url": "ws://gpu:8000", "round_trip_ms": 12.5, "failures": 0,
                                   "server": "trajectory_ensemble", "model": "toy", "weights_version": 3,
                                   "samples_per_request": 32, "last_error": ""})


def test_the_engine_status_shows_the_remote_and_is_an_error_while_it_is_away():
    status = diagnostics.engine_status(remote_inputs("connected"))
    values = {kv.key: kv.value for kv in status.values}
    assert status.level == diagnostics.OK
    assert values["remote_state"] == "connected" and values["remote_url"] == "ws://gpu:8000"
    assert values["remote_round_trip_ms"] == "12.500" and values["remote_weights_version"] == "3"
    away = diagnostics.engine_status(remote_inputs("reconnecting"))
    assert away.level == diagnostics.ERROR and "remote engine reconnecting: ws://gpu:8000" in away.message


def test_a_local_engine_shows_no_remote_entries():
    inputs = remote_inputs("connected")
    inputs.remote = None
    assert not [kv for kv in diagnostics.engine_status(inputs).values if kv.key.startswith("remote_")]
