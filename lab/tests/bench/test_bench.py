"""Smoke tests of the benchmark machinery on the tiny config (not of speed: speed is what `make bench` measures)."""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from trajectory_ensemble_lab.bench import cli
from trajectory_ensemble_lab.bench.memory import MemoryCase, run_cpu_case
from trajectory_ensemble_lab.bench.workload import PipelineSource, Workload

STEPS = 2
CHUNK = 8


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_follow_the_spec_and_the_device():
    args = parse()
    assert args.ns == (1, 2, 4, 8, 10) and args.reps == 5 and args.chunk == 16 and args.tier == 256
    assert args.out == Path("out/bench") and args.guidance > 1.0
    assert (args.scenes, args.scene_seed, args.json) == (50, 0, None)
    settings = cli.resolve_settings(parse("--device", "cpu"))
    assert settings.source.config == "bench" and settings.dtypes == ("fp32",)
    assert settings.workload.steps == cli.CPU_STEPS and settings.threads == 1
    assert settings.topologies == ("fused", "separate") and settings.memory_steps == 1
    assert cli.resolve_settings(parse("--device", "cpu", "--steps", "10", "--ns", "8,1,8")).ns == (1, 8)
    with pytest.raises(SystemExit):
        parse("--ns", "0,2")


@pytest.mark.parametrize("flag, module", [("--quality", "trajectory_ensemble_lab.toy.quality"),
                                          ("--ros", "trajectory_ensemble_lab.bench.ros_overhead"),
                                          ("--clock-rate", "trajectory_ensemble_lab.bench.clock_rate")])
def test_delegated_modes_dispatch_or_say_what_is_missing(monkeypatch, capsys, flag, module):
    args = parse(flag, "--scenes", "3", "--scene-seed", "7", "--json", "q.json")
    monkeypatch.setitem(sys.modules, module, None)  # "not in this checkout yet"
    assert cli.run(args) == 2
    assert module in capsys.readouterr().err

    seen = []
    fake = types.ModuleType(module)
    fake.run = lambda a: seen.append(a) or 0
    monkeypatch.setitem(sys.modules, module, fake)
    assert cli.run(args) == 0
    (passed,) = seen
    assert (passed.scenes, passed.scene_seed, passed.json) == (3, 7, Path("q.json"))
    # Knobs the user did not set stay out, so the module's own defaults apply.
    assert not hasattr(passed, "steps") and not hasattr(passed, "threads") and not hasattr(passed, "ns")
    assert cli.run(parse(flag, "--steps", "6", "--ns", "2,1")) == 0
    assert (seen[-1].steps, seen[-1].ns) == (6, "1,2")


def test_bench_closed_loop_ros_dispatches_to_the_sim_with_three_scenes_unless_told(monkeypatch):
    from trajectory_ensemble_lab.bench import closed_loop_ros

    seen: list[argparse.Namespace] = []
    monkeypatch.setattr(closed_loop_ros, "run", lambda a: seen.append(a) or 0)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.run(parser.parse_args(["--closed-loop", "--ros"])) == 0
    assert cli.run(parser.parse_args(["--closed-loop", "--ros", "--scenes", "5"])) == 0
    assert [a.scenes for a in seen] == [cli.CLOSED_LOOP_ROS_SCENES, 5]
    with pytest.raises(SystemExit, match="separate runs"):
        cli.run(parser.parse_args(["--closed-loop", "--quality"]))


@pytest.fixture(scope="module")
def document(tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("bench")
    args = parse("--config", "tiny", "--device", "cpu", "--steps", str(STEPS), "--chunk", str(CHUNK), "--reps", "1",
                 "--ns", "1,3", "--memory", "skip", "--out", str(out), "--quiet")
    assert cli.run(args) == 0
    (path,) = out.glob("*.json")
    return json.loads(path.read_text()), out


def test_outputs_are_written_and_named_after_model_and_device(document):
    doc, out = document
    stems = {p.stem for p in out.iterdir()}
    assert stems == {"tiny_cpu-{}core".format(doc["machine"]["logical_cores"])}
    assert {p.suffix for p in out.iterdir()} == {".json", ".md", ".png"}
    for key in ("settings", "machine", "versions", "method", "headline", "variants", "wall_time_s"):
        assert key in doc
    for key in ("cpu_model", "logical_cores", "ram_bytes", "gpu", "torch_threads", "load_average_start"):
        assert key in doc["machine"]
    for key in ("torch", "diffusers", "transformers", "python"):
        assert doc["versions"][key]
    table = next(out.glob("*.md")).read_text()
    assert "fused / sequential" in table and "bitwise" in table


def test_forward_counts_parity_and_ratios(document):
    doc, _ = document
    (variant,) = doc["variants"]
    cases = {(c["path"], c["topology"], c["n"]): c for c in variant["cases"]}
    assert len(cases) == 2 * 3
    for n in (1, 3):
        # Counted with a pre-hook on the upstream transformer: N calls x steps x 2 CFG branches.
        assert cases[("sequential", None, n)]["physical_forwards"] == n * STEPS * 2
        assert cases[("batched", "fused", n)]["physical_forwards"] == STEPS
        assert cases[("batched", "separate", n)]["physical_forwards"] == 2 * STEPS
        for topo in ("fused", "separate"):
            case = cases[("batched", topo, n)]
            assert case["parity"]["within_rule"] and case["parity"]["deterministic"]
            assert case["ratio_vs_sequential"]["median"] > 0
            assert case["encode_ms"]["median"] > 0 and case["reduce_ms"]["median"] >= 0
        assert cases[("sequential", None, n)]["encode_ms"]["median"] > 0
    # A lone candidate with separate CFG branches has exactly upstream's row counts: bitwise equal.
    assert cases[("batched", "separate", 1)]["parity"]["bitwise"]
    headline = doc["headline"]["fp32"]
    assert headline["fused_forwards_equal_steps_all_n"] and headline["parity_within_rule_all"]
    assert set(headline["n1"]) == {"fused", "separate"} and headline["n1"]["separate"]["bitwise"]
    assert variant["upstream_deterministic"] and variant["upstream_grad_enabled"] is False


def test_work_counts_the_attention_each_path_is_shaped_to_do(document):
    from trajectory_ensemble_node.models.cosmos3 import CONFIGS

    doc, out = document
    (variant,) = doc["variants"]
    cases = {(c["path"], c["topology"], c["n"]): c for c in variant["cases"]}
    config, tokens = CONFIGS["tiny"], variant["model"]["tokens"]
    prefixes, block = (tokens["prefix_cond"], tokens["prefix_uncond"]), tokens["generation_block"]

    def scores(queries: int, keys: int) -> int:  # forward FLOPs of q k^T and p v over that many pairs
        return 2 * config.num_heads * queries * keys * 2 * config.head_dim

    causal = sum(scores(1, p * (p + 1) // 2) for p in prefixes)
    full = sum(scores(block, p + block) for p in prefixes)
    # The VAE's mid-block attention runs once per latent frame it encodes: upstream encodes the chunk + 1 frame
    # clip (1 + chunk / 4 latent frames), the batched path the conditioning frame alone (one).
    clip_latent_frames = 1 + CHUNK // 4
    # Upstream: every step runs each branch's prefix causally and its generation tokens over prefix + block.
    one_call = cases[("sequential", None, 1)]["work"]["gflop"]
    upstream_vae = one_call["attention"] * 1e9 - config.num_layers * STEPS * (causal + full)
    for n in (1, 3):
        sequential = cases[("sequential", None, n)]["work"]["gflop"]
        assert sequential["total"] == pytest.approx(n * one_call["total"])
        for topo in ("fused", "separate"):
            work = cases[("batched", topo, n)]["work"]
            # Cold group: the prefixes once, then each candidate attends to its own prefix and its own block only.
            batched_vae = work["gflop"]["attention"] * 1e9 - config.num_layers * (causal + STEPS * n * full)
            assert batched_vae > 0
            assert upstream_vae == pytest.approx(clip_latent_frames * batched_vae, rel=1e-6)
            # One conditioning frame per group instead of chunk + 1 frames per call.
            assert 0 < work["gflop"]["conv"] < one_call["conv"]
            assert work["gflop"]["conv"] == pytest.approx(cases[("batched", topo, 1)]["work"]["gflop"]["conv"])
            assert work["gflop"]["gemm"] > 0
            assert work["ratio_vs_sequential"] == pytest.approx(work["gflop"]["total"] / sequential["total"])
            assert work["ratio_vs_sequential"] < 1
    assert doc["headline"]["fp32"]["n1"]["fused"]["work_ratio"] == pytest.approx(
        cases[("batched", "fused", 1)]["work"]["ratio_vs_sequential"], abs=1e-4)
    assert "work ratio (fused / separate)" in next(out.glob("*.md")).read_text()


def test_cold_instruction_recomputes_the_text_warm_reuses_it_and_both_stay_bitwise(document):
    from trajectory_ensemble_lab.bench.workload import BatchedRunner

    assert parse().prompt_cache == "cold" and document[0]["settings"]["prompt_cache"] == "cold"
    results = {}
    for mode in ("cold", "warm"):
        workload = Workload(steps=STEPS, chunk=CHUNK, tier=256, guidance=3.0, prompt_cache=mode)
        pipe = PipelineSource("tiny").build(torch.float32, torch.device("cpu"))
        runner = BatchedRunner(pipe, workload, "separate", max_count=1)
        calls = [runner.call(1) for _ in range(3)]
        results[mode] = (runner.model.adapter.prefix_cache.adopted, [c.result.candidates for c in calls])
    assert results["cold"][0] == 0  # a new instruction every group: the text runs every time
    assert results["warm"][0] == 2 * 2  # groups 2 and 3 reuse both CFG branches' prefixes
    for cold, warm in zip(results["cold"][1], results["warm"][1]):
        assert torch.equal(cold, warm)


def test_memory_case_runs_in_a_fresh_process_that_does_not_inherit_our_high_water_mark():
    # Grow this process's RSS well past what the tiny child needs, so an inherited ru_maxrss would show.
    ballast = torch.ones(300 * 2**20 // 4)
    workload = Workload(steps=1, chunk=CHUNK, tier=256, guidance=3.0)
    figures = run_cpu_case(MemoryCase("batched", (2,), "fused"), source=PipelineSource("tiny"), dtype="fp32",
                           workload=workload, steps=1, threads=1)
    peak, hwm = figures["peak_rss_bytes"][2], figures["peak_vmhwm_bytes"][2]
    assert 0 < figures["baseline_rss_bytes"] <= peak
    # ru_maxrss of the child equals its own VmHWM: nothing was carried over from the parent.
    assert abs(peak - hwm) <= 0.05 * hwm
    del ballast


def test_replot_rebuilds_table_and_plot_from_the_json_alone(document, tmp_path):
    doc, out = document
    (source,) = out.glob("*.json")
    copy = tmp_path / source.name
    copy.write_text(source.read_text())
    assert cli.run(parse("--replot", str(copy))) == 0
    assert copy.with_suffix(".md").read_text() == next(out.glob("*.md")).read_text()
    assert copy.with_suffix(".png").stat().st_size > 0
    assert json.loads(copy.read_text())["headline"] == doc["headline"]


@pytest.mark.ros
def test_ros_floor_server_answers_the_bench_client_with_its_work_time(ros_env):
    """The floor under bench --ros: a real server process, the bench's own client, total_ms = the work it did."""
    import subprocess

    from trajectory_ensemble_lab.bench import ros_overhead
    from trajectory_ensemble_lab.bench.ros_floor import FLOOR_NAMESPACE

    server = subprocess.Popen([sys.executable, "-m", "trajectory_ensemble_lab.bench.ros_floor", "--work-ms", "40"],
                              env=ros_env, stdout=subprocess.DEVNULL, start_new_session=True)
    client = None
    try:
        client = ros_overhead._Client(floor_namespace=FLOOR_NAMESPACE)
        assert client.spin_until(client.floor.server_is_ready, 60), "the floor server never came up"
        rows = [ros_overhead._timed_goal(client, seed=i, floor=True) for i in range(3)]
    finally:
        if client is not None:
            client.close()
        server.terminate()
        server.wait(timeout=30)
    for row in rows:
        assert 40.0 <= row["engine_total_ms"] < 1000.0  # the work it reports, not a made-up figure
        assert row["latency_ms"] > row["engine_total_ms"]
        assert 0.0 < row["overhead_ms"] < 1000.0 and row["accept_ms"] < row["latency_ms"]
    assert client.executor_name in ("EventsExecutor", "SingleThreadedExecutor")
    assert server.returncode == 0  # SIGTERM ends it cleanly


def test_row_blocks_flag_reaches_the_engine_and_the_json(document):
    from trajectory_ensemble_lab.bench.workload import BatchedRunner

    doc = document[0]
    assert cli.resolve_settings(parse("--device", "cpu")).workload.row_blocks == "auto"
    assert doc["settings"]["row_blocks"] == "auto"
    assert doc["variants"][0]["model"]["row_block_rows"] == 256  # the CPU default
    off = cli.resolve_settings(parse("--device", "cpu", "--row-blocks", "off")).workload
    runner = BatchedRunner(PipelineSource("tiny").build(torch.float32, torch.device("cpu")), off, "fused", 2)
    assert runner.model.adapter.row_block_rows is None


def test_bf16_parity_is_also_measured_against_the_drift_bf16_puts_on_upstream(tmp_path):
    assert parse("--dtype", "fp32,bf16").dtype == ("fp32", "bf16")
    with pytest.raises(SystemExit):
        parse("--dtype", "fp16")
    args = parse("--config", "tiny", "--device", "cpu", "--dtype", "fp32,bf16", "--steps", str(STEPS), "--chunk",
                 str(CHUNK), "--reps", "1", "--ns", "1,2", "--memory", "skip", "--out", str(tmp_path), "--quiet")
    assert cli.run(args) == 0
    (path,) = tmp_path.glob("*.json")
    doc = json.loads(path.read_text())
    fp32, bf16 = doc["variants"]
    assert (fp32["dtype"], bf16["dtype"]) == ("fp32", "bf16")
    for case in fp32["cases"]:
        assert case["parity"] is None or case["parity"]["dtype_drift"] is None
    drifts = {}
    for case in (c for c in bf16["cases"] if c["path"] == "batched"):
        parity = case["parity"]
        # Rounding to bf16 moves upstream's own result: the yardstick is a real, non-zero distance.
        assert parity["dtype_drift"] > 0
        assert parity["within_dtype_drift"] == (parity["max_abs_diff"] <= parity["dtype_drift"])
        drifts.setdefault(case["n"], set()).add(parity["dtype_drift"])
    # Same seeds, same reference: both topologies are measured against one drift per N, growing with N's seeds.
    assert all(len(v) == 1 for v in drifts.values()) and drifts[1].pop() <= drifts[2].pop()
    assert doc["headline"]["fp32"]["parity_within_dtype_drift_all"] is None
    assert isinstance(doc["headline"]["bf16"]["parity_within_dtype_drift_all"], bool)
    table = path.with_suffix(".md").read_text()
    assert "upstream bf16 vs upstream fp32 (dtype drift)" in table and "fused within dtype drift" in table
    # A JSON that carries drift re-renders to the same table.
    copy = tmp_path / "copy" / path.name
    copy.parent.mkdir()
    copy.write_text(path.read_text())
    assert cli.run(parse("--replot", str(copy))) == 0
    assert copy.with_suffix(".md").read_text() == table
