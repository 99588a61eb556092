"""Attention fan-out: N candidates share one text prefix instead of copying it N times.

:class:`FanoutAttnProcessor` keeps the stock projections, norms and rotary math and changes only which keys each
query sees: each prefix is causal within itself, each candidate block attends to its prefix and itself, so candidate
i computes what a single upstream run would. With no layout installed it computes exactly what the stock processor
does. Why prefix keys/values can be cached and shared: docs/python-api.md, "How one forward serves N candidates".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3AttnProcessor, Cosmos3OmniTransformer

from ...engine.adapter import ForwardAborted
from .prefix_cache import PrefixKVCache
from .workers import ForwardWorkers


@dataclass(frozen=True)
class PrefixSlot:
    """One text prefix of a packed forward.

    Args:
        key (`int`): Identity of the prefix (for :class:`PrefixKVCache`).
        und_range (`tuple[int, int]`, *optional*): ``[start, end)`` in the understanding part of this forward, or
            ``None`` when the prefix is served from the cache and not in the sequence.
    """

    key: int
    und_range: tuple[int, int] | None


@dataclass(frozen=True)
class GenRun:
    """``count`` contiguous generation blocks of ``length`` tokens that all attend to prefix ``prefix``.

    ``prefix`` indexes :attr:`AttentionLayout.prefixes`; ``start`` is the offset of the first block inside the
    generation part of the sequence.
    """

    prefix: int
    start: int
    count: int
    length: int


@dataclass(frozen=True)
class AttentionLayout:
    """Which keys each query may see in one packed forward.

    Args:
        prefixes (`tuple[PrefixSlot, ...]`): Every prefix the generation blocks attend to.
        gen_runs (`tuple[GenRun, ...]`): The generation blocks, in sequence order, covering the generation part.
    """

    prefixes: tuple[PrefixSlot, ...]
    gen_runs: tuple[GenRun, ...]

    @property
    def computed(self) -> tuple[PrefixSlot, ...]:
        """The prefixes present in this forward's sequence (the others come from the cache)."""
        return tuple(slot for slot in self.prefixes if slot.und_range is not None)

    def row_blocks(self, min_rows: int) -> tuple[tuple[int, int], ...]:
        """Split the generation part into ``[start, end)`` row ranges along candidate block boundaries.

        Consecutive blocks are merged until a range holds at least ``min_rows`` rows, so a range is one
        candidate's block (one CFG branch) when blocks are large, and several when they are small.

        Args:
            min_rows (`int`): Smallest range worth a separate set of GEMMs (>= 1).
        """
        if min_rows < 1:
            raise ValueError(f"min_rows must be >= 1, got {min_rows!r}.")
        ranges: list[tuple[int, int]] = []
        start = end = 0
        for run in self.gen_runs:
            for index in range(run.count):
                end = run.start + (index + 1) * run.length
                if end - start >= min_rows:
                    ranges.append((start, end))
                    start = end
        if end > start:
            ranges.append((start, end))
        return tuple(ranges)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _project(attn, seq: torch.Tensor, fused_name: str, parts: tuple[str, str, str]):
    fused = getattr(attn, fused_name, None)
    if fused is not None:
        return fused(seq).split(list(fused.shard_sizes), dim=-1)
    return tuple(getattr(attn, part)(seq) for part in parts)


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
        self._cache: PrefixKVCache | None = None
        self._row_blocks: tuple[tuple[int, int], ...] | None = None
        self._workers: ForwardWorkers | None = None
        self._stock = Cosmos3AttnProcessor()

    @property
    def layout(self) -> AttentionLayout | None:
        """The layout of the forward in progress (``None`` outside :meth:`use_layout`)."""
        return self._layout

    @property
    def cache(self) -> PrefixKVCache | None:
        return self._cache

    @property
    def workers(self) -> ForwardWorkers | None:
        """Threads for the independent pieces of the forward in progress (``None``: the calling thread only)."""
        return self._workers

    def row_blocks(self) -> tuple[tuple[int, int], ...] | None:
        """Row ranges of the forward in progress for the row-blocked decoder layers (``layers.py``), or ``None``
        to run whole layers (outside :meth:`use_layout`, without ``row_block_rows``, or when one range would be
        the whole layer, as for a lone candidate with separate CFG branches)."""
        return self._row_blocks

    def check_abort(self) -> None:
        """Raise :class:`ForwardAborted` when every group of the forward in progress was canceled."""
        if self._should_abort is not None and self._should_abort():
            raise ForwardAborted("every group in this forward was canceled")

    @contextlib.contextmanager
    def use_layout(
        self,
        layout: AttentionLayout,
        should_abort: Callable[[], bool] | None = None,
        cache: PrefixKVCache | None = None,
        row_block_rows: int | None = None,
        workers: ForwardWorkers | None = None,
    ) -> Iterator[None]:
        """Install ``layout`` for the forwards run inside the ``with`` block.

        Args:
            layout (`AttentionLayout`): Which keys each query may see.
            should_abort (`Callable[[], bool]`, *optional*): Checked once per layer; when it returns True the forward
                stops with :class:`~trajectory_ensemble_node.engine.adapter.ForwardAborted` (all its groups were
                canceled), so a cancel lands within one layer instead of one denoising step.
            cache (`PrefixKVCache`, *optional*): Receives the keys/values of the prefixes computed in this forward and
                serves those the layout marks as cached.
            row_block_rows (`int`, *optional*): Run the token-wise work of each decoder layer in row ranges of at
                least this many rows, cut at candidate block boundaries (see ``layers.install_row_blocks``, which
                must be installed). ``None`` runs whole layers.
            workers (`ForwardWorkers`, *optional*): Threads for the forward's independent pieces (row blocks,
                attention runs); ``None`` runs them all on the calling thread.
        """
        # Planned once per forward; every layer of it walks the same ranges.
        blocks = layout.row_blocks(row_block_rows) if row_block_rows is not None else None
        previous = self._layout, self._should_abort, self._cache, self._row_blocks, self._workers
        self._layout, self._should_abort, self._cache, self._workers = layout, should_abort, cache, workers
        self._row_blocks = blocks if blocks is not None and len(blocks) > 1 else None
        try:
            yield
        finally:
            self._layout, self._should_abort, self._cache, self._row_blocks, self._workers = previous

    def __call__(
        self,
        attn,
        und_seq: torch.Tensor,
        gen_seq: torch.Tensor,
        rotary_emb: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layout, cache = self._layout, self._cache
        self.check_abort()
        if layout is None:
            if not hasattr(attn, "to_qkv"):
                self._stock._attention_backend = self._attention_backend
                self._stock._parallel_config = self._parallel_config
                return self._stock(attn, und_seq, gen_seq, rotary_emb)
            # A plain upstream call on a fused transformer: one prefix, one block — the stock attention pattern.
            layout = AttentionLayout(
                prefixes=(PrefixSlot(key=-1, und_range=(0, und_seq.shape[0])),),
                gen_runs=(GenRun(prefix=0, start=0, count=1, length=gen_seq.shape[0]),),
            )
        cos_und, sin_und, cos_gen, sin_gen = rotary_emb
        causal_out, prefix_kv = self.text_pathway(attn, und_seq, cos_und, sin_und, layout, cache)
        q_gen, k_gen, v_gen = self.gen_qkv(attn, gen_seq, cos_gen, sin_gen)
        full_out = self.gen_attention(attn, layout, q_gen, k_gen, v_gen, prefix_kv, cache)
        return attn.to_out(causal_out), attn.to_add_out(full_out)

    # The three stages below are what ``__call__`` composes; ``layers.py`` calls them directly to run the
    # token-wise stages in row blocks.

    def text_pathway(
        self,
        attn,
        und_seq: torch.Tensor,
        cos_und: torch.Tensor,
        sin_und: torch.Tensor,
        layout: AttentionLayout,
        cache: PrefixKVCache | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Causal attention of the prefixes computed in this forward.

        Args:
            und_seq (`torch.Tensor` of shape `[U, hidden]`): The normed understanding tokens (may be empty).
            cos_und, sin_und (`torch.Tensor` of shape `[U, head_dim]`): Their rotary tables.

        Returns:
            `tuple`: ``causal_out`` `[U, heads * head_dim]` (before ``to_out``), and the prefixes' rotated keys and
            values for the generation pathway (``[U, kv_heads, head_dim]`` each), or ``None`` when every prefix
            comes from the cache. Each prefix's keys/values also go to ``cache``.
        """
        # Both the whole-layer path (``__call__``) and the row-blocked one (``layers.py``) start here.
        if self._parallel_config is not None:
            raise NotImplementedError("Candidate fan-out does not support context parallelism.")
        heads, kv_heads, head_dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        computed = layout.computed
        if not computed:
            return und_seq.new_zeros((und_seq.shape[0], heads * head_dim)), None
        # One prefix at a time, GEMMs included: BLAS picks kernels by row count, so a prefix computed alone has the
        # bits of the upstream call's text pathway whatever else shares this forward, and the cache can hand it to
        # any later forward (``PrefixKVCache.adopt``). Projections, norms and rotary are the stock processor's ops in
        # its order (unless q/k/v are fused, see ``weights.fuse_qkv_projections``).
        causal_parts, key_parts, value_parts = [], [], []
        for slot in computed:
            start, end = slot.und_range
            q_und, k_und, v_und = _project(attn, und_seq[start:end], "to_qkv", ("to_q", "to_k", "to_v"))
            q_und = attn.norm_q(q_und.reshape(-1, heads, head_dim))
            k_und = attn.norm_k(k_und.reshape(-1, kv_heads, head_dim))
            v_und = v_und.reshape(-1, kv_heads, head_dim)
            k_und_for_gen = attn.k_norm_und_for_gen(k_und) if attn.k_norm_und_for_gen is not None else None
            cos, sin = cos_und[start:end].unsqueeze(1), sin_und[start:end].unsqueeze(1)
            q_und = q_und * cos + _rotate_half(q_und) * sin
            k_und = k_und * cos + _rotate_half(k_und) * sin
            # Without its own norm, the generation pathway's keys are ``k_und`` rotated the same way, so the same
            # bits: reused instead of rotated a second time as the stock processor does.
            if k_und_for_gen is None:
                k_und_for_gen = k_und
            else:
                k_und_for_gen = k_und_for_gen * cos + _rotate_half(k_und_for_gen) * sin
            out = dispatch_attention_fn(
                q_und.unsqueeze(0), k_und.unsqueeze(0), v_und.unsqueeze(0),
                is_causal=True, enable_gqa=True, backend=self._attention_backend,
            )
            causal_parts.append(out.squeeze(0).flatten(-2, -1))
            key_parts.append(k_und_for_gen)
            value_parts.append(v_und)
            if cache is not None:
                cache.store(slot.key, attn, k_und_for_gen, v_und)
        if len(computed) == 1:
            return causal_parts[0], (key_parts[0], value_parts[0])
        # Computed prefixes are packed back to back from 0 (``packing.pack_forward``), so the concatenation keeps
        # each slot's ``und_range`` valid for the generation pathway.
        return torch.cat(causal_parts), (torch.cat(key_parts), torch.cat(value_parts))

    @staticmethod
    def gen_qkv(
        attn, gen_seq: torch.Tensor, cos_gen: torch.Tensor, sin_gen: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token-wise q/k/v of generation tokens: projection, q/k norms, rotary (stock order).

        Args:
            gen_seq (`torch.Tensor` of shape `[R, hidden]`): Normed generation tokens (any row range).
            cos_gen, sin_gen (`torch.Tensor` of shape `[R, head_dim]`): Their rotary tables.

        Returns:
            `tuple`: ``q`` `[R, heads, head_dim]`, ``k`` and ``v`` `[R, kv_heads, head_dim]`.
        """
        heads, kv_heads, head_dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        q_gen, k_gen, v_gen = _project(attn, gen_seq, "add_qkv", ("add_q_proj", "add_k_proj", "add_v_proj"))
        q_gen = attn.norm_added_q(q_gen.reshape(-1, heads, head_dim))
        k_gen = attn.norm_added_k(k_gen.reshape(-1, kv_heads, head_dim))
        v_gen = v_gen.reshape(-1, kv_heads, head_dim)
        cos_gen = cos_gen.unsqueeze(1)
        sin_gen = sin_gen.unsqueeze(1)
        q_gen = q_gen * cos_gen + _rotate_half(q_gen) * sin_gen
        k_gen = k_gen * cos_gen + _rotate_half(k_gen) * sin_gen
        return q_gen, k_gen, v_gen

    def gen_attention(
        self,
        attn,
        layout: AttentionLayout,
        q_gen: torch.Tensor,
        k_gen: torch.Tensor,
        v_gen: torch.Tensor,
        prefix_kv: tuple[torch.Tensor, torch.Tensor] | None,
        cache: PrefixKVCache | None,
    ) -> torch.Tensor:
        """Each generation block attends to its own prefix and its own block.

        Runs of blocks share nothing, so with :class:`~.workers.ForwardWorkers` installed (``use_layout``) they are
        spread over its threads; each run is the same call either way.

        Returns:
            `torch.Tensor` of shape `[R, heads * head_dim]`: the attention output before ``to_add_out``.
        """
        runs, workers = layout.gen_runs, self._workers
        if workers is None or len(runs) < 2 or torch.is_grad_enabled():
            parts = [self._attend_run(attn, layout, run, q_gen, k_gen, v_gen, prefix_kv, cache) for run in runs]
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        out = q_gen.new_empty((q_gen.shape[0], q_gen.shape[1] * q_gen.shape[2]))

        def attend(share: Sequence[GenRun]) -> None:
            for run in share:
                out[run.start : run.start + run.count * run.length] = self._attend_run(
                    attn, layout, run, q_gen, k_gen, v_gen, prefix_kv, cache
                )

        workers.run(runs, attend)
        return out

    def _attend_run(
        self,
        attn,
        layout: AttentionLayout,
        run: GenRun,
        q_gen: torch.Tensor,
        k_gen: torch.Tensor,
        v_gen: torch.Tensor,
        prefix_kv: tuple[torch.Tensor, torch.Tensor] | None,
        cache: PrefixKVCache | None,
    ) -> torch.Tensor:
        """One run of blocks: ONE batched attention call, its prefix keys/values broadcast over the blocks."""
        heads, kv_heads, head_dim = attn.num_attention_heads, attn.num_key_value_heads, attn.head_dim
        slot = layout.prefixes[run.prefix]
        if slot.und_range is not None:
            p_start, p_end = slot.und_range
            prefix_k, prefix_v = prefix_kv[0][p_start:p_end], prefix_kv[1][p_start:p_end]
        else:
            prefix_k, prefix_v = cache.get(slot.key, attn)
        prefix_len = prefix_k.shape[0]
        stop = run.start + run.count * run.length
        q = q_gen[run.start : stop].view(run.count, run.length, heads, head_dim)
        # The prefix keys/values are broadcast over the run's blocks (an expand, not a copy of activations).
        k = torch.cat(
            [
                prefix_k.unsqueeze(0).expand(run.count, prefix_len, kv_heads, head_dim),
                k_gen[run.start : stop].view(run.count, run.length, kv_heads, head_dim),
            ],
            dim=1,
        )
        v = torch.cat(
            [
                prefix_v.unsqueeze(0).expand(run.count, prefix_len, kv_heads, head_dim),
                v_gen[run.start : stop].view(run.count, run.length, kv_heads, head_dim),
            ],
            dim=1,
        )
        out = dispatch_attention_fn(q, k, v, is_causal=False, enable_gqa=True, backend=self._attention_backend)
        return out.reshape(run.count * run.length, heads * head_dim)


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
