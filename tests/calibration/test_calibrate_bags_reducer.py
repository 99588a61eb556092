"""``calibrate --bag`` recommends a reducer and a ``mode`` threshold (issue 60): every variant is compared with the
toy demonstrations' recorded actions on the candidates the node returned, chosen on the calibration bag and reported
on the held-out one, in the same JSON as the uncertainty threshold. Over DDS against the real node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trajectory_ensemble_node.reducers import parse_variants, reduce_variants
from trajectory_ensemble_node.replay import bags
from trajectory_ensemble_node.stats import bootstrap_mean
from trajectory_ensemble_node.testing import ReplayNode

pytestmark = [pytest.mark.ros, pytest.mark.slow]

PARAMS = {"device": "cpu", "num_inference_steps": 4, "candidate_count": 4}
VARIANTS = "single,mean,medoid,mode,mode@0.05,mode@0.2"


def _calibrate(node: ReplayNode, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trajectory_ensemble_node.cli", "calibrate", *args, "--count", "4", "--rate", "8",
         "--replay-out", str(tmp_path / "replays"), "--wait", "60", "--alpha", "0.1"],
        env=node.env, capture_output=True, text=True, timeout=900)


def test_calibrate_recommends_a_reducer_and_a_mode_threshold_with_heldout_figures(tmp_path: Path) -> None:
    pytest.importorskip("trajectory_ensemble_msgs")
    calibration = bags.make_demo_bag(tmp_path / "calibration", range(1300, 1312), reference=True).path
    heldout = bags.make_demo_bag(tmp_path / "heldout", range(1400, 1408), reference=True).path
    out = tmp_path / "bags.json"
    with ReplayNode(PARAMS, out=tmp_path / "node") as node:
        bad = _calibrate(node, tmp_path, "--bag", str(calibration), "--reducer-variants", "mode@wide", "--json",
                         str(tmp_path / "bad.json"))
        proc = _calibrate(node, tmp_path, "--bag", str(calibration), "--heldout-bag", str(heldout),
                          "--reducer-variants", VARIANTS, "--json", str(out))
    assert bad.returncode == 2 and "'wide' is not a number" in bad.stderr, bad.stderr[-2000:]
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["uncertainty"]["calibration_goals"] == 12  # the same record as the uncertainty threshold
    section = result["reducer"]
    table = section["variants"]
    assert list(table) == VARIANTS.split(",")
    for row in table.values():
        assert row["calibration"]["goals"] == 12 and row["heldout"]["goals"] == 8
        assert row["calibration"]["rmse"] > 0 and row["heldout"]["rmse"] > 0
        assert 1 <= row["calibration"]["served_rank"] <= 5 and 1 <= row["heldout"]["served_rank"] <= 5  # N = 4

    def key(label: str) -> tuple[float, float]:
        return table[label]["calibration"]["served_rank"], table[label]["calibration"]["rmse"]

    def pick(labels: list[str], default: str) -> str:
        ranks = {label: np.asarray(table[label]["calibration"]["ranks"]) for label in labels}
        better = [label for label in labels if label != default
                  and (ranks[label] - ranks[default]).mean() < 0
                  and bootstrap_mean(ranks[label] - ranks[default], seed=0)[1] < 0]
        return min(better, key=key) if better else default

    assert section["default"] == "mode"
    assert section["recommended"] == pick(list(table), "mode")
    assert section["heldout"] == table[section["recommended"]]["heldout"]
    best_mode = pick([label for label in table if table[label]["reducer"] == "mode"], "mode")
    assert section["mode_recommended"] == best_mode
    assert section["mode_threshold"] == (table[best_mode]["mode_threshold"] or 0.0)
    assert table["single"]["heldout"]["versus_single"] is None
    paired = table["mode"]["heldout"]["versus_single"]
    assert paired["goals"] == 8 and paired["ci95"][0] <= paired["mean_rank_difference"] <= paired["ci95"][1]
    assert paired["better"] + paired["worse"] <= 8
    assert "| `mode@0.05` |" in out.with_suffix(".md").read_text()
    # What is compared offline is what the node serves: its mode (the relative rule, the default) on the returned
    # candidates is the offline "mode" chunk.
    summary = json.loads((tmp_path / "replays" / "calibration-0" / "summary.json").read_text())
    goals = [g for g in summary["goals"] if g["status"] == "SUCCEEDED"]
    assert len(goals) == 12
    for goal in goals:
        candidates = torch.tensor(goal["candidates"], dtype=torch.float32)
        offline = reduce_variants(candidates, parse_variants("mode"))["mode"].numpy()
        np.testing.assert_allclose(np.asarray(goal["trajectory"]), offline, atol=1e-6)
