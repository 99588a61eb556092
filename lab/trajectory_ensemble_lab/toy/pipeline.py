"""The toy pipeline ``train-toy`` trains: its shape, a fresh build or a saved one to start from, and saving it.

A fresh pipeline is ``build_pipeline(TOY_CONFIG)`` with its VAE rounded through fp16 (so the shipped fp16 VAE encodes
what training saw), its action heads re-initialized at a trainable scale and its latents normalized per channel on
toy observations. Saving writes the EMA weights in fp16 safetensors (``save_pretrained``).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import TinyCosmos3Config, build_pipeline, encode_conditioning
from trajectory_ensemble_node.toy import action_condition, load_toy_pipeline, task, toy_pipeline_dir

TOY_CONFIG = TinyCosmos3Config(
    hidden_size=192,
    num_layers=3,
    num_heads=6,
    num_kv_heads=2,
    intermediate_size=320,
    rope_axes_dim=(8, 4, 4),
    action_dim=8,
    vae_base_dim=8,
    vae_z_dim=16,
    vae_dim_mult=(1, 2, 2, 2),
    vae_num_res_blocks=1,
    # The serving schedule's shift. The side of the obstacle is decided at mid sigma, where shift 5 leaves only two
    # or three of the 10 UniPC steps (base weights: 70% of candidates collided, 31% at shift 1). Below 1 the grid
    # spends more steps on the low sigmas that settle the detour; on 256 validation scenes the shipped weights at
    # shift 0.7 collided in 6.8% of candidates against 7.9% at 1.0 and 7.5% at 0.5 (toy/README "Serving schedule").
    # Training still emphasizes high sigma (``--sigma-shift``).
    flow_shift=0.7,
)
"""Shape of the shipped toy policy: about 1.9M transformer parameters, about 4.5 MB in fp16 with VAE and tokenizer."""

DEFAULT_OUT = toy_pipeline_dir()
"""Where ``train-toy`` writes by default: the shipped asset directory of the product."""


def init_action_heads(pipe: Cosmos3OmniPipeline, generator: torch.Generator) -> None:
    """Re-initialize the domain-aware action projections at a trainable scale.

    ``DomainAwareLinear`` keeps its weights in ``nn.Embedding`` tables, which initialize to N(0, 1): an action head
    whose outputs start at ~sqrt(hidden) times the target scale. Fan-in scaling for the input projection and a small
    output projection (as for any diffusion output head) start the loss near its noise floor instead.
    """
    transformer = pipe.transformer
    with torch.no_grad():
        for module, std in (
            (transformer.action_proj_in, 1.0 / math.sqrt(transformer.config.action_dim)),
            (transformer.action_proj_out, 0.02),
        ):
            module.fc.weight.copy_(torch.randn(module.fc.weight.shape, generator=generator) * std)
            module.bias.weight.zero_()


def normalize_latents(pipe: Cosmos3OmniPipeline, num_scenes: int = 64) -> tuple[list[float], list[float]]:
    """Set the VAE's per-channel latent normalization (``latents_mean`` / ``latents_std``) from toy observations.

    ``build_pipeline`` leaves the random VAE un-normalized (mean 0, std 1), and its raw latents have a std near 0.1
    with large channel offsets, so moving the target changes the conditioning tokens by about 1% of their norm and
    the policy learns to ignore them (a first run stayed unconditional for 2000 steps). Real Cosmos 3 checkpoints
    normalize latents per channel; doing the same here makes scene differences O(1). The statistics go into the VAE
    config, so ``_encode_video`` applies them in training and in serving alike, and the saved pipeline carries them.

    Args:
        pipe (`Cosmos3OmniPipeline`): Pipeline whose VAE normalization is still the identity.
        num_scenes (`int`): Training scenes (seeds ``0 .. num_scenes - 1``) whose observations give the statistics.

    Returns:
        `tuple`: per-channel means and stds (``z_dim`` floats each).
    """
    latents = torch.cat([
        encode_conditioning(
            pipe, prompt=task.INSTRUCTION, negative_prompt=None,
            action=action_condition(task.render(task.make_scene(task.TRAIN_SEED_BASE + seed))),
            fps=task.FPS, guidance_scale=task.GUIDANCE_SCALE, device=torch.device("cpu"),
        ).x0_vision[:, :, :1].detach()
        for seed in range(num_scenes)
    ])
    mean = [float(m) for m in latents.mean(dim=(0, 2, 3, 4))]
    std = [float(s) for s in latents.std(dim=(0, 2, 3, 4))]
    pipe.vae.register_to_config(latents_mean=mean, latents_std=std)
    # The pipeline caches these at construction (as from_pretrained will rebuild them from the saved config).
    pipe._vae_latents_mean = torch.tensor(mean, dtype=pipe.vae.dtype)
    pipe._vae_latents_inv_std = 1.0 / torch.tensor(std, dtype=pipe.vae.dtype)
    return mean, std


def round_vae_to_half(pipe: Cosmos3OmniPipeline) -> None:
    """Round the VAE weights through fp16 before anything is encoded, so the shipped fp16 VAE encodes exactly what
    training saw."""
    with torch.no_grad():
        for param in pipe.vae.parameters():
            param.copy_(param.half().float())


def save_pipeline(
    pipe: Cosmos3OmniPipeline, out: Path, dtype: torch.dtype, weights: list[torch.Tensor] | None = None
) -> int:
    """``save_pretrained`` (safetensors) a copy of ``pipe`` with weights in ``dtype``; returns the bytes written.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline being trained (left untouched).
        out (`Path`): Directory to write.
        dtype (`torch.dtype`): Storage dtype of the transformer and VAE weights.
        weights (`list[torch.Tensor]`, *optional*): Replacement values (e.g. EMA) for the transformer's trainable
            parameters, in ``parameters()`` order.
    """
    out.mkdir(parents=True, exist_ok=True)
    copy_pipe = copy.deepcopy(pipe)
    if weights is not None:
        with torch.no_grad():
            trainable = [p for p in copy_pipe.transformer.parameters() if p.requires_grad]
            for param, value in zip(trainable, weights, strict=True):
                param.copy_(value)
    copy_pipe.transformer.to(dtype)
    copy_pipe.vae.to(dtype)
    copy_pipe.save_pretrained(out, safe_serialization=True)
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def load_for_training(init: Path | None, seed: int) -> Cosmos3OmniPipeline:
    """The pipeline training starts from: the saved pipeline ``init``, or (``None``) a fresh one built from ``seed``.

    Args:
        init (`Path`, *optional*): A saved toy pipeline (e.g. the shipped weights) to continue from.
        seed (`int`): Seed of a fresh build (model init and action heads).
    """
    if init is not None:
        # Continue from a saved pipeline: its VAE (already fp16-rounded) and latent normalization come with it.
        pipe = load_toy_pipeline(path=init)
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, flow_shift=TOY_CONFIG.flow_shift)
        print(f"initialized from {init}", flush=True)
        return pipe
    pipe = build_pipeline(TOY_CONFIG, seed=seed)
    round_vae_to_half(pipe)
    init_action_heads(pipe, torch.Generator().manual_seed(seed + 1))
    latents_mean, latents_std = normalize_latents(pipe)
    print(f"latent normalization: mean {[round(m, 3) for m in latents_mean]}, "
          f"std {[round(s, 3) for s in latents_std]}", flush=True)
    return pipe
