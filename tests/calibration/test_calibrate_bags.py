"""``calibrate --bag`` on toy demonstration bags, over DDS against the real node: the threshold holds its false-alarm
rate on held-out bags, a node loads the file, and too few goals is a named error.

The node runs the toy policy at 4 candidates and 4 denoising steps, so that 200 goals fit in a few minutes on two
cores; the threshold is specific to those settings, as any calibration is to the node's own.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trajectory_ensemble_node.serving.startup_checks import load_uncertainty_threshold
from trajectory_ensemble_node.testing import ReplayNode
from trajectory_ensemble_node.replay import bags

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ALPHA = 0.1
SCENES = 100
PARAMS = {"device": "cpu", "num_inference_steps": 4, "candidate_count": 4}


def _calibrate(node: ReplayNode, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trajectory_ensemble_node.cli", "calibrate", *args, "--count", "4", "--rate", "8",
         "--replay-out", str(tmp_path / "replays"), "--wait", "60"],
        env=node.env, capture_output=True, text=True, timeout=1800)


def test_threshold_from_bags_holds_on_heldout_bags_and_loads(tmp_path: Path) -> None:
    """Acceptance 4: calibrated on 100 toy demonstrations, at most alpha + 0.05 false alarms on 100 held-out ones;
    the node started with the file reports that threshold on every goal."""
    pytest.importorskip("trajectory_ensemble_msgs")
    calibration = bags.make_demo_bag(tmp_path / "calibration", range(300, 300 + SCENES), reference=True).path
    heldout = bags.make_demo_bag(tmp_path / "heldout", range(500, 500 + SCENES), reference=True).path
    few = bags.make_demo_bag(tmp_path / "few", range(700, 703), reference=True).path
    out = tmp_path / "uncertainty-bags.json"
    with ReplayNode(PARAMS, out=tmp_path / "node") as node:
        proc = _calibrate(node, tmp_path, "--bag", str(calibration), "--heldout-bag", str(heldout), "--alpha",
                          str(ALPHA), "--json", str(out))
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        too_few = _calibrate(node, tmp_path, "--bag", str(few), "--alpha", str(ALPHA), "--json",
                             str(tmp_path / "few.json"))
    assert too_few.returncode == 2
    assert "3 scored calibration goals give no finite threshold at alpha 0.1" in too_few.stderr, too_few.stderr
    result = json.loads(out.read_text())
    u = result["uncertainty"]
    assert u["calibration_goals"] == SCENES and u["heldout_goals"] == SCENES and u["source"] == "bags"
    assert sorted(result["scores"]["calibration"])[math.ceil((1 - ALPHA) * (SCENES + 1)) - 1] == u["threshold"]
    assert u["false_alarm_rate"] == sum(s > u["threshold"] for s in result["scores"]["heldout"]) / SCENES
    assert u["false_alarm_rate"] <= ALPHA + 0.05, u
    assert out.with_suffix(".md").read_text().count("false-alarm rate") == 1
    # The file the node's uncertainty_calibration_file loads, read by the node's own loader and by a node.
    loaded = load_uncertainty_threshold(SimpleNamespace(uncertainty_calibration_file=str(out), uncertainty_threshold=0))
    assert loaded == u["threshold"]
    with ReplayNode({**PARAMS, "uncertainty_calibration_file": str(out)}, out=tmp_path / "loaded") as node:
        run = node.replay(few, candidates=4)
    assert run.exit_status == 0, run.output
    for goal in run.summary["goals"]:
        assert goal["metrics"]["uncertainty_threshold"] == pytest.approx(u["threshold"], abs=5e-4)
        assert goal["metrics"]["uncertain"] in ("true", "false")
