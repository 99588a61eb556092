"""``calibrate --bag --start-node`` fits the same novelty scorer as the toy-scene calibration (issue 33): from the
frames of the goals it scored, one scorer file beside the JSON, both thresholds per rule, and a node that loads the
two reports ``novelty_score`` on every goal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trajectory_ensemble_node.novelty import file_sha256, load_scorer
from trajectory_ensemble_node.testing import ReplayNode
from trajectory_ensemble_node.replay import bags
from trajectory_ensemble_node.cli.launcher import ros_env, unused_domain_id
from trajectory_ensemble_node.uncertainty import ALARM_RULES

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ALPHA = 0.2  # 20 threshold goals give finite thresholds down to alpha / 2 = 0.1


def test_bag_calibration_fits_the_scorer_and_a_node_loads_it(tmp_path: Path) -> None:
    pytest.importorskip("trajectory_ensemble_msgs")
    calibration = bags.make_demo_bag(tmp_path / "calibration", range(900, 940)).path
    heldout = bags.make_demo_bag(tmp_path / "heldout", range(950, 960)).path
    out = tmp_path / "bags.json"
    env = ros_env(unused_domain_id())  # calibrate starts its own node on another unused domain
    proc = subprocess.run(
        [sys.executable, "-m", "trajectory_ensemble_node.cli", "calibrate", "--bag", str(calibration),
         "--heldout-bag", str(heldout), "--start-node", "--count", "4", "--rate", "8", "--alpha", str(ALPHA),
         "--scorer", "knn", "--replay-out", str(tmp_path / "replays"), "--wait", "120", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    observation, combined = result["observation"], result["combined"]
    scorer_file = Path(observation["scorer_file"])
    assert scorer_file == out.with_suffix(".novelty.safetensors") and file_sha256(scorer_file) == \
        observation["scorer_sha256"]
    assert load_scorer(scorer_file).kind == "knn" and observation["fit_goals"] == observation["threshold_goals"] == 20
    assert combined["rule"] == "both" and set(combined["rules"]) == set(ALARM_RULES)
    assert combined["rules"]["both"]["novelty_threshold"] == observation["threshold"]
    assert all(0 <= f["false_alarm_rate"] <= 1 for f in combined["rules"].values())
    assert "Novelty:" in out.with_suffix(".md").read_text()
    with ReplayNode({"device": "cpu", "uncertainty_calibration_file": str(out),
                     "novelty_scorer_file": str(scorer_file)}, out=tmp_path / "loaded") as node:
        run = node.replay(heldout, candidates=4)
    assert run.exit_status == 0, run.output
    for goal in run.summary["goals"]:
        assert goal["metrics"]["uncertainty_rule"] == "both" and float(goal["metrics"]["novelty_score"]) >= 0
        assert goal["metrics"]["novel"] in ("true", "false")
