"""A fresh Cosmos 3 pipeline made trainable, and saving one: shared by every policy trained here.

A fresh pipeline is ``build_pipeline(config)`` with its VAE rounded through fp16 (so the shipped fp16 VAE encodes
what training saw), its action heads re-initialized at a trainable scale and its latents normalized per channel on
the task's own observations (:func:`fresh_pipeline`). Saving writes the EMA weights in safetensors, fp16 by default
(``save_pretrained``), and the state input the pipeline declares, if any, into the saved ``action_stats.json``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline
from transformers import PreTrainedTokenizerFast

from trajectory_ensemble_node.models.cosmos3 import (
    TinyCosmos3Config,
    build_pipeline,
    build_tokenizer,
    declared_state_input,
    encode_conditioning,
    tokenize_action_prompt,
    write_state_input,
)

from .dataset import ExampleFormat


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


def normalize_latents(pipe: Cosmos3OmniPipeline, images: Iterable[np.ndarray],
                      example_format: ExampleFormat) -> tuple[list[float], list[float]]:
    """Set the VAE's per-channel latent normalization (``latents_mean`` / ``latents_std``) from task observations.

    ``build_pipeline`` leaves the random VAE un-normalized (mean 0, std 1), and its raw latents have a std near 0.1
    with large channel offsets, so moving the target changes the conditioning tokens by about 1% of their norm and
    the policy learns to ignore them (a first toy run stayed unconditional for 2000 steps). Real Cosmos 3 checkpoints
    normalize latents per channel; doing the same here makes scene differences O(1). The statistics go into the VAE
    config, so ``_encode_video`` applies them in training and in serving alike, and the saved pipeline carries them.

    The statistics are of the raw latents: any normalization ``pipe`` already has is set to the identity first
    (a loaded pipeline whose VAE was trained again is normalized anew, not on top of its old statistics).

    Args:
        pipe (`Cosmos3OmniPipeline`): Pipeline whose VAE latents to normalize.
        images (`Iterable[np.ndarray]`): Training observations ``[H, W, 3]`` uint8 whose latents give the statistics.
        example_format (`ExampleFormat`): How the policy is called (the conditioning they are encoded with).

    Returns:
        `tuple`: per-channel means and stds (``z_dim`` floats each).
    """
    fmt = example_format
    channels = int(pipe.vae.config.z_dim)
    _set_latent_normalization(pipe, [0.0] * channels, [1.0] * channels)
    latents = torch.cat([
        encode_conditioning(
            pipe, prompt=fmt.instruction, negative_prompt=None, action=fmt.action_condition(image),
            fps=fmt.fps, guidance_scale=fmt.guidance_scale, device=torch.device("cpu"),
        ).x0_vision[:, :, :1].detach()
        for image in images
    ])
    mean = [float(m) for m in latents.mean(dim=(0, 2, 3, 4))]
    std = [float(s) for s in latents.std(dim=(0, 2, 3, 4))]
    _set_latent_normalization(pipe, mean, std)
    return mean, std


def _set_latent_normalization(pipe: Cosmos3OmniPipeline, mean: list[float], std: list[float]) -> None:
    pipe.vae.register_to_config(latents_mean=mean, latents_std=std)
    # The pipeline caches these at construction (as from_pretrained will rebuild them from the saved config).
    pipe._vae_latents_mean = torch.tensor(mean, dtype=pipe.vae.dtype)
    pipe._vae_latents_inv_std = 1.0 / torch.tensor(std, dtype=pipe.vae.dtype)


def fresh_pipeline(config: TinyCosmos3Config, seed: int, images: Iterable[np.ndarray], example_format: ExampleFormat,
                   log: Callable[[str], None] = print, prompt_merges: int = 0) -> Cosmos3OmniPipeline:
    """A new trainable pipeline of shape ``config``: weights from ``seed``, VAE rounded through fp16, action heads at
    a trainable scale (from ``seed + 1``), latents normalized on ``images``.

    Args:
        config (`TinyCosmos3Config`): The model's shape.
        seed (`int`): Seed of the model init.
        images (`Iterable[np.ndarray]`): Training observations for :func:`normalize_latents`.
        example_format (`ExampleFormat`): How the policy is called.
        log (`Callable[[str], None]`): Where the latent statistics are reported.
        prompt_merges (`int`): With more than 0, its tokenizer has up to that many BPE merges learned from the
            caption ``example_format`` calls it with (:func:`format_caption`), so that caption is a few tokens
            instead of one per byte; the text prefix every step and every served request attends to shrinks with it.
    """
    images = list(images)
    pipe = build_pipeline(config, seed=seed)
    if prompt_merges:
        length = install_caption_tokenizer(pipe, example_format, images[0], prompt_merges, seed + 2)
        log(f"tokenizer: {prompt_merges} merges learned on the caption, which is now {length} tokens")
    round_vae_to_half(pipe)
    init_action_heads(pipe, torch.Generator().manual_seed(seed + 1))
    latents_mean, latents_std = normalize_latents(pipe, images, example_format)
    log(f"latent normalization: mean {[round(m, 3) for m in latents_mean]}, "
        f"std {[round(s, 3) for s in latents_std]}")
    return pipe


def install_tokenizer(pipe: Cosmos3OmniPipeline, tokenizer: PreTrainedTokenizerFast,
                      generator: torch.Generator) -> None:
    """Give ``pipe`` the text tokenizer ``tokenizer``; the transformer's token tables (``embed_tokens``,
    ``lm_head``) are drawn anew for its vocabulary, at their modules' default scales, and nothing else changes: the
    VAE keeps its weights, so latents cached for ``pipe`` stay valid.

    Args:
        pipe (`Cosmos3OmniPipeline`): A fresh pipeline (its text tables are not trained here).
        tokenizer (`PreTrainedTokenizerFast`): The new tokenizer.
        generator (`torch.Generator`): Draws the new tables.
    """
    transformer = pipe.transformer
    vocab, hidden = len(tokenizer), transformer.embed_tokens.embedding_dim
    embed, head = torch.nn.Embedding(vocab, hidden), torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():  # nn.Embedding's N(0, 1) and nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in))
        embed.weight.copy_(torch.randn(embed.weight.shape, generator=generator))
        head.weight.copy_((torch.rand(head.weight.shape, generator=generator) * 2 - 1) / math.sqrt(hidden))
    dtype = transformer.embed_tokens.weight.dtype
    transformer.embed_tokens, transformer.lm_head = embed.to(dtype), head.to(dtype)
    transformer.register_to_config(vocab_size=vocab)
    transformer.vocab_size = vocab
    pipe.register_modules(text_tokenizer=tokenizer)


def format_caption(pipe: Cosmos3OmniPipeline, example_format: ExampleFormat, image: np.ndarray) -> str:
    """The caption (upstream's chat template, special tokens included) that ``example_format`` calls ``pipe`` with,
    as the serving path tokenizes it for a frame of ``image``'s size.

    Args:
        pipe (`Cosmos3OmniPipeline`): A pipeline whose tokenizer decodes losslessly (byte-level BPE).
        example_format (`ExampleFormat`): How the policy is called.
        image (`np.ndarray` of shape `[H, W, 3]`, uint8): A frame of the size it is called with.
    """
    fmt = example_format
    ids, _, _, _ = tokenize_action_prompt(pipe, fmt.instruction, None, fmt.action_condition(image), fmt.fps)
    return pipe.text_tokenizer.decode(ids)


def install_caption_tokenizer(pipe: Cosmos3OmniPipeline, example_format: ExampleFormat, image: np.ndarray,
                              merges: int, seed: int) -> int:
    """Give the byte-level ``pipe`` a tokenizer with up to ``merges`` merges learned on the caption
    ``example_format`` calls it with (:func:`format_caption`, :func:`install_tokenizer`, tables drawn from ``seed``);
    returns the caption's length in tokens now."""
    caption = format_caption(pipe, example_format, image)
    install_tokenizer(pipe, build_tokenizer([caption], merges), torch.Generator().manual_seed(seed))
    return len(pipe.text_tokenizer(caption, add_special_tokens=False)["input_ids"])


def round_vae_to_half(pipe: Cosmos3OmniPipeline) -> None:
    """Round the VAE weights through fp16 before anything is encoded, so the shipped fp16 VAE encodes exactly what
    training saw."""
    with torch.no_grad():
        for param in pipe.vae.parameters():
            param.copy_(param.half().float())


def save_pipeline(
    pipe: Cosmos3OmniPipeline, out: Path, dtype: torch.dtype, weights: list[torch.Tensor] | None = None
) -> int:
    """``save_pretrained`` (safetensors) a copy of ``pipe`` with weights in ``dtype``, and its declared state input
    (``write_state_input``: merged into ``out/action_stats.json``, so ``load_directory`` reads it back); returns the
    bytes written.

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
    write_state_input(out, declared_state_input(pipe))
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
