"""``bench --config nano --dry-shapes``: Cosmos3-Nano's transformer shape on the meta device, nothing allocated."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from trajectory_ensemble_lab.bench.nano import build_nano_transformer, nano_transformer_kwargs

REPO = Path(__file__).resolve().parents[2]


def test_dry_shapes_prints_the_nano_shape_and_its_parameter_count():
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "trajectory_ensemble_node.cli", "bench", "--config", "nano",
                           "--dry-shapes"], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    match = re.fullmatch(r"parameters: (\d+)", lines[-1])
    assert match, lines[-1]
    printed = int(match.group(1))
    assert "hidden 4096, layers 36, heads 32, kv heads 8, head_dim 128, intermediate 12288" in done.stdout

    transformer = build_nano_transformer("meta")
    assert all(p.device.type == "meta" for p in transformer.parameters())
    assert printed == sum(p.numel() for p in transformer.parameters())
    # Cosmos3-Nano is "about 16B parameters in both towers" (design.md): same order of magnitude, and bf16 weights.
    assert 14e9 < printed < 17e9
    assert {p.dtype for name, p in transformer.named_parameters() if not name.startswith("time_embedder")} == {
        torch.bfloat16}


def test_the_nano_shape_is_the_diffusers_class_default_plus_the_action_head():
    kwargs = nano_transformer_kwargs()
    assert (kwargs["hidden_size"], kwargs["num_hidden_layers"], kwargs["num_attention_heads"],
            kwargs["num_key_value_heads"], kwargs["head_dim"], kwargs["intermediate_size"]) == (4096, 36, 32, 8, 128,
                                                                                                 12288)
    assert kwargs["action_gen"] is True and kwargs["action_dim"] == 64 and kwargs["latent_channel"] == 48
