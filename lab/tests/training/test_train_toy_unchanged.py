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
    history = json.loads((tmp_path / "work" / "summary.json").read_text())["loss_history"]
    assert [row["step"] for row in history] == [row["step"] for row in BEFORE_THE_MOVE]
    for row, expected in zip(history, BEFORE_THE_MOVE):
        for key in ("loss", "action", "vision"):
            assert row[key] == pytest.approx(expected[key], rel=1e-4), (row["step"], key)
    assert (tmp_path / "out" / "transformer" / "diffusion_pytorch_model.safetensors").is_file()
