"""Row-blocked decoder layers: a packed forward's token-wise work, one candidate block at a time.

Each row range is cut at candidate block boundaries, so every GEMM sees the shapes of one upstream call; attention
still runs once per layer over all blocks. Off on CUDA and with no layout installed (the stock ``forward`` runs).
Measurements and the reasons: docs/benchmarks.md, "Row blocks".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer, Cosmos3VLTextMoTDecoderLayer

from .attention import FanoutAttnProcessor

RotaryTables = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

CPU_ROW_BLOCK_ROWS = 256
"""Default smallest row range on CPU: one bench-config candidate block (416 rows) per range; the tiny test
configs' blocks of a few dozen rows are merged so Python overhead does not dominate."""


def default_row_block_rows(device: torch.device) -> int | None:
    """Row blocking on CPU only: on CUDA one large GEMM keeps the device busy, and blocking was never measured."""
    return CPU_ROW_BLOCK_ROWS if device.type == "cpu" else None


def blocked_layer_forward(
    layer: torch.nn.Module,
    processor: FanoutAttnProcessor,
    und_seq: torch.Tensor,
    gen_seq: torch.Tensor,
    rotary_emb: RotaryTables,
    blocks: tuple[tuple[int, int], ...],
) -> tuple[torch.Tensor, torch.Tensor]:
    """``Cosmos3VLTextMoTDecoderLayer.forward`` with the generation pathway's token-wise ops run per row range.

    Args:
        layer (`Cosmos3VLTextMoTDecoderLayer`): The stock layer (its modules and weights are used as they are).
        processor (`FanoutAttnProcessor`): The installed processor, inside ``use_layout``.
        und_seq (`torch.Tensor` of shape `[U, hidden]`): Understanding tokens of this forward (empty when every
            prefix comes from the cache).
        gen_seq (`torch.Tensor` of shape `[R, hidden]`): Generation tokens of every block.
        rotary_emb (`tuple`): ``(cos_und, sin_und, cos_gen, sin_gen)``, rows matching the two sequences.
        blocks (`tuple[tuple[int, int], ...]`): ``[start, end)`` row ranges covering ``gen_seq`` in order.

    Returns:
        `tuple`: The layer's outputs for the understanding and the generation tokens (shapes of the inputs).
    """
    processor.check_abort()
    attn = layer.self_attn
    layout, cache = processor.layout, processor.cache
    cos_und, sin_und, cos_gen, sin_gen = rotary_emb

    # Text pathway: only at a prefix's first step (later steps serve it from the cache). One prefix at a time, as
    # ``text_pathway`` projects it, so its output has the upstream call's bits whatever else is in this forward.
    prefix_ranges = [slot.und_range for slot in layout.computed]
    normed_und = torch.empty_like(und_seq)
    for start, end in prefix_ranges:
        normed_und[start:end] = layer.input_layernorm(und_seq[start:end])
    causal_out, prefix_kv = processor.text_pathway(attn, normed_und, cos_und, sin_und, layout, cache)
    del normed_und
    und_out = torch.empty_like(und_seq)
    for start, end in prefix_ranges:
        residual = und_seq[start:end] + attn.to_out(causal_out[start:end])
        und_out[start:end] = residual + layer.mlp(layer.post_attention_layernorm(residual))

    rows = gen_seq.shape[0]
    heads, kv_heads, head_dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
    q_gen = gen_seq.new_empty((rows, heads, head_dim))
    k_gen = gen_seq.new_empty((rows, kv_heads, head_dim))
    v_gen = gen_seq.new_empty((rows, kv_heads, head_dim))

    def project(share: Sequence[tuple[int, int]]) -> None:
        for start, end in share:
            normed = layer.input_layernorm_moe_gen(gen_seq[start:end])
            q, k, v = processor.gen_qkv(attn, normed, cos_gen[start:end], sin_gen[start:end])
            q_gen[start:end], k_gen[start:end], v_gen[start:end] = q, k, v

    _each(processor, blocks, project)
    full_out = processor.gen_attention(attn, layout, q_gen, k_gen, v_gen, prefix_kv, cache)
    q_gen = k_gen = v_gen = None  # freed before the MLP (the closure above is done with them)

    gen_out = torch.empty_like(gen_seq)

    def feed_forward(share: Sequence[tuple[int, int]]) -> None:
        for start, end in share:
            residual = gen_seq[start:end] + attn.to_add_out(full_out[start:end])
            gen_out[start:end] = residual + layer.mlp_moe_gen(layer.post_attention_layernorm_moe_gen(residual))

    _each(processor, blocks, feed_forward)
    return und_out, gen_out


def _each(processor: FanoutAttnProcessor, blocks: tuple[tuple[int, int], ...],
          work: Callable[[Sequence[tuple[int, int]]], None]) -> None:
    # Row blocks share nothing: spread over the forward's workers when it has them (``workers.py``).
    workers = processor.workers
    if workers is None:
        work(blocks)
    else:
        workers.run(blocks, work)


class RowBlockedDecoderLayer(Cosmos3VLTextMoTDecoderLayer):
    """The stock decoder layer, plus :func:`blocked_layer_forward` while a forward asks for row blocks.

    Installed by swapping the class of existing layers (:func:`install_row_blocks`): no new modules, no new
    weights, ``state_dict`` keys unchanged, and copies of the transformer stay correct.
    """

    def forward(
        self, und_seq: torch.Tensor, gen_seq: torch.Tensor, rotary_emb: RotaryTables
    ) -> tuple[torch.Tensor, torch.Tensor]:
        processor = self.self_attn.processor
        if not isinstance(processor, FanoutAttnProcessor) or processor.layout is None:
            return super().forward(und_seq, gen_seq, rotary_emb)
        blocks = processor.row_blocks()
        if blocks is None:
            if len(processor.layout.computed) <= 1:
                return super().forward(und_seq, gen_seq, rotary_emb)
            # Several prefixes computed together: the stock layer would run their MLPs as one GEMM.
            blocks = ((0, gen_seq.shape[0]),)
        return blocked_layer_forward(self, processor, und_seq, gen_seq, rotary_emb, blocks)


def install_row_blocks(transformer: Cosmos3OmniTransformer) -> None:
    """Make every decoder layer of ``transformer`` honour the fan-out processor's row blocks.

    Layers run their stock forward outside a ``use_layout(..., row_block_rows=...)`` block, so upstream pipeline
    calls on the same transformer compute exactly what they did. Installing twice is harmless.
    """
    for layer in transformer.layers:
        if type(layer) is Cosmos3VLTextMoTDecoderLayer:
            layer.__class__ = RowBlockedDecoderLayer
