"""Held-out shards of ``bench --pusht`` merged from their episodes, paired comparisons, and the docs table."""

from __future__ import annotations

import json

import pytest

from trajectory_ensemble_lab.pusht.bench import summarize
from trajectory_ensemble_lab.pusht.bench_records import BenchEpisode
from trajectory_ensemble_lab.pusht.bench_table import agreement, main, merge, paired


def _shard(first: int, coverage: dict[str, list[float]]) -> dict:
    pusht = {}
    for name, values in coverage.items():
        episodes = [BenchEpisode(first + i, steps=100, max_coverage=c, success=c > 0.95, group_ms=[50.0])
                    for i, c in enumerate(values)]
        pusht[name] = summarize(episodes)
    return {"pusht": pusht, "settings": {"seed": first, "episodes": len(next(iter(coverage.values()))), "count": 8},
            "latency": {"per_count": {}}, "date": "2026-12-04T00:00:00Z", "commit": "abc"}


def test_shards_merge_into_the_figures_of_one_run_over_all_their_starts():
    a = _shard(200000, {"single": [0.5, 0.97], "mode": [0.96, 0.97]})
    b = _shard(200002, {"single": [0.2, 0.99], "mode": [0.1, 0.99]})
    merged = merge([a, b])
    whole = _shard(200000, {"single": [0.5, 0.97, 0.2, 0.99], "mode": [0.96, 0.97, 0.1, 0.99]})
    for name in ("single", "mode"):
        assert merged["pusht"][name] == whole["pusht"][name]
    assert merged["settings"]["seed"] == 200000 and merged["settings"]["episodes"] == 4
    assert [s["seed"] for s in merged["settings"]["shards"]] == [200000, 200002]


def test_shards_that_share_a_start_or_differ_in_methods_are_refused():
    a = _shard(200000, {"single": [0.5, 0.97]})
    with pytest.raises(ValueError, match=r"share starts for 'single': \[200000, 200001\]"):
        merge([a, a])
    with pytest.raises(ValueError, match="different methods"):
        merge([a, _shard(200002, {"mode": [0.1, 0.2]})])


def test_the_paired_difference_is_taken_start_by_start():
    doc = _shard(200000, {"single": [0.5, 0.97, 0.2, 0.99], "mode": [0.96, 0.97, 0.1, 0.99]})
    p = paired(doc["pusht"]["single"], doc["pusht"]["mode"])
    assert p["starts"] == 4
    assert p["coverage_diff_mean"] == pytest.approx((0.46 + 0.0 - 0.1 + 0.0) / 4)
    assert p["success_diff"] == pytest.approx(0.25) and (p["only_b_succeeded"], p["only_a_succeeded"]) == (1, 0)
    low, high = p["coverage_diff_ci95"]
    assert low <= p["coverage_diff_mean"] <= high


def test_the_command_writes_the_merged_record_and_the_table(tmp_path, capsys):
    paths = []
    for first, cov in ((200000, {"single": [0.5, 0.97], "mean": [0.4, 0.3], "mode": [0.96, 0.97]}),
                       (200002, {"single": [0.2, 0.99], "mean": [0.1, 0.2], "mode": [0.1, 0.99]})):
        path = tmp_path / f"{first}.json"
        path.write_text(json.dumps(_shard(first, cov)))
        paths.append(str(path))
    assert main([*paths, "--json", str(tmp_path / "heldout.json")]) == 0
    record = json.loads((tmp_path / "heldout.json").read_text())
    assert set(record["paired_vs_single"]) == {"mean", "mode"} and record["pusht"]["mode"]["episodes"] == 4
    table = (tmp_path / "heldout.md").read_text()
    assert "| `mode`@8 | 0.755" in table and "| `single` | 0.665" in table and "LeRobot diffusion_pusht" in table
    # The file says which runs it holds: the starts, and each shard's dates and commit.
    assert table.startswith("Starts 200000..200003 (4), N = 8,")
    assert "starts 200000..200001 ? to 2026-12-04T00:00:00Z, code of abc; starts 200002..200003" in table
    assert table == capsys.readouterr().out


def test_two_faces_that_played_the_same_episodes_agree_and_a_shifted_face_does_not():
    node = _shard(100000, {"single": [0.5, 0.2, 0.3, 0.1, 0.6, 0.4], "mode": [0.5, 0.2, 0.3, 0.1, 0.6, 0.4]})
    process = _shard(100000, {"single": [0.5, 0.2, 0.3, 0.1, 0.6, 0.4 + 1e-12], "mode": [0.9, 0.2, 0.3, 0.1, 0.6, 0.4],
                              "mean": [0.1] * 6})
    result = agreement(node, process)
    assert list(result["methods"]) == ["single", "mode"] and result["only_b"] == ["mean"] and not result["only_a"]
    single, mode = result["methods"]["single"], result["methods"]["mode"]
    assert (single["same_episodes"], single["starts"]) == (6, 6)  # 1e-12: an ulp of gym-pusht's coverage
    assert single["intervals_overlap"] and single["paired_holds_zero"]
    assert mode["same_episodes"] == 5 and mode["paired"]["coverage_diff_mean"] == pytest.approx(0.4 / 6)
    far = _shard(100000, {"single": [0.9, 0.8, 0.95, 0.85, 0.9, 0.8]})
    apart = agreement(node, far)["methods"]["single"]
    assert not apart["intervals_overlap"] and not apart["paired_holds_zero"] and apart["same_episodes"] == 0
    with pytest.raises(ValueError, match="share no method"):
        agreement(node, _shard(100000, {"median": [0.1]}))


def test_the_agree_command_writes_the_comparison_and_names_its_two_records(tmp_path, capsys):
    a, b = tmp_path / "node.json", tmp_path / "process.json"
    a.write_text(json.dumps(_shard(100000, {"mode": [0.5, 0.2]})))
    b.write_text(json.dumps(_shard(100000, {"mode": [0.5, 0.2]})))
    assert main(["--agree", str(a), str(b), "--json", str(tmp_path / "agree.json")]) == 0
    record = json.loads((tmp_path / "agree.json").read_text())
    assert (record["a"]["file"], record["b"]["file"]) == ("node.json", "process.json")
    assert record["methods"]["mode"]["same_episodes"] == 2
    assert "mode: 2/2 same episodes" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--agree", str(a), "--json", str(tmp_path / "x.json")])
    assert "exactly two records, got 1" in capsys.readouterr().err


def _continuity_shard(first: int, rows: dict[str, dict[str, list[tuple[float, list[float]]]]]) -> dict:
    """A shard with a ``single`` block and, per continuity method and delay, episodes of (max coverage, seams)."""
    shard = _shard(first, {"single": [c for c, _ in next(iter(next(iter(rows.values())).values()))]})
    shard["continuity"] = {name: {d: summarize([BenchEpisode(first + i, steps=100, max_coverage=c, success=c > 0.95,
                                                             seams=seams, group_ms=[50.0])
                                                for i, (c, seams) in enumerate(episodes)])
                                  for d, episodes in by_delay.items()}
                           for name, by_delay in rows.items()}
    return shard


def test_continuity_shards_merge_into_the_seam_ratio_and_the_paired_difference_against_naive_async(tmp_path, capsys):
    a = _continuity_shard(100000, {"naive_async": {"2": [(0.2, [80.0, 100.0]), (0.4, [90.0])]},
                                   "guided_mode": {"2": [(0.3, [8.0, 10.0]), (0.4, [9.0])]}})
    b = _continuity_shard(100002, {"naive_async": {"2": [(0.1, [90.0])]}, "guided_mode": {"2": [(0.1, [9.0])]}})
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, shard in zip(paths, (a, b)):
        path.write_text(json.dumps(shard))
    assert main([str(p) for p in paths] + ["--json", str(tmp_path / "c.json")]) == 0
    record = json.loads((tmp_path / "c.json").read_text())
    versus = record["continuity_vs_naive_async"]["guided_mode"]["2"]
    assert versus["starts"] == 3 and versus["coverage_diff_mean"] == pytest.approx(0.1 / 3)
    naive, guided = record["continuity"]["naive_async"]["2"], record["continuity"]["guided_mode"]["2"]
    assert versus["seam_ratio"] == pytest.approx(naive["seam_jump_mean"] / guided["seam_jump_mean"])
    assert versus["seam_ratio"] == pytest.approx(10.0)  # every guided seam is a tenth of naive_async's
    table = (tmp_path / "c.md").read_text()
    assert "| `guided_mode` | 2 | 0.267" in table and "| 10.0x |" in table
    assert "seam ratio" in capsys.readouterr().out
