"""``bench --closed-loop`` on one held-out scene: the JSON a user reads, its names, shapes and ranges."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from trajectory_ensemble_lab.bench import cli
from trajectory_ensemble_lab.toy.closed_loop import METHODS, main, method_table

NAMES = ("sync", "naive_async", "temporal_ensemble", "weighted_average", "bid", "guided", "guided_mode", "rtc_vjp")
METRICS = ("success_rate", "collision_rate", "mode_flips_per_episode", "seam_jump_mean", "seam_jump_max", "jerk",
           "steps_to_target")


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("closed_loop") / "cl.json"
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--closed-loop", "--scenes", "1", "--scene-seed", "3", "--delays", "0,2", "--json", str(out)]
    assert cli.run(parser.parse_args(argv)) == 0
    return out, json.loads(out.read_text())


def test_every_method_and_delay_has_every_metric_in_range(result):
    _, document = result
    closed = document["closed_loop"]
    assert tuple(closed) == NAMES == tuple(METHODS)
    for name in NAMES:
        assert set(closed[name]) == {"0", "2"}
        for delay, entry in closed[name].items():
            for rate in ("success_rate", "collision_rate"):
                assert 0.0 <= entry[rate] <= 1.0
                low, high = entry[f"{rate}_ci95"]
                assert 0.0 <= low <= entry[rate] <= high <= 1.0
            assert entry["success_rate"] + entry["collision_rate"] <= 1.0
            assert entry["mode_flips_per_episode"] >= 0
            assert 0.0 <= entry["seam_jump_mean"] <= entry["seam_jump_max"] < 3.0
            assert entry["jerk"] >= 0 and math.isfinite(entry["jerk"])
            if entry["steps_to_target"] is not None:
                assert 1 <= entry["steps_to_target"] <= document["settings"]["step_budget"]
            for metric in METRICS:
                assert metric in entry


def test_settings_say_how_it_was_run_and_outputs_exist(result):
    out, document = result
    settings = document["settings"]
    assert settings["s"] == 4 and settings["delays"] == [0, 2] and settings["scenes"] == 1
    assert settings["date"] and settings["commit"]
    assert out.with_suffix(".md").read_text().count("| guided_mode |") == 2
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_guidance_joins_chunks_more_smoothly_than_naive_switching(result):
    # With d = 2 the naive switch jumps to a chunk planned from a 2-step-old state; guidance makes its frozen
    # actions the executed ones, so its seams are smaller on every scene.
    _, document = result
    closed = document["closed_loop"]
    assert closed["guided"]["2"]["seam_jump_mean"] < closed["naive_async"]["2"]["seam_jump_mean"]


def test_bench_model_selects_the_toy_pipeline_the_toy_modes_evaluate():
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    for mode in ("--closed-loop", "--quality"):
        delegated = cli.delegated_args(parser.parse_args([mode, "--model", "out/my_toy_finetune"]))
        assert str(delegated.pipeline) == "out/my_toy_finetune"
    assert not hasattr(cli.delegated_args(parser.parse_args(["--closed-loop"])), "pipeline")


def test_context_guidance_mask_serves_only_the_gradient_free_methods_with_the_mask():
    prefix, mask = method_table("prefix"), method_table("mask")
    assert {name for name, m in mask.items() if m.guidance == "mask"} == {"guided", "guided_mode", "guided_bid",
                                                                          "guided_mask"}
    assert prefix["guided_mode"].guidance == "prefix" and mask["rtc_vjp"].guidance == "vjp"
    assert mask["bid"].guidance == "none" and mask["sync"].guidance is None
    assert all(mask[name].count == prefix[name].count and mask[name].reducer == prefix[name].reducer
               for name in prefix)
    with pytest.raises(ValueError, match="got 'vjp'"):
        method_table("vjp")
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    delegated = cli.delegated_args(parser.parse_args(["--closed-loop", "--context-guidance", "mask"]))
    assert delegated.context_guidance == "mask"


def test_merge_joins_disjoint_runs_and_refuses_mismatched_or_overlapping_ones(result, tmp_path):
    out, document = result
    later = json.loads(json.dumps(document))
    later["settings"]["scene_seeds"] = [seed + 1 for seed in document["settings"]["scene_seeds"]]
    later["settings"]["commit"] = "abc1234"
    (tmp_path / "later.json").write_text(json.dumps(later))
    merged = tmp_path / "merged.json"
    assert main(["--merge", str(out), str(tmp_path / "later.json"), "--json", str(merged)]) == 0
    combined = json.loads(merged.read_text())
    assert combined["settings"]["scenes"] == 2
    # Both runs' code is named, in the report too.
    assert combined["settings"]["commit"] == f"{document['settings']['commit']}, abc1234"
    assert f"at commit {document['settings']['commit']}, abc1234" in merged.with_suffix(".md").read_text()
    # A merged result merges again: its ranges carry over, and an overlap with any of them is refused.
    third = json.loads(json.dumps(document))
    third["settings"]["scene_seeds"] = [seed + 2 for seed in document["settings"]["scene_seeds"]]
    (tmp_path / "third.json").write_text(json.dumps(third))
    again = tmp_path / "again.json"
    assert main(["--merge", str(merged), str(tmp_path / "third.json"), "--json", str(again)]) == 0
    seeds = document["settings"]["scene_seeds"]
    assert json.loads(again.read_text())["settings"]["scene_seeds"] == [seeds, [s + 1 for s in seeds],
                                                                          [s + 2 for s in seeds]]
    with pytest.raises(SystemExit, match="their held-out scenes overlap"):
        main(["--merge", str(merged), str(tmp_path / "later.json"), "--json", str(tmp_path / "z.json")])
    assert len(combined["episodes"]["guided_mode"]["2"]) == 2
    other = json.loads(json.dumps(later))
    other["settings"]["context_guidance"] = "mask"
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="context_guidance 'mask' != 'prefix'"):
        main(["--merge", str(out), str(tmp_path / "other.json"), "--json", str(tmp_path / "x.json")])
    with pytest.raises(SystemExit, match="their held-out scenes overlap"):
        main(["--merge", str(out), str(out), "--json", str(tmp_path / "y.json")])
