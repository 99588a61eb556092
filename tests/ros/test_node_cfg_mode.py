"""The ``cfg_mode`` parameter reaches the model: a guided goal runs one or two forwards per step as configured."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, metrics_dict, serve_node  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

STEPS = 2
stamps = Stamps(3000)


def test_separate_cfg_runs_two_forwards_per_step_even_for_a_group(tmp_path, ros_domain_id):
    # auto would fuse this 3-candidate group into one forward per step (STEPS forwards): the parameter must win.
    overrides = {"cfg_mode": "separate", "guidance_scale": 2.0, "num_inference_steps": STEPS,
                 "max_observation_age_s": 120.0}
    for _, client in serve_node(tmp_path, ros_domain_id, overrides):
        client.publish_image(stamps())
        outcome = client.run_goal(candidate_count=3)
        assert outcome.status == GoalStatus.STATUS_SUCCEEDED, outcome.result.error_message
        metrics = metrics_dict(outcome.result)
        assert metrics["candidate_count"] == "3" and metrics["physical_forwards"] == str(2 * STEPS)
