"""serving/params.py: the parameter table, config/serve.yaml and validation. Runs without rclpy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trajectory_ensemble_node.serving import params

REPO = Path(__file__).resolve().parents[2]


def test_serve_yaml_declares_exactly_the_node_parameters_with_the_same_defaults():
    raw = yaml.safe_load((REPO / "config" / "serve.yaml").read_text())["/**/trajectory_ensemble"]["ros__parameters"]
    assert set(raw) == set(params.PARAMETER_NAMES)
    for spec in params.PARAMETERS:
        assert raw[spec.name] == spec.default, spec.name
    validated = params.validate(raw)
    assert validated.joint_names == () and validated.image_topics == ()
    # The default is the bundled toy policy with the settings it was trained for, and a reducer that keeps one of
    # its two behaviours.
    from trajectory_ensemble_node.toy import ACTION_SETTINGS, INSTRUCTION

    assert validated.model == "toy" and validated.action_dim == 2 and validated.reducer == "mode"
    assert validated.instruction == INSTRUCTION
    assert all(getattr(validated, name) == value for name, value in ACTION_SETTINGS.items())


def test_bad_parameters_are_all_reported_by_name():
    with pytest.raises(params.ParameterError) as info:
        params.validate({"goal_policy": "drop", "fps": 0, "joint_names": ["a", "b"], "modle": "x", "chunk_size": "8",
                         "enable_weight_updates": True, "domain_name": "droid_lerobot", "prefix_retain": -1,
                         "cfg_mode": "both", "step_capture": "graphs"}, env={})
    text = str(info.value)
    for expected in ("goal_policy: 'drop'", "fps: must be > 0", "modle: unknown parameter", "chunk_size: expected",
                     "prefix_retain: must be >= 0, got -1",
                     "cfg_mode: 'both' is not one of ['auto', 'fused', 'separate']",
                     "step_capture: 'graphs' is not one of ['off', 'cuda_graph', 'compile']",
                     "joint_names: 2 names ['a', 'b'] but domain_name 'droid_lerobot' has action width 10",
                     "weights_dir: must be set"):
        assert expected in text, expected
    with pytest.raises(params.ParameterError, match="reducer: .*pose_gripper.*width 2"):
        params.validate({"reducer": "pose_gripper", "domain_name": "pusht"}, env={})
    with pytest.raises(params.ParameterError, match="step_capture: .cuda_graph. needs a CUDA device, but device is"):
        params.validate({"step_capture": "cuda_graph", "device": "cpu"}, env={})
    with pytest.raises(params.ParameterError, match="reducer: unknown reducer 'nope'"):
        params.validate({"reducer": "nope"}, env={})
    assert params.validate({"fps": 15, "joint_names": [f"j{i}" for i in range(10)], "domain_name": "droid_lerobot"},
                           env={}).fps == 15.0


def test_fault_injection_is_refused_outside_tests():
    with pytest.raises(params.ParameterError, match="TRAJECTORY_ENSEMBLE_TESTING=1"):
        params.validate({"fault_injection": "engine_exception"}, env={})
    assert params.validate({"fault_injection": "engine_exception"},
                           env={"TRAJECTORY_ENSEMBLE_TESTING": "1"}).fault_injection == "engine_exception"
    with pytest.raises(params.ParameterError, match="not one of"):
        params.check_fault_injection("meteor", env={"TRAJECTORY_ENSEMBLE_TESTING": "1"})


@pytest.mark.parametrize(("value", "expected"), [(-0.1, "mode_threshold: mode threshold must be a finite number >= 0"),
                                                 (float("inf"), "mode_threshold: expected a finite number")])
def test_mode_threshold_is_checked_by_the_reducers_own_rule(value, expected):
    with pytest.raises(params.ParameterError, match=expected):
        params.validate({"mode_threshold": value}, env={})


def test_mode_threshold_defaults_to_the_relative_rule_and_is_taken_on_a_remote_engine_too():
    assert params.validate({}, env={}).mode_threshold == 0.0
    assert params.validate({"mode_threshold": 0.05}, env={}).mode_threshold == 0.05
    # The remote model reduces its one-sample groups with the engine's completion, at this cut (tests/remote).
    remote = params.validate({"mode_threshold": 0.05, "engine": "openpi", "engine_url": "ws://127.0.0.1:9"}, env={})
    assert remote.mode_threshold == 0.05


def test_new_parameters_are_checked_and_quote_the_bad_value(tmp_path):
    with pytest.raises(params.ParameterError) as info:
        params.validate({"domain_name": "pusht", "reducer": "mode", "min_valid_candidates": 0,
                         "position_limit_policy": "squash", "guidance_mode": "x", "continuity_reducer": "nope",
                         "limits_file": str(tmp_path / "missing.yaml"), "uncertainty_threshold": 0.1,
                         "uncertainty_calibration_file": str(tmp_path / "missing.json"), "start_jump_joints": ["a"]},
                        env={})
    text = str(info.value)
    for fragment in ("min_valid_candidates: must be in [1", "'squash'", "guidance_mode: 'x'", "continuity_reducer:",
                     "missing.yaml' is not an existing file", "not both", "start_jump_joints: 1 names"):
        assert fragment in text, fragment
