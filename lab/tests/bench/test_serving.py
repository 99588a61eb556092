"""The serving benchmark (``bench --step-capture ...``): one shared pipeline, latency per N and mode, TFLOP/s."""

from __future__ import annotations

import argparse
import json

import pytest

from trajectory_ensemble_lab.bench import cli
from trajectory_ensemble_lab.bench.serving import peak_for_name


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.mark.slow
def test_the_serving_run_writes_latency_work_and_parity_per_n_and_mode(tmp_path):
    args = parse("--config", "tiny", "--device", "cpu", "--step-capture", "off", "--ns", "1,2", "--steps", "1",
                 "--reps", "1", "--chunk", "4", "--memory", "skip", "--out", str(tmp_path), "--quiet")
    assert cli.run(args) == 0
    (path,) = tmp_path.glob("tiny_cpu-*.json")
    document = json.loads(path.read_text())
    assert document["settings"]["step_capture"] == ["off"] and document["failed_modes"] == {}
    for n in (1, 2):
        sequential, batched = document["cases"][f"sequential/-/{n}"], document["cases"][f"batched/off/{n}"]
        assert sequential["physical_forwards"] == 2 * n  # two CFG branches, one step, n upstream calls
        assert batched["ratio_vs_eager"]["median"] == 1.0
        assert batched["parity_vs_upstream"]["within_rule"]
        # Work counted once per group; TFLOP/s is that work over the median latency.
        assert batched["gflop"] > 0 and batched["tflops"] == pytest.approx(
            batched["gflop"] / 1e3 / batched["latency_s"]["median"])
    assert document["model"]["transformer_parameters"] > 0
    assert document["headline"]["peak_tflops_bf16_dense"] is None  # fp32 on a CPU: no bf16 peak to compare with
    table = path.with_suffix(".md").read_text()
    assert "| 2 | batched | off |" in table and path.with_suffix(".png").stat().st_size > 0


def test_known_chips_report_their_dense_bf16_peak_and_unknown_ones_none():
    assert peak_for_name("NVIDIA H200") == 989.0
    assert peak_for_name("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_for_name("NVIDIA H100 PCIe") == 756.0
    assert peak_for_name("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_for_name("Some Future Accelerator") is None


def test_step_capture_flag_refuses_unknown_modes():
    with pytest.raises(SystemExit):
        parse("--step-capture", "off,graphs")
