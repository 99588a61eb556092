"""Observation novelty over real DDS (issue 33): a node with a calibration file and its scorer reports
``novelty_score`` and ``novel`` in every result, and ``/diagnostics`` warns on a two-obstacle frame but not on a
normal one.

The calibration is made the way ``calibrate`` makes it, only smaller (``_node_harness.toy_novelty_calibration``); its
JSON recommends the ``novelty`` rule and the node's ``uncertainty_rule`` is left empty, so it takes the JSON's.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, serve_node, succeeded, toy_novelty_calibration  # noqa: E402
from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402

from trajectory_ensemble_node.toy import ACTION_SETTINGS, INSTRUCTION  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

COUNT = 4
stamps = Stamps(9000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_novelty")
    cal = toy_novelty_calibration(tmp)
    for node_and_client in serve_node(tmp, ros_domain_id, {
        **ACTION_SETTINGS, "model": "toy", "instruction": INSTRUCTION, "reducer": "mode", "candidate_count": COUNT,
        "uncertainty_calibration_file": str(cal.calibration_file), "novelty_scorer_file": str(cal.scorer_file),
        "max_observation_age_s": 120.0,
    }):
        yield node_and_client[1], cal.threshold, cal.normal, cal.shifted


def test_a_two_obstacle_frame_is_novel_and_diagnostics_warn(served):
    client, threshold, _, (image, score) = served
    client.publish_rgb(image, stamps())
    result = succeeded(client.run_goal(use_seed=True, seed=3))
    u = result.uncertainty
    assert u.rule == "novelty" and u.window == 1
    assert u.novelty_score == pytest.approx(score, rel=1e-4) and u.novelty_threshold == pytest.approx(threshold)
    assert u.novel and result.uncertain
    status, values = client.latest_status("engine", predicate=lambda v: v.get("novel") == "true")
    assert status.level == DiagnosticStatus.WARN and "rule novelty: novelty" in status.message
    assert values["uncertainty_rule"] == "novelty"


def test_a_normal_frame_is_not_novel_and_diagnostics_are_ok(served):
    client, threshold, (image, score), _ = served
    client.publish_rgb(image, stamps())
    result = succeeded(client.run_goal(use_seed=True, seed=4))
    u = result.uncertainty
    assert u.novelty_score == pytest.approx(score, rel=1e-4) and u.novelty_score < threshold
    assert not u.novel and not result.uncertain and u.rule == "novelty"
    status, _ = client.latest_status("engine", predicate=lambda v: v.get("novel") == "false")
    assert status.level == DiagnosticStatus.OK
