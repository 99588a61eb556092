"""The node refuses a bad configuration at startup with one clear message, and exits 2."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import env_without, run_node_until_exit, write_params  # noqa: E402

from trajectory_ensemble_node.cli.launcher import ros_env as ros_env_for  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]


def test_invalid_parameters_are_all_named_and_the_node_exits_2(tmp_path, ros_domain_id):
    params_file = write_params(tmp_path / "bad.yaml", {
        "joint_names": ["shoulder", "elbow", "wrist"], "goal_policy": "drop", "fault_injection": "engine_exception",
        "max_candidats": 4,
    })
    env = env_without(ros_env_for(ros_domain_id), "TRAJECTORY_ENSEMBLE_TESTING")
    done = run_node_until_exit(params_file, env)
    assert done.returncode == 2, done.stdout + done.stderr
    message = done.stderr
    assert "joint_names: 3 names ['shoulder', 'elbow', 'wrist'] but domain_name 'droid_lerobot' has action width 10" \
        in message
    assert "goal_policy: 'drop'" in message and "max_candidats: unknown parameter" in message
    assert "fault_injection: 'engine_exception' is a test-only hook" in message
    assert "ready" not in done.stdout


def test_a_model_directory_with_pickle_weights_is_refused(tmp_path, ros_domain_id):
    model = tmp_path / "model"
    (model / "transformer").mkdir(parents=True)
    (model / "model_index.json").write_text("{}")
    (model / "transformer" / "diffusion_pytorch_model.bin").write_bytes(b"not loaded")
    params_file = write_params(tmp_path / "pickle.yaml", {"model": str(model)})
    done = run_node_until_exit(params_file, ros_env_for(ros_domain_id))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "pickle weights with no safetensors alongside (transformer/diffusion_pytorch_model.bin)" in done.stderr
    assert f"[weights from {model}] loading model" in done.stderr  # rclpy logs to stderr


def test_a_refused_novelty_scorer_prints_its_code_on_the_log_and_on_exit(tmp_path, ros_domain_id):
    """Issue 45, row 9: a start-up refusal prints NAME (code), which the error table lists, not the error's class."""
    import json

    scorer = tmp_path / "bad.novelty.safetensors"
    scorer.write_bytes(b"not a safetensors file")
    threshold = {"spread_threshold": 1.0, "novelty_threshold": 0.5}
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({
        "uncertainty": {"threshold": 1.0}, "observation": {"threshold": 0.5, "scorer_sha256": "0" * 64},
        "combined": {"rule": "novelty", "rules": dict.fromkeys(("spread", "novelty", "either", "both"), threshold)},
    }))
    params_file = write_params(tmp_path / "novelty.yaml", {
        "novelty_scorer_file": str(scorer), "uncertainty_calibration_file": str(calibration),
        "uncertainty_rule": "novelty"})
    done = run_node_until_exit(params_file, ros_env_for(ros_domain_id))
    assert done.returncode == 2, done.stdout + done.stderr
    # rclpy logs to stderr; the exit message too.
    assert "configure failed: NOVELTY_SCORER_INVALID (84): novelty scorer" in done.stderr, done.stderr
    assert "error: NOVELTY_SCORER_INVALID (84): novelty scorer" in done.stderr, done.stderr
    assert "NoveltyScorerError" not in done.stderr
