"""The open-loop error of a PushT checkpoint against holding the agent still, on the committed test bag."""

from __future__ import annotations

import json

from trajectory_ensemble_lab.pusht.openloop import main
from trajectory_ensemble_lab.pusht.recording import TEST_BAG, read_demo_bag


def test_the_record_counts_every_asked_frame_and_the_baseline_is_the_experts_own_distance(checkpoint, tmp_path):
    out = tmp_path / "openloop.json"
    assert main(["--policy", str(checkpoint), "--bags", str(TEST_BAG), "--episodes", "1", "--every", "40",
                 "--steps", "2", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    episodes = read_demo_bag(TEST_BAG)
    assert record["train"]["chunks"] == sum(len(range(0, len(e.actions), 40)) for e in episodes)
    assert "validation" not in record and record["settings"]["rows"] == 8 and record["commit"]
    # Holding still: the mean distance from the agent to the expert's next 8 targets, recomputed here.
    import numpy as np

    from trajectory_ensemble_lab.pusht.train import chunk_at

    hold = [float(np.linalg.norm(e.agent[t][None] - chunk_at(e.actions, t)[:8], axis=1).mean())
            for e in episodes for t in range(0, len(e.actions), 40)]
    assert record["train"]["hold_still_px_median"] == np.median(hold)
    assert record["train"]["error_px_median"] > 0


def test_bad_counts_are_refused(checkpoint, capsys):
    assert main(["--policy", str(checkpoint), "--bags", str(TEST_BAG), "--every", "0"]) == 2
    assert "--candidates must be >= 1, got 10, 0 and 1" in capsys.readouterr().err


def test_a_folder_without_bags_and_a_checkpoint_without_statistics_are_named_before_anything_loads(checkpoint, tmp_path,
                                                                                                  capsys):
    assert main(["--policy", str(checkpoint), "--bags", str(TEST_BAG), "--heldout-bags", str(tmp_path)]) == 2
    assert f"error: no demonstration bag (a folder with metadata.yaml) at {str(tmp_path)!r}" in capsys.readouterr().err
    assert main(["--policy", str(tmp_path), "--bags", str(TEST_BAG)]) == 2
    assert "no action_stats.json" in capsys.readouterr().err


def test_with_several_candidates_the_chunk_is_their_mean_and_the_record_says_so(checkpoint, tmp_path):
    out = tmp_path / "openloop.json"
    assert main(["--policy", str(checkpoint), "--bags", str(TEST_BAG), "--episodes", "1", "--every", "80",
                 "--steps", "2", "--candidates", "3", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert (record["settings"]["candidates"], record["settings"]["reducer"]) == (3, "mean")
    assert main(["--policy", str(checkpoint), "--bags", str(TEST_BAG), "--candidates", "0"]) == 2
