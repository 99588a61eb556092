"""Row-blocked decoder layers (``models/cosmos3/layers.py``): same candidates, one forward per step, smaller work."""

from __future__ import annotations

import pytest
import torch
from _cosmos3 import FPS, PROMPT, STEPS, candidate_spec, fresh_pipe, policy, upstream_action, within_rule

from trajectory_ensemble_node.errors import InvalidSpecError
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, layers
from trajectory_ensemble_node.models.cosmos3.attention import AttentionLayout, GenRun, PrefixSlot
from trajectory_ensemble_node.models.cosmos3.layers import RowBlockedDecoderLayer

BASE_SEED = 1234


def layout(*runs: tuple[int, int]) -> AttentionLayout:
    """Runs of ``(count, length)`` blocks, back to back, each on its own prefix."""
    gen_runs, start = [], 0
    for index, (count, length) in enumerate(runs):
        gen_runs.append(GenRun(prefix=index, start=start, count=count, length=length))
        start += count * length
    prefixes = tuple(PrefixSlot(key=index, und_range=None) for index in range(len(runs)))
    return AttentionLayout(prefixes=prefixes, gen_runs=tuple(gen_runs))


def test_row_blocks_are_cut_at_candidate_boundaries_and_merge_small_blocks():
    cfg_pair = layout((3, 416), (3, 416))  # fused CFG, N=3: cond blocks then uncond blocks
    assert cfg_pair.row_blocks(256) == tuple((i * 416, (i + 1) * 416) for i in range(6))
    # Small blocks merge until a range holds min_rows; the remainder is the last range.
    assert layout((5, 40)).row_blocks(100) == ((0, 120), (120, 200))
    # Ranges never split a block, and ranges of two runs may merge across the runs' boundary.
    assert layout((1, 30), (2, 50)).row_blocks(60) == ((0, 80), (80, 130))
    assert layout((2, 10)).row_blocks(1000) == ((0, 20),)
    with pytest.raises(ValueError, match="min_rows must be >= 1, got 0"):
        layout((1, 10)).row_blocks(0)


def run(model: Cosmos3ActionModel, count: int, guidance_scale: float = 3.0):
    spec = candidate_spec(count)
    return model.generate(prompt=PROMPT, action=policy(), num_inference_steps=STEPS, fps=FPS, base_seed=BASE_SEED,
                          guidance_scale=guidance_scale, spec=spec)


def test_row_blocked_layers_give_the_upstream_candidates_in_one_forward_per_step(monkeypatch):
    # row_block_rows=1: every candidate block of the tiny model is its own range, so the blocked path runs.
    blocked = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8, cfg_mode="fused", row_block_rows=1)
    whole = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8, cfg_mode="fused", row_block_rows=None)
    ranges_per_layer: list[int] = []
    real = layers.blocked_layer_forward

    def spy(layer, processor, und_seq, gen_seq, rotary_emb, blocks):
        ranges_per_layer.append(len(blocks))
        assert blocks[0][0] == 0 and blocks[-1][1] == gen_seq.shape[0]
        return real(layer, processor, und_seq, gen_seq, rotary_emb, blocks)

    monkeypatch.setattr(layers, "blocked_layer_forward", spy)
    result = run(blocked, 4)
    monkeypatch.undo()

    layer_count = len(blocked.pipe.transformer.layers)
    assert all(isinstance(layer, RowBlockedDecoderLayer) for layer in blocked.pipe.transformer.layers)
    assert ranges_per_layer == [8] * (layer_count * STEPS), "4 candidates x 2 CFG branches, every layer, every step"
    assert result.metrics["physical_forwards"] == STEPS
    for i, seed in enumerate(result.seeds):
        assert within_rule(result.candidates[i], upstream_action(seed, guidance_scale=3.0))
    assert within_rule(result.candidates, run(whole, 4).candidates)
    # A lone candidate with separate CFG branches is one range: it runs the stock layer, bitwise equal to upstream.
    assert torch.equal(run(Cosmos3ActionModel(fresh_pipe(), row_block_rows=1), 1).candidates[0],
                       upstream_action(BASE_SEED, guidance_scale=3.0))


def test_row_block_rows_is_validated_and_defaults_to_cpu_only():
    pipe = fresh_pipe()
    assert Cosmos3ActionModel(pipe).adapter.row_block_rows == layers.CPU_ROW_BLOCK_ROWS
    assert Cosmos3ActionModel(pipe, row_block_rows=0).adapter.row_block_rows is None
    assert layers.default_row_block_rows(torch.device("cuda")) is None
    with pytest.raises(InvalidSpecError, match="row_block_rows must be 'auto', None or an int >= 0, got -3"):
        Cosmos3ActionModel(pipe, row_block_rows=-3)
