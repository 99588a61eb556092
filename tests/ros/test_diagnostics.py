"""ros/diagnostics.py: /diagnostics statuses follow diagnostic_updater's names and levels (no DDS)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("rclpy")

from trajectory_ensemble_node.ros import conversions, diagnostics  # noqa: E402


def test_diagnostics_follow_diagnostic_updater_names_and_levels():
    inputs = diagnostics.DiagnosticsInputs(
        node_name="trajectory_ensemble", hardware_id="cpu", model="tiny", notice="untrained demo weights",
        weights_version=2, engine_alive=True, last_metrics={"total_ms": 3.0, "peak_memory_bytes": 10},
        goal_counts={"succeeded": 1, "aborted": 2, "canceled": 0, "preempted": 1, "rejected": 0, "running": 0,
                     "waiting": 0},
        observation_ages={"/img": None}, frames_rejected={"encoding": 1}, image_topics=("/img",),
    )
    array = diagnostics.build_diagnostics(inputs, stamp=conversions.make_header(
        SimpleNamespace(sec=0, nanosec=0), "").stamp)
    engine, goal_status, obs = array.status
    assert [s.name for s in array.status] == ["trajectory_ensemble: engine", "trajectory_ensemble: goals",
                                              "trajectory_ensemble: observations"]
    values = {kv.key: kv.value for kv in engine.values}
    assert engine.level == diagnostics.OK and "untrained demo weights" in engine.message
    assert values["total_ms"] == "3.000" and values["weights_version"] == "2"
    assert {kv.key: kv.value for kv in goal_status.values}["goals_preempted"] == "1"
    assert obs.level == diagnostics.WARN and "no image yet on /img" in obs.message
    assert {kv.key: kv.value for kv in obs.values}["frames_rejected_encoding"] == "1"
    inputs.engine_alive = False
    assert diagnostics.engine_status(inputs).level == diagnostics.ERROR
    inputs.engine_alive, inputs.last_error = True, "ENGINE_FAILURE: boom"
    assert diagnostics.engine_status(inputs).level == diagnostics.WARN


def test_clock_jumps_are_reported_under_sim_time_only():
    inputs = diagnostics.DiagnosticsInputs(node_name="n", hardware_id="cpu", model="tiny", notice="x",
                                           weights_version=0, engine_alive=True, image_topics=("/img",),
                                           observation_ages={"/img": None})
    assert not any(kv.key.startswith("clock_jumps") for kv in diagnostics.observations_status(inputs).values)
    inputs.clock_jumps = {"backward": 2, "forward": 1}
    values = {kv.key: kv.value for kv in diagnostics.observations_status(inputs).values}
    assert (values["clock_jumps_backward"], values["clock_jumps_forward"]) == ("2", "1")


def test_the_joint_states_age_is_shown_and_a_model_that_takes_state_warns_without_it():
    inputs = diagnostics.DiagnosticsInputs(node_name="n", hardware_id="cpu", model="tiny", notice="x",
                                           weights_version=0, engine_alive=True, image_topics=("/img",),
                                           observation_ages={"/img": 0.1, "/state": None}, state_topic="/state",
                                           max_observation_age_s=1.0)
    status = diagnostics.observations_status(inputs)
    values = {kv.key: kv.value for kv in status.values}
    # A model without state: the age is shown, its absence is no fault.
    assert values["state_age_s"] == "never" and "state_names" not in values
    assert status.level == diagnostics.OK
    inputs.state_names = ("agent_x", "agent_y")
    status = diagnostics.observations_status(inputs)
    values = {kv.key: kv.value for kv in status.values}
    assert status.level == diagnostics.WARN and "no joint state yet on /state" in status.message
    assert values["state_names"] == "agent_x, agent_y"
    inputs.observation_ages = {"/img": 0.1, "/state": 2.5}
    status = diagnostics.observations_status(inputs)
    assert status.level == diagnostics.WARN and "/state stale (2.50 s)" in status.message
    assert {kv.key: kv.value for kv in status.values}["state_age_s"] == "2.500"
    inputs.observation_ages = {"/img": 0.1, "/state": 0.02}
    assert diagnostics.observations_status(inputs).level == diagnostics.OK
