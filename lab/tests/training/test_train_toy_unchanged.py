"""``train-toy`` after the trainer moved into ``trajectory_ensemble_lab.training``: the same flags give the same run.

The expected loss log was printed by ``train-toy`` at f2bba3b, before the move, with these exact flags (every toy
augmentation on, so the order of every random draw is covered). The refactor reproduced it bit for bit here, and
the weights too; the tolerance only leaves room for another CPU's kernels.
"""

from __future__ import annotations

import argparse
import json

import pytest

from trajectory_ensemble_node.toy import toy_pipeline_dir
from trajectory_ensemble_lab.toy import train as toy_train
from trajectory_ensemble_lab.toy.pipeline import TOY_CONFIG
from trajectory_ensemble_lab.training.fit import write_summary

FLAGS = ["--scenes", "2", "--steps", "8", "--batch", "4", "--log-every", "2", "--checkpoint-every", "0",
         "--save-dtype", "float32", "--closed-loop-states", "1", "--bimodal-share", "0.5", "--prefix-conditioning",
         "0.5", "--prefix-offset", "0.05", "--demo-drift", "0.05", "--demo-speed", "0.2", "--seed", "4"]

BEFORE_THE_MOVE = [
    {"step": 2, "loss": 0.1324867643415928, "action": 0.10864165797829628, "vision": 0.23845109343528748},
    {"step": 4, "loss": 0.4998861998319626, "action": 0.26358263194561005, "vision": 2.3630356788635254},
    {"step": 6, "loss": 0.5322099030017853, "action": 0.39148397743701935, "vision": 1.4072592556476593},
    {"step": 8, "loss": 0.4445703625679016, "action": 0.40862829983234406, "vision": 0.3594207167625427},
]


def test_a_short_train_toy_run_logs_the_losses_it_logged_before_the_trainer_was_shared(tmp_path):
    parser = argparse.ArgumentParser()
    toy_train.add_arguments(parser)
    args = parser.parse_args(["--init", str(toy_pipeline_dir()), *FLAGS, "--work-dir", str(tmp_path / "work"),
                              "--out", str(tmp_path / "out")])
    assert toy_train.run(args) == 0
    summary = json.loads((tmp_path / "work" / "summary.json").read_text())
    history = summary["loss_history"]
    assert summary["config"]["hidden_size"] == TOY_CONFIG.hidden_size and summary["args"]["seed"] == "4"
    assert {"train_seconds", "encode_seconds", "wall_seconds", "saved_bytes", "torch"} <= set(summary)
    assert [row["step"] for row in history] == [row["step"] for row in BEFORE_THE_MOVE]
    for row, expected in zip(history, BEFORE_THE_MOVE):
        for key in ("loss", "action", "vision"):
            assert row[key] == pytest.approx(expected[key], rel=1e-4), (row["step"], key)
    assert (tmp_path / "out" / "transformer" / "diffusion_pytorch_model.safetensors").is_file()


def test_a_run_whose_final_loss_is_not_finite_exits_1_with_its_summary_written(tmp_path, capsys):
    args = argparse.Namespace(steps=2, _private="left out")
    result = {"loss_history": [{"step": 1, "loss": 0.5}, {"step": 2, "loss": float("nan")}], "saved_bytes": 2_000_000,
              "train_seconds": 1.5}
    assert write_summary(tmp_path, tmp_path / "out", TOY_CONFIG, args, result, 0.25, 3.0, data="two scenes") == 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["args"] == {"steps": "2"} and summary["data"] == "two scenes" and summary["train_seconds"] == 1.5
    assert "extra" not in summary["config"] and summary["wall_seconds"] == 3.0
    assert "(2.00 MB) after 0.1 min; final loss nan" in capsys.readouterr().out
    result["loss_history"][-1]["loss"] = 0.25
    assert write_summary(tmp_path, tmp_path / "out", TOY_CONFIG, args, result, 0.25, 3.0) == 0
