"""Attention fan-out: N candidates share one text prefix instead of copying it N times.

``Cosmos3AttnProcessor`` runs two pathways over one packed sequence: the understanding (text) tokens attend
causally among themselves, and the generation tokens attend to every text token and every generation token. With
several candidates (and several groups, and both CFG branches) in one sequence that would let candidates see each
other. :class:`FanoutAttnProcessor` keeps the same projections, norms and rotary math, and changes only *which* keys
each query sees:

- each prefix is causal within itself (cond and uncond prefixes of different lengths can share one forward);
- each candidate block attends to its own prefix and its own block, so candidate i computes exactly what a single
  upstream run would compute for it.

Blocks of one branch are equal-length and contiguous, so each run of them becomes ONE batched attention call with
the prefix keys broadcast over the batch (no copy of the prefix activations through the MLPs).

With no layout installed the processor computes exactly what the stock processor computes, so an upstream
pipeline call on the same transformer is unaffected.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, Cosmos3OmniTransformer

from ..base import ForwardAborted


@dataclass(frozen=True)
class GenRun:
    """``count`` contiguous generation blocks of ``length`` tokens that all attend to prefix ``prefix``.

    ``start`` is the offset of the first block inside the generation part of the sequence.
    """

    prefix: int
    start: int
    count: int
    length: int


@dataclass(frozen=True)
class AttentionLayout:
    """Which keys each query may see in one packed forward.

    Args:
        und_segments (`tuple[tuple[int, int], ...]`): ``[start, end)`` of each prefix in the understanding part.
        gen_runs (`tuple[GenRun, ...]`): The generation blocks, in sequence order, covering the generation part.
    """

    und_segments: tuple[tuple[int, int], ...]
    gen_runs: tuple[GenRun, ...]


def _project(attn, seq: torch.Tensor, fused_name: str, parts: tuple[str, str, str]):
    fused = getattr(attn, fused_name, None)
    if fused is not None:
        return fused(seq).split(list(fused.shard_sizes), dim=-1)
    return tuple(getattr(attn, part)(seq) for part in parts)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class FanoutAttnProcessor:
    """Drop-in replacement for ``Cosmos3AttnProcessor`` that honours an :class:`AttentionLayout`.

    One instance is shared by every layer; :meth:`use_layout` installs the layout for the duration of one forward.
    """

    # Set by ``transformer.set_attention_backend`` like on the stock processor.
    _attention_backend = None
    _parallel_config = None

    def __init__(self) -> None:
        self._layout: AttentionLayout | None = None
        self._should_abort: Callable[[], bool] | None = None
        self._stock = Cosmos3AttnProcessor()

    @contextlib.contextmanager
    def use_layout(
        self, layout: AttentionLayout, should_abort: Callable[[], bool] | None = None
    ) -> Iterator[None]:
        """Install ``layout`` for the forwards run inside the ``with`` block.

        Args:
            layout (`AttentionLayout`): Which keys each query may see.
            should_abort (`Callable[[], bool]`, *optional*): Checked once per layer; when it returns True the forward
                stops with :class:`~trajectory_ensemble_node.models.base.ForwardAborted` (all its groups were
                canceled), so a cancel lands within one layer instead of one denoising step.
        """
        previous = self._layout, self._should_abort
        self._layout, self._should_abort = layout, should_abort
        try:
            yield
        finally:
            self._layout, self._should_abort = previous

    def __call__(
        self,
        attn,
        und_seq: torch.Tensor,
        gen_seq: torch.Tensor,
        rotary_emb: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layout = self._layout
        if self._should_abort is not None and self._should_abort():
            raise ForwardAborted("every group in this forward was canceled")
        fused = hasattr(attn, "to_qkv")
        if layout is None:
            if not fused:
                self._stock._attention_backend = self._attention_backend
                self._stock._parallel_config = self._parallel_config
                return self._stock(attn, und_seq, gen_seq, rotary_emb)
            # A plain upstream call on a fused transformer: one prefix, one block — the stock attention pattern.
            layout = AttentionLayout(
                und_segments=((0, und_seq.shape[0]),),
                gen_runs=(GenRun(prefix=0, start=0, count=1, length=gen_seq.shape[0]),),
            )
        if self._parallel_config is not None:
            raise NotImplementedError("Candidate fan-out does not support context parallelism.")

        heads, kv_heads, head_dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        # Projections, norms and rotary: the same ops in the same order as the stock processor, token-wise, so each
        # token's q/k/v are bit-identical to a single run's (unless q/k/v are fused, see ``weights.fuse_qkv_projections``).
        q_und, k_und, v_und = _project(attn, und_seq, "to_qkv", ("to_q", "to_k", "to_v"))
        q_gen, k_gen, v_gen = _project(attn, gen_seq, "add_qkv", ("add_q_proj", "add_k_proj", "add_v_proj"))
        q_und, q_gen = q_und.reshape(-1, heads, head_dim), q_gen.reshape(-1, heads, head_dim)
        k_und, k_gen = k_und.reshape(-1, kv_heads, head_dim), k_gen.reshape(-1, kv_heads, head_dim)
        v_und, v_gen = v_und.reshape(-1, kv_heads, head_dim), v_gen.reshape(-1, kv_heads, head_dim)

        q_und = attn.norm_q(q_und)
        k_und = attn.norm_k(k_und)
        k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else k_und
        q_gen = attn.norm_added_q(q_gen)
        k_gen = attn.norm_added_k(k_gen)

        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        cos_und = cos_und.unsqueeze(1)
        sin_und = sin_und.unsqueeze(1)
        q_und = q_und * cos_und + _rotate_half(q_und) * sin_und
        k_und = k_und * cos_und + _rotate_half(k_und) * sin_und
        k_und_for_gen = k_und_for_gen * cos_und + _rotate_half(k_und_for_gen) * sin_und
        cos_gen = cos_gen.unsqueeze(1)
        sin_gen = sin_gen.unsqueeze(1)
        q_gen = q_gen * cos_gen + _rotate_half(q_gen) * sin_gen
        k_gen = k_gen * cos_gen + _rotate_half(k_gen) * sin_gen

        causal_parts = []
        for start, end in layout.und_segments:
            out = dispatch_attention_fn(
                q_und[start:end].unsqueeze(0),
                k_und[start:end].unsqueeze(0),
                v_und[start:end].unsqueeze(0),
                is_causal=True,
                enable_gqa=True,
                backend=self._attention_backend,
            )
            causal_parts.append(out.squeeze(0).flatten(-2, -1))
        causal_out = causal_parts[0] if len(causal_parts) == 1 else torch.cat(causal_parts, dim=0)

        full_parts = []
        for run in layout.gen_runs:
            p_start, p_end = layout.und_segments[run.prefix]
            prefix_len = p_end - p_start
            stop = run.start + run.count * run.length
            q = q_gen[run.start : stop].view(run.count, run.length, heads, head_dim)
            # The prefix keys/values are broadcast over the run's blocks (an expand, not a copy of activations).
            k = torch.cat(
                [
                    k_und_for_gen[p_start:p_end].unsqueeze(0).expand(run.count, prefix_len, kv_heads, head_dim),
                    k_gen[run.start : stop].view(run.count, run.length, kv_heads, head_dim),
                ],
                dim=1,
            )
            v = torch.cat(
                [
                    v_und[p_start:p_end].unsqueeze(0).expand(run.count, prefix_len, kv_heads, head_dim),
                    v_gen[run.start : stop].view(run.count, run.length, kv_heads, head_dim),
                ],
                dim=1,
            )
            out = dispatch_attention_fn(
                q, k, v, is_causal=False, enable_gqa=True, backend=self._attention_backend
            )
            full_parts.append(out.reshape(run.count * run.length, heads * head_dim))
        full_out = full_parts[0] if len(full_parts) == 1 else torch.cat(full_parts, dim=0)

        return attn.to_out(causal_out), attn.to_add_out(full_out)


def install_fanout(transformer: Cosmos3OmniTransformer) -> FanoutAttnProcessor:
    """Install one shared :class:`FanoutAttnProcessor` on every attention module of ``transformer``.

    Reuses the installed instance when there is one, so wrapping the same pipeline twice is harmless.
    """
    processors = transformer.attn_processors
    existing = {id(p): p for p in processors.values() if isinstance(p, FanoutAttnProcessor)}
    if len(existing) == 1 and all(isinstance(p, FanoutAttnProcessor) for p in processors.values()):
        return next(iter(existing.values()))
    processor = FanoutAttnProcessor()
    stock = next(iter(processors.values()), None)
    if stock is not None:
        processor._attention_backend = getattr(stock, "_attention_backend", None)
        processor._parallel_config = getattr(stock, "_parallel_config", None)
    transformer.set_attn_processor(processor)
    return processor
