"""The node refuses a bad configuration at startup with one clear message, and exits 2."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import env_without, run_node_until_exit, write_params  # noqa: E402

from trajectory_ensemble_node.tools.launcher import ros_env as ros_env_for  # noqa: E402

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
