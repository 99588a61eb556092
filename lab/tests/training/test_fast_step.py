"""The cheaper training step computes the plain step's loss and gradients, so serving sees the model it trained.

The plain step packs one item per example and runs the instruction's text prefix through every layer at every step,
training both pathways. The fast step (``train-pusht`` by default) freezes the text pathway, reads the prefix's
per-layer keys/values from a cache filled once (``text_prefix.instruction_cache``), and packs the examples of one
branch as one run of blocks. On one batch, from the same weights, examples and noise, its loss and the gradient of
every parameter it trains equal the plain step's (bit for bit on the machine this was written on; the tolerance
below leaves room for another CPU's kernels); what it gives up is the text pathway's gradient, checked non-zero here
so the cost stays visible.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses

import pytest
import torch
from safetensors.torch import load_file

from trajectory_ensemble_node.models.cosmos3 import PackItem, PrefixKVCache, forward_items, install_fanout
from trajectory_ensemble_lab.pusht import train as pusht_train
from trajectory_ensemble_lab.pusht import train_cli
from trajectory_ensemble_lab.pusht.recording import TEST_BAG
from trajectory_ensemble_lab.training import TrainingError
from trajectory_ensemble_lab.training.fit import fit, training_loss
from trajectory_ensemble_lab.training.pipeline import fresh_pipeline
from trajectory_ensemble_lab.training.text_prefix import freeze_text_pathway, instruction_cache, is_text_pathway

TINY = dataclasses.replace(pusht_train.PUSHT_CONFIG, num_layers=2)
"""PushT's shape with two layers: the second layer's text keys/values depend on the first layer's text MLP."""
RELATIVE = 1e-5
"""Largest difference allowed, relative to the largest entry of the plain value: float32 round-off of attention
batched another way, far below any training signal (measured here: 0)."""
BATCH = 8
SIGMAS = torch.tensor([0.95, 0.8, 0.7, 0.6, 0.5, 0.4, 0.2, 0.05])
# Clean action prefixes of 0, 3 and 5 rows: three runs of blocks with their own templates, as train-toy's
# --prefix-conditioning makes them.
PREFIXES = [0, 0, 3, 3, 0, 5, 5, 0]


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    images = pusht_train.normalization_images([TEST_BAG], count=4)
    pipe = fresh_pipeline(TINY, 0, images, pusht_train.PUSHT_FORMAT, log=lambda message: None)
    dataset = pusht_train.build_pusht_dataset(pipe, [TEST_BAG], stride=8, log=lambda message: None)
    pipe.transformer.train()
    install_fanout(pipe.transformer)
    return pipe, dataset


def _step(pipe, dataset, prefixes, **fast):
    transformer = pipe.transformer
    for param in transformer.parameters():
        param.grad = None
    loss, _, _ = training_loss(pipe, dataset, list(range(BATCH)), SIGMAS, torch.Generator().manual_seed(5), 0.1,
                               prefixes, **fast)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in transformer.named_parameters() if p.grad is not None}


def _close(fast: torch.Tensor, plain: torch.Tensor) -> bool:
    return (fast - plain).abs().max().item() <= RELATIVE * plain.abs().max().item()


@pytest.mark.parametrize("prefixes", [None, PREFIXES], ids=["pusht", "clean-prefixes"])
def test_the_fast_step_has_the_plain_steps_loss_and_generation_gradients(setup, prefixes):
    pipe, dataset = setup
    pipe = copy.deepcopy(pipe)
    plain_loss, plain = _step(pipe, dataset, prefixes, one_run=False)
    frozen = freeze_text_pathway(pipe.transformer)
    cache = instruction_cache(pipe.transformer, dataset.branch)
    fast_loss, fast = _step(pipe, dataset, prefixes, prefix_cache=cache)

    assert _close(fast_loss, plain_loss), (fast_loss, plain_loss)
    trained = {name for name, p in pipe.transformer.named_parameters() if p.requires_grad}
    assert set(fast) == trained and trained == set(plain) - set(frozen)
    for name in trained:
        assert _close(fast[name], plain[name]), name
    # What freezing gives up: the plain step trains the text pathway through the prefix's keys/values.
    assert frozen and all(not is_text_pathway(name) for name in trained)
    assert plain["layers.0.self_attn.to_k.weight"].abs().max() > 0
    assert plain["layers.0.mlp.down_proj.weight"].abs().max() > 0


def test_the_cache_leaves_the_prefix_out_of_the_forward_and_gives_the_same_predictions_bit_for_bit(setup):
    pipe, dataset = setup
    pipe = copy.deepcopy(pipe)
    transformer = pipe.transformer
    freeze_text_pathway(transformer)
    cache = instruction_cache(transformer, dataset.branch)
    assert len(cache) == 1
    condition = torch.zeros(3, 16, 5, 6, 6)
    condition[:, :, :1] = dataset.condition[:3]
    action = torch.randn(3, 16, transformer.config.action_dim, generator=torch.Generator().manual_seed(1))
    timesteps = (900.0, 400.0, 50.0)
    with torch.no_grad():
        # One item per example (the plain packing) against one item of three blocks with a timestep each.
        separate = [forward_items(transformer, [PackItem(branch=dataset.branch, vision=condition[i : i + 1],
                                                         action=action[i : i + 1], timestep=t)],
                                  torch.device("cpu")) for i, t in enumerate(timesteps)]
        one = PackItem(branch=dataset.branch, vision=condition, action=action, timestep=timesteps)
        (vision, *_), (actions, *_) = forward_items(transformer, [one], torch.device("cpu"), cache)
        (vision_uncached, *_), (actions_uncached, *_) = forward_items(transformer, [one], torch.device("cpu"))
    assert torch.equal(actions, actions_uncached) and torch.equal(vision, vision_uncached)
    for i, ((v, *_), (a, *_)) in enumerate(separate):
        assert torch.allclose(actions[i : i + 1], a, rtol=0, atol=1e-5) and torch.allclose(vision[i : i + 1], v,
                                                                                            rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="needs one timestep or 3, got 2"):
        forward_items(transformer, [PackItem(branch=dataset.branch, vision=condition, action=action,
                                             timestep=(1.0, 2.0))], torch.device("cpu"), PrefixKVCache())


def test_a_text_pathway_still_trained_is_refused_by_name(setup):
    pipe, dataset = setup
    with pytest.raises(TrainingError, match="the text pathway must be frozen before its keys/values are cached"):
        instruction_cache(copy.deepcopy(pipe).transformer, dataset.branch)


def test_train_pusht_freezes_the_text_pathway_by_default_and_saves_it_unchanged(setup, tmp_path):
    pipe, dataset = setup
    pipe = copy.deepcopy(pipe)
    before = {name: p.detach().clone() for name, p in pipe.transformer.named_parameters()}
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--steps", "3", "--batch", "4", "--log-every", "3", "--checkpoint-every", "0",
                              "--save-dtype", "float32", "--ema", "0"])
    assert args.freeze_text and not parser.parse_args(["--no-freeze-text"]).freeze_text
    result = fit(pipe, dataset, args, tmp_path / "policy", tmp_path)
    text = [name for name in before if is_text_pathway(name)]
    assert result["trained_parameters"] == result["transformer_parameters"] - sum(before[n].numel() for n in text)
    saved = load_file(tmp_path / "policy" / "transformer" / "diffusion_pytorch_model.safetensors")
    assert text and all(torch.equal(saved[name], before[name]) for name in text)
    name = "layers.0.self_attn.add_q_proj.weight"
    assert not torch.equal(saved[name], before[name])
    # The pipeline is handed back trainable as a whole, as fit found it.
    assert all(p.requires_grad for p in pipe.transformer.parameters())
