"""``trajectory-ensemble bench --quality`` end to end on the shipped toy policy: the declared JSON, table and plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_bench_quality_cli_writes_the_declared_json_table_and_plot(tmp_path):
    out = tmp_path / "q.json"
    subprocess.run(
        [sys.executable, "-m", "trajectory_ensemble_node.cli", "bench", "--quality", "--scenes", "2", "--scene-seed",
         "7", "--ns", "1,2", "--json", str(out)],
        check=True, capture_output=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    quality = json.loads(out.read_text())["quality"]
    assert {"single", "mean", "medoid", "mode"} <= set(quality)
    for reducer, by_n in quality.items():
        assert set(by_n) == {"1", "2"}, reducer  # N is a string key
        for metrics in by_n.values():
            assert 0.0 <= metrics["collision_rate"] <= 1.0 and metrics["final_error"] >= 0.0
            low, high = metrics["collision_rate_ci95"]
            # Wilson bounds at a rate of exactly 0 or 1 may cross it by a rounding error.
            assert low - 1e-9 <= metrics["collision_rate"] <= high + 1e-9
    # N=1 of every reducer is the single candidate.
    assert len({by_n["1"]["final_error"] for by_n in quality.values()}) == 1
    assert out.with_suffix(".md").is_file() and out.with_suffix(".png").is_file()
