"""The ``nano`` benchmark config: random weights with Cosmos3-Nano's transformer shape, built where it runs.

The shape is not written down here: it is the default of diffusers' ``Cosmos3OmniTransformer.__init__`` (hidden
4096, 36 layers, 32 heads, 8 KV heads, head_dim 128, intermediate 12288, latent channels 48, vocabulary 151936),
read with ``inspect``, plus the action head the policy checkpoints add (``action_gen``, ``action_dim`` 64). The VAE is
Wan2.2's (z_dim 48, base 160, decoder base 256), which the transformer's 48 latent channels expect.

At about 15B parameters (30 GiB in bf16) the weights are created on the target device in the target dtype
(``torch.device`` and default-dtype contexts around the constructor): no CPU copy, no float32 copy. ``--dry-shapes``
builds the same modules on the ``meta`` device, which allocates nothing, to print the shape and parameter count on
any machine.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import randomize_zero_initialized, build_tokenizer

NANO_ACTION = {"action_gen": True, "action_dim": 64}
"""What the policy checkpoints add to the class defaults: the action head (padded action width 64)."""

NANO_VAE = dict(base_dim=160, decoder_base_dim=256, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                is_residual=True, patch_size=2, in_channels=12, out_channels=12, scale_factor_spatial=16,
                scale_factor_temporal=4, latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
"""Wan2.2's VAE shape (the 48-channel latent space Cosmos 3 denoises in); random weights, statistics 0/1."""

NANO_FLOW_SHIFT = 5.0


def nano_transformer_kwargs() -> dict[str, Any]:
    """``Cosmos3OmniTransformer`` keyword arguments of the Nano shape: the class defaults plus :data:`NANO_ACTION`."""
    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(Cosmos3OmniTransformer.__init__).parameters.items()
        if name != "self" and parameter.default is not inspect.Parameter.empty
    }
    return {**defaults, **NANO_ACTION}


@contextlib.contextmanager
def _building_on(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    # Parameters are created where and as they will live: a 15B-parameter model has no room for a CPU or fp32 copy.
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def build_nano_transformer(device: str | torch.device = "meta", dtype: torch.dtype = torch.bfloat16,
                           seed: int = 0) -> Cosmos3OmniTransformer:
    """The Nano-shaped transformer with random weights, built directly on ``device`` in ``dtype``.

    Args:
        device (`str` or `torch.device`): ``"meta"`` (shapes only, nothing allocated) or where it will run.
        dtype (`torch.dtype`): Parameter dtype; the timestep embedder stays float32, as ``from_pretrained`` keeps it.
        seed (`int`): Seed of the device generator the weights are drawn from (the caller's RNG is left as it was).

    Returns:
        `Cosmos3OmniTransformer`
    """
    device = torch.device(device)
    fork = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork, device_type=device.type if device.type == "cuda" else "cuda"):
        torch.manual_seed(seed)
        with _building_on(device, dtype):
            transformer = Cosmos3OmniTransformer(**nano_transformer_kwargs())
        if device.type != "meta":
            randomize_zero_initialized(transformer)
    keep = tuple(getattr(transformer, "_keep_in_fp32_modules", None) or ())
    for name in keep:
        getattr(transformer, name).to(torch.float32)
    return transformer.eval()


def build_nano_pipeline(dtype: torch.dtype, device: str | torch.device, seed: int = 0) -> Cosmos3OmniPipeline:
    """A ``Cosmos3OmniPipeline`` with the Nano transformer (``dtype``) and Wan2.2's VAE (float32), on ``device``.

    Args:
        dtype (`torch.dtype`): Transformer dtype (the benchmark uses bf16).
        device (`str` or `torch.device`): Where every module is built.
        seed (`int`): Weights seed.
    """
    device = torch.device(device)
    transformer = build_nano_transformer(device, dtype, seed)
    with _building_on(device, torch.float32):
        vae = AutoencoderKLWan(**NANO_VAE)
    pipe = Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=build_tokenizer(),
        vae=vae.eval(),
        scheduler=UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                          flow_shift=NANO_FLOW_SHIFT),
        enable_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def count_parameters(module: torch.nn.Module) -> int:
    """Parameters of ``module`` (works on ``meta`` modules: only shapes are read)."""
    return sum(p.numel() for p in module.parameters())


def dry_shapes(dtype: torch.dtype = torch.bfloat16) -> list[str]:
    """The lines ``bench --config nano --dry-shapes`` prints: shape, parameters per part, bytes; last line
    ``parameters: <integer>`` (the transformer's)."""
    transformer = build_nano_transformer("meta", dtype)
    with _building_on(torch.device("meta"), torch.float32):
        vae = AutoencoderKLWan(**NANO_VAE)
    config = transformer.config
    layer = transformer.layers[0]
    parts = {
        "embed_tokens": count_parameters(transformer.embed_tokens),
        "lm_head": count_parameters(transformer.lm_head),
        "decoder layers (text tower)": sum(
            count_parameters(m) for m in (layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)
        ) * len(transformer.layers),
        "decoder layers (generation tower)": sum(
            count_parameters(m) for m in (layer.mlp_moe_gen, layer.input_layernorm_moe_gen,
                                          layer.post_attention_layernorm_moe_gen)
        ) * len(transformer.layers),
        "decoder layers (attention, both towers)": count_parameters(layer.self_attn) * len(transformer.layers),
    }
    total = count_parameters(transformer)
    parts["heads, norms, embeddings of latents/actions/time"] = total - sum(parts.values())
    bytes_total = sum(p.numel() * p.element_size() for p in transformer.parameters())
    lines = [
        "Cosmos3OmniTransformer, Cosmos3-Nano shape (diffusers class defaults + action head), on the meta device",
        f"  hidden {config.hidden_size}, layers {config.num_hidden_layers}, heads {config.num_attention_heads}, "
        f"kv heads {config.num_key_value_heads}, head_dim {config.head_dim}, intermediate {config.intermediate_size}",
        f"  vocab {config.vocab_size}, latent channels {config.latent_channel}, patch {config.latent_patch_size}, "
        f"action_dim {config.action_dim}, embodiment domains {config.num_embodiment_domains}, "
        f"rope axes {list(config.rope_axes_dim)}",
    ]
    lines += [f"  {name}: {count:,}" for name, count in parts.items()]
    lines += [
        f"  weights: {bytes_total / 2**30:.1f} GiB ({str(dtype).removeprefix('torch.')}; time embedder float32)",
        f"  VAE (Wan2.2 shape, z_dim {NANO_VAE['z_dim']}, float32): {count_parameters(vae):,} parameters",
        f"parameters: {total}",
    ]
    return lines
