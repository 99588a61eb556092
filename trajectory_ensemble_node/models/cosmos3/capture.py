"""Per-step overhead removal: the decoder stack of a denoising forward, captured once per shape and replayed.

Modes (:data:`STEP_CAPTURE_MODES`): ``off``, ``cuda_graph`` (CUDA only), ``compile``. Only forwards that read the
prefix cache without writing it are captured, with autograd off; a cancel still lands within one step. Why and what a
shape key holds: docs/benchmarks.md, "Step capture".
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer

from ...errors import InvalidSpecError, StepCaptureError
from .attention import AttentionLayout, FanoutAttnProcessor, PrefixSlot

STEP_CAPTURE_MODES = ("off", "cuda_graph", "compile")
"""Values of the ``step_capture`` keyword and node parameter."""

DEFAULT_MAX_ENTRIES = 16
"""Shape keys kept at once (least recently used out): each CUDA graph holds a private memory pool."""

RotaryTables = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

_stock_stack = Cosmos3OmniTransformer._run_decoder_stack
# Transformer -> its StepCapture. Weak, and keyed by the object: a deep copy of a transformer is not registered, so
# its (copied) hook runs the stock stack.
_CAPTURES: weakref.WeakKeyDictionary[torch.nn.Module, StepCapture] = weakref.WeakKeyDictionary()


def check_step_capture(mode: Any, device: torch.device | str) -> str:
    """Validate a ``step_capture`` value for ``device``.

    Args:
        mode (`str`): One of :data:`STEP_CAPTURE_MODES`.
        device (`torch.device` or `str`): Where the transformer runs.

    Returns:
        `str`: ``mode``.

    Raises:
        InvalidSpecError: ``mode`` is not one of the modes.
        StepCaptureError: ``"cuda_graph"`` on a device that is not CUDA, or CUDA is not available.
    """
    if mode not in STEP_CAPTURE_MODES:
        raise InvalidSpecError(f"step_capture must be one of {list(STEP_CAPTURE_MODES)}, got {mode!r}.")
    device = torch.device(device)
    if mode == "cuda_graph" and (device.type != "cuda" or not torch.cuda.is_available()):
        raise StepCaptureError(
            f"step_capture 'cuda_graph' needs a CUDA device, but the model runs on {str(device)!r}"
            + ("" if torch.cuda.is_available() else " and CUDA is not available") + "; use 'compile' or 'off'."
        )
    return mode


class StaticPrefixKV:
    """The prefix keys/values a captured forward reads: fixed tensors, refilled from the live cache per group.

    Stands in for :class:`~.prefix_cache.PrefixKVCache` inside a captured forward (same ``get``), with prefix keys
    replaced by their positions in the layout, so the captured code never depends on which group it serves.

    Args:
        slots (`dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]`): Canonical prefix key -> id(attention
            module) -> static ``(keys, values)``, each ``[prefix_len, kv_heads, head_dim]``.
    """

    def __init__(self, slots: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]]) -> None:
        self.slots = slots
        self._sources: list[tuple[torch.Tensor, torch.Tensor]] = []

    def get(self, key: int, attn: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return self.slots[key][id(attn)]

    def store(self, key: int, attn: torch.nn.Module, keys: torch.Tensor, values: torch.Tensor) -> None:
        # Only forwards that compute no prefix are captured, so nothing may ever be stored here.
        raise StepCaptureError("a captured forward tried to store prefix keys/values; it must run eagerly")

    def refill(self, sources: list[tuple[int, int, tuple[torch.Tensor, torch.Tensor]]]) -> bool:
        """Copy the live cache's tensors in when they are other objects than last time; returns whether it copied.

        Holding the last sources keeps them alive, which is what makes the identity check safe: a freed tensor's
        address could be reused by a new group's keys.
        """
        tensors = [pair for _, _, pair in sources]
        if len(tensors) == len(self._sources) and all(
            a[0] is b[0] and a[1] is b[1] for a, b in zip(tensors, self._sources)
        ):
            return False
        for key, attn_id, (keys, values) in sources:
            static_k, static_v = self.slots[key][attn_id]
            static_k.copy_(keys)
            static_v.copy_(values)
        self._sources = tensors
        return True


@dataclass
class CaptureEntry:
    """One shape key: its canonical layout, static buffers and the callable that runs the captured stack.

    Args:
        key (`tuple`): See :meth:`StepCapture.key`.
        layout (`AttentionLayout`): The layout with prefix keys replaced by positions.
        inputs (`tuple[torch.Tensor, ...]`): Static ``und_seq``, ``gen_seq`` and the four rotary tables.
        kv (`StaticPrefixKV`, *optional*): Static keys/values of the cached prefixes (``None`` without a cache).
        runner (`Callable[[], tuple[torch.Tensor, torch.Tensor]]`): Runs the stack on ``inputs``.
        replays (`int`): Forwards served by this entry.
        kv_refills (`int`): Times the prefix keys/values were copied in (once per group that uses the entry).
    """

    key: tuple
    layout: AttentionLayout
    inputs: tuple[torch.Tensor, ...]
    kv: StaticPrefixKV | None
    runner: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    replays: int = 0
    kv_refills: int = 0
    graph: Any = field(default=None, repr=False)


def _hooked_stack(self: Cosmos3OmniTransformer, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                  rotary_emb: RotaryTables) -> tuple[torch.Tensor, torch.Tensor]:
    capture = _CAPTURES.get(self)
    if capture is None or capture.mode == "off":
        return _stock_stack(self, und_seq, gen_seq, rotary_emb)
    return capture.run_stack(und_seq, gen_seq, rotary_emb)


class StepCapture:
    """Captures the decoder stack of one transformer's forwards, per shape key (docs/benchmarks.md, "Step capture").

    Installed on first use of a mode other than ``"off"``; until then the transformer is untouched. Forwards run
    outside :meth:`active` (upstream pipeline calls on the same transformer, for instance) are always stock.

    Args:
        transformer (`Cosmos3OmniTransformer`): The model whose stack is captured.
        processor (`FanoutAttnProcessor`): Its installed fan-out processor.
        row_block_rows (`int`, *optional*): The adapter's row blocking, re-applied inside captured forwards.
        max_entries (`int`): Shape keys kept (least recently used out).
        warmup (`int`): Eager runs on a side stream before a CUDA graph is recorded (cuBLAS and allocator set-up
            must not happen inside the capture).
    """

    def __init__(self, transformer: Cosmos3OmniTransformer, processor: FanoutAttnProcessor, *,
                 row_block_rows: int | None = None, max_entries: int = DEFAULT_MAX_ENTRIES, warmup: int = 2) -> None:
        if max_entries < 1:
            raise InvalidSpecError(f"max_entries must be >= 1, got {max_entries!r}.")
        self.transformer = transformer
        self.processor = processor
        self.row_block_rows = row_block_rows
        self.max_entries = max_entries
        self.warmup = warmup
        self.mode = "off"
        self.entries: OrderedDict[tuple, CaptureEntry] = OrderedDict()
        self.captures = 0
        """Entries built (graphs recorded or functions compiled) so far, evicted ones included."""
        self.eager_forwards = 0
        """Forwards run with a capture mode active that had to run eagerly (a prefix computed into the cache)."""
        self.evictions = 0

    @contextlib.contextmanager
    def active(self, mode: str) -> Iterator[None]:
        """Capture the stack of the forwards run inside the block with ``mode`` (``"off"``: stock)."""
        if mode not in STEP_CAPTURE_MODES:
            raise InvalidSpecError(f"step_capture must be one of {list(STEP_CAPTURE_MODES)}, got {mode!r}.")
        if mode != "off":
            self._install()
        previous, self.mode = self.mode, mode
        try:
            yield
        finally:
            self.mode = previous

    def _install(self) -> None:
        if _CAPTURES.get(self.transformer) is not self:
            _CAPTURES[self.transformer] = self
            # A bound method of the transformer itself: a deep copy rebinds it to the copy, which is unregistered.
            self.transformer._run_decoder_stack = types.MethodType(_hooked_stack, self.transformer)

    def stats(self) -> dict[str, int | str]:
        """Counters for metrics and benchmarks."""
        return {"mode": self.mode, "entries": len(self.entries), "captures": self.captures,
                "replays": sum(e.replays for e in self.entries.values()), "eager_forwards": self.eager_forwards,
                "evictions": self.evictions}

    # --- per forward ------------------------------------------------------------------------------------------------

    def capturable(self) -> bool:
        """Whether the forward in progress may run captured (docs/benchmarks.md, "Step capture")."""
        layout, cache = self.processor.layout, self.processor.cache
        return layout is not None and not torch.is_grad_enabled() and (cache is None or not layout.computed)

    def key(self, und_seq: torch.Tensor, gen_seq: torch.Tensor) -> tuple:
        """The shape key of the forward in progress (inside ``processor.use_layout``)."""
        layout, cache = self.processor.layout, self.processor.cache
        canonical = _canonical(layout)
        kv_lengths = tuple(
            int(cache.get(slot.key, self.transformer.layers[0].self_attn)[0].shape[0]) if slot.und_range is None
            else None
            for slot in layout.prefixes
        ) if cache is not None else ()
        blocks = layout.row_blocks(self._row_block_rows()) if self._row_block_rows() else None
        return (self.mode, tuple(und_seq.shape), tuple(gen_seq.shape), gen_seq.dtype, str(gen_seq.device), canonical,
                kv_lengths, cache is not None, blocks)

    def run_stack(self, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                  rotary_emb: RotaryTables) -> tuple[torch.Tensor, torch.Tensor]:
        """``_run_decoder_stack`` through the entry of this forward's shape key (eager when not capturable)."""
        if not self.capturable():
            self.eager_forwards += 1
            return _stock_stack(self.transformer, und_seq, gen_seq, rotary_emb)
        key = self.key(und_seq, gen_seq)
        entry = self.entries.get(key)
        if entry is None:
            entry = self._new_entry(key, und_seq, gen_seq, rotary_emb)
        self.entries.move_to_end(key)
        self._fill(entry, und_seq, gen_seq, rotary_emb)
        # The per-layer cancel check cannot run inside a graph: check once, before the replay.
        self.processor.check_abort()
        if entry.runner is None:
            entry.runner = self._build_runner(entry)
            self.captures += 1
        outputs = self._replay(entry)
        entry.replays += 1
        return outputs

    def _new_entry(self, key: tuple, und_seq: torch.Tensor, gen_seq: torch.Tensor,
                   rotary_emb: RotaryTables) -> CaptureEntry:
        layout, cache = self.processor.layout, self.processor.cache
        kv = None
        if cache is not None:
            kv = StaticPrefixKV({
                index: {id(layer.self_attn): tuple(t.clone() for t in cache.get(slot.key, layer.self_attn))
                        for layer in self.transformer.layers}
                for index, slot in enumerate(layout.prefixes) if slot.und_range is None
            })
        inputs = tuple(t.clone() for t in (und_seq, gen_seq, *rotary_emb))
        entry = CaptureEntry(key=key, layout=_canonical(layout), inputs=inputs, kv=kv)
        self.entries[key] = entry
        while len(self.entries) > self.max_entries:
            _, old = self.entries.popitem(last=False)
            old.runner = old.graph = None
            self.evictions += 1
        return entry

    def _fill(self, entry: CaptureEntry, und_seq: torch.Tensor, gen_seq: torch.Tensor,
              rotary_emb: RotaryTables) -> None:
        for static, value in zip(entry.inputs, (und_seq, gen_seq, *rotary_emb)):
            static.copy_(value)
        if entry.kv is not None:
            layout, cache = self.processor.layout, self.processor.cache
            sources = [(index, id(layer.self_attn), cache.get(slot.key, layer.self_attn))
                       for index, slot in enumerate(layout.prefixes) if slot.und_range is None
                       for layer in self.transformer.layers]
            if entry.kv.refill(sources):
                entry.kv_refills += 1

    def _row_block_rows(self) -> int | None:
        # Compiled code runs whole layers: traced row blocks unroll once per candidate block, so compile time grew
        # with N (tiny config, 2-core host: 55 s at N=1, 325 s at N=4), and inductor's fusion already avoids the
        # large intermediates row blocks exist for. A CUDA graph replays the eager kernels, so it keeps them.
        return self.row_block_rows if self.mode == "cuda_graph" else None

    @contextlib.contextmanager
    def _entry_layout(self, entry: CaptureEntry) -> Iterator[None]:
        # The captured code reads the canonical layout and the static keys/values, never the live ones, and has no
        # per-layer cancel callback (checked before the replay instead).
        with self.processor.use_layout(entry.layout, None, entry.kv, self._row_block_rows()):
            yield

    def _replay(self, entry: CaptureEntry) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mode == "cuda_graph":
            entry.graph.replay()
            return entry.runner()
        with self._entry_layout(entry), torch._dynamo.config.patch(recompile_limit=self.max_entries * 2 + 8):
            return entry.runner()

    # --- building -----------------------------------------------------------------------------------------------------

    def _build_runner(self, entry: CaptureEntry) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        transformer = self.transformer

        def stack(und, gen, cos_und, sin_und, cos_gen, sin_gen):
            return _stock_stack(transformer, und, gen, (cos_und, sin_und, cos_gen, sin_gen))

        if self.mode == "compile":
            # One code object for every entry; dynamic=False keeps each entry's shapes static (no symbolic-shape
            # recompile), and the recompile limit is raised per call in ``_replay`` so entries are not dropped.
            compile_mode = "reduce-overhead" if entry.inputs[1].device.type == "cuda" else None
            compiled = torch.compile(stack, dynamic=False, mode=compile_mode)
            return lambda: compiled(*entry.inputs)
        if self.mode == "cuda_graph":
            return self._record_graph(entry, stack)
        raise StepCaptureError(f"no runner for step_capture {self.mode!r}")

    def _record_graph(self, entry: CaptureEntry, stack: Callable) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        device = entry.inputs[1].device
        if device.type != "cuda":
            raise StepCaptureError(f"step_capture 'cuda_graph' needs a CUDA device, got {str(device)!r}.")
        try:
            with self._entry_layout(entry):
                side = torch.cuda.Stream(device)
                side.wait_stream(torch.cuda.current_stream(device))
                with torch.cuda.stream(side):
                    for _ in range(self.warmup):
                        stack(*entry.inputs)
                torch.cuda.current_stream(device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                # thread_local: the node's other threads may touch CUDA while the engine thread records.
                with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                    outputs = stack(*entry.inputs)
        except RuntimeError as error:
            raise StepCaptureError(f"recording a CUDA graph for shape key {entry.key!r} failed: {error}") from error
        entry.graph = graph
        return lambda: outputs


def _canonical(layout: AttentionLayout) -> AttentionLayout:
    """``layout`` with each prefix's identity replaced by its position (what a captured forward may depend on)."""
    return AttentionLayout(
        prefixes=tuple(PrefixSlot(key=index, und_range=slot.und_range) for index, slot in enumerate(layout.prefixes)),
        gen_runs=layout.gen_runs,
    )


__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "STEP_CAPTURE_MODES",
    "CaptureEntry",
    "StaticPrefixKV",
    "StepCapture",
    "StepCaptureError",
    "check_step_capture",
]
