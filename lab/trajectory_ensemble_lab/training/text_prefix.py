"""The instruction's text prefix as a constant of a training run: the text pathway frozen, its keys/values cached.

Every example of a task carries the same instruction (one packed forward serves a batch under one prefix,
:mod:`.dataset`), and the text (understanding) pathway of ``Cosmos3OmniTransformer`` never sees a generation
token: the prefix's per-layer keys and values are a function of the instruction and the text pathway's weights
alone. Trained, those weights make the prefix a learned memory the generation tokens attend to, recomputed (forward
and backward, 405 tokens for PushT) at every step. Frozen, the keys and values are constants: computed once here,
with the serving path's own prefix cache (``PrefixKVCache``, what later denoising steps read), and read by every
training step, which then runs the generation tokens alone. Serving computes the same keys and values from the
same (unchanged) weights, so it sees the model that was trained.

What freezing costs is measured, not assumed: see ``docs/pusht.md`` (Training cost).
"""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

from trajectory_ensemble_node.models.cosmos3 import Branch, PackItem, PrefixKVCache, forward_items, install_fanout

from . import TrainingError

TEXT_PATHWAY = (
    "embed_tokens.", "lm_head.", "norm.",
    "self_attn.to_q.", "self_attn.to_k.", "self_attn.to_v.", "self_attn.to_qkv.", "self_attn.to_out.",
    "self_attn.norm_q.", "self_attn.norm_k.", "self_attn.k_norm_und_for_gen.",
    "mlp.", "input_layernorm.", "post_attention_layernorm.",
)
"""Parameter names (after ``layers.N.`` for a decoder layer's) of the text pathway in diffusers' layout: the token
embedding, the text tokens' projections, norms and MLP, and the heads only text tokens reach. Every other parameter
(``add_*``, ``*_added_*``, ``*_moe_gen``, ``proj_in/out``, ``time_embedder``, ``action_*``) is the generation
pathway's."""


def is_text_pathway(name: str) -> bool:
    """Whether parameter ``name`` of a ``Cosmos3OmniTransformer`` belongs to the text pathway (:data:`TEXT_PATHWAY`)."""
    parts = name.split(".")
    local = ".".join(parts[2:]) if parts[0] == "layers" else name
    return any(local.startswith(prefix) for prefix in TEXT_PATHWAY)


def freeze_text_pathway(transformer: Cosmos3OmniTransformer) -> list[str]:
    """Stop training the text pathway (``requires_grad = False``); returns the names of the parameters frozen."""
    frozen = []
    for name, param in transformer.named_parameters():
        if is_text_pathway(name):
            param.requires_grad_(False)
            frozen.append(name)
    return frozen


@torch.no_grad()
def instruction_cache(transformer: Cosmos3OmniTransformer, branch: Branch) -> PrefixKVCache:
    """The per-layer keys/values of ``branch``'s prefix, computed once (one forward of one block, no gradient).

    Args:
        transformer (`Cosmos3OmniTransformer`): The model, its text pathway frozen (:func:`freeze_text_pathway`).
        branch (`Branch`): The data set's branch (``dataset.branch``): training steps must pack this very prefix
            object, which the cache is keyed by.

    Raises:
        TrainingError: a text pathway parameter still requires a gradient (the cache would go stale at the first
            optimizer step).
    """
    trained = [name for name, param in transformer.named_parameters() if is_text_pathway(name) and param.requires_grad]
    if trained:
        raise TrainingError(f"the text pathway must be frozen before its keys/values are cached, but {trained[:3]!r} "
                         f"({len(trained)} in all) still require a gradient")
    install_fanout(transformer)
    template = branch.template
    frames, height, width = template.vision_token_shape
    patch = transformer.config.latent_patch_size
    # The block's content is irrelevant: the text pathway never sees it.
    vision = torch.zeros(1, transformer.config.latent_channel, frames, height * patch, width * patch)
    action = torch.zeros(1, template.action_len, transformer.config.action_dim) if template.action_len else None
    cache = PrefixKVCache(retain=0)
    forward_items(transformer, [PackItem(branch=branch, vision=vision, action=action, timestep=500.0)],
                  torch.device("cpu"), cache)
    return cache
