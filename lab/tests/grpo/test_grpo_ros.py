"""``train-grpo --ros`` against a live node: weights pushed through ``~/update_weights`` reach every later rollout."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from trajectory_ensemble_node.cli import main  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]


def test_three_iterations_against_a_live_node(tmp_path, ros_domain_id):
    out = tmp_path / "grpo.json"
    code = main(["train-grpo", "--ros", "--iterations", "3", "--scenes", "1", "--group-size", "2", "--steps", "2",
                 "--heldout-scenes", "1", "--heldout-group", "2", "--lr", "1e-4",
                 "--work-dir", str(tmp_path / "work"), "--json", str(out)])
    assert code == 0
    grpo = json.loads(out.read_text())["grpo"]
    checks = grpo["ros_checks"]
    assert checks["domain_id"] == ros_domain_id
    # Before any update the node's records are reproduced by the trainer's recompute.
    assert grpo["initial_ratio_max_abs_dev"] <= 1e-5
    # Each push raised the version by one; every rollout after it carried the new version (one group per iteration
    # here, and the trainer refuses an iteration whose groups carry several versions).
    assert checks["pushed_versions"] == [1, 2, 3]
    assert checks["rollout_versions"] == [0, 1, 2]
    assert [e["weights_version_sampled"] for e in grpo["iterations"]] == [0, 1, 2]
    # Between updates the node kept serving normal goals, on the version just pushed, without a rollout record.
    assert [g["weights_version"] for g in checks["normal_goals_after_push"]] == [1, 2, 3]
    assert all(g["rollout_path"] == "" and g["horizon"] == 8 for g in checks["normal_goals_after_push"])
    assert grpo["heldout"]["after"]["candidates"] == 2
