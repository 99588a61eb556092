"""The prefix cache: per-layer keys/values of text prefixes, computed once and served to every later forward.

The text pathway never sees a generation token, so a prefix's keys and values are the same at every denoising step
and for every group with the same instruction. :class:`.attention.FanoutAttnProcessor` writes them here at a
prefix's first step and reads them afterwards; :func:`.packing.pack_forward` leaves cached prefixes out of the
sequence.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

import torch


class PrefixKVCache:
    """Per-layer keys/values of text prefixes: kept while their group runs, and retained for later groups.

    Entries are written layer by layer during a forward and only become usable once :meth:`commit` marks the forward
    complete, so a forward aborted half-way never leaves a half-filled prefix behind.

    A robot sends the same instruction goal after goal, and K clients of one server send the same instruction at
    once, so the prefixes of a finished forward are also retained (up to ``retain`` of them, least recently used
    out), keyed by their content (token ids and positions). A later group adopts them (:meth:`adopt`) whatever
    forward it is in: the text pathway computes each prefix on its own (BLAS picks GEMM kernels by row count, so a
    prefix GEMM'd together with others could differ in the last bits), so what it gets is bit for bit what it would
    have computed.

    Args:
        retain (`int`): Prefixes kept across groups; 0 keeps them only while their group runs.
    """

    def __init__(self, retain: int = 8) -> None:
        if retain < 0:
            raise ValueError(f"retain must be >= 0, got {retain!r}.")
        self.retain = retain
        self.adopted = 0
        """Prefixes served from an earlier group's forward so far (their text pathway was not run again)."""
        # Prefix key -> id(attention module) -> (keys, values).
        self._entries: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        self._complete: set[int] = set()
        # Prefix content -> id(attention module) -> (keys, values), least recently used first.
        self._retained: OrderedDict[bytes, dict[int, tuple[torch.Tensor, torch.Tensor]]] = OrderedDict()

    def is_complete(self, key: int) -> bool:
        return key in self._complete

    def store(self, key: int, attn: torch.nn.Module, keys: torch.Tensor, values: torch.Tensor) -> None:
        # Cloned: a view would keep the whole packed forward's activations alive.
        self._entries.setdefault(key, {})[id(attn)] = (keys.clone(), values.clone())

    def get(self, key: int, attn: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
        return self._entries[key][id(attn)]

    def commit(self, keys: Iterable[int]) -> None:
        self._complete.update(keys)

    def retain_forward(self, computed: Sequence[tuple[int, bytes]]) -> None:
        """Retain the prefixes a complete forward computed, for later groups.

        Args:
            computed (`Sequence[tuple[int, bytes]]`): ``(key, content)`` of each prefix computed in the forward
                (``content``: :attr:`~.packing.PrefixSegment.content_key`).
        """
        if self.retain == 0:
            return
        for key, content in computed:
            self._retained[content] = dict(self._entries[key])
            self._retained.move_to_end(content)
        while len(self._retained) > self.retain:
            self._retained.popitem(last=False)

    def adopt(self, pending: Sequence[tuple[int, bytes]]) -> int:
        """Serve a forward's prefixes from earlier forwards that computed the same content.

        Bitwise: the text pathway computes every prefix on its own (:meth:`FanoutAttnProcessor.text_pathway`), so
        its keys/values are the same whichever forward computed them and whatever shared it.

        Args:
            pending (`Sequence[tuple[int, bytes]]`): ``(key, content)`` of the prefixes this forward would compute.

        Returns:
            `int`: How many were adopted (they are complete now and will not be computed); the others are left as
            they were.
        """
        adopted = 0
        for key, content in pending:
            layers = self._retained.get(content)
            if layers is None:
                continue
            self._entries[key] = dict(layers)
            self._complete.add(key)
            self._retained.move_to_end(content)
            adopted += 1
        self.adopted += adopted
        return adopted

    def drop(self, keys: Iterable[int]) -> None:
        """Forget a finished group's prefixes (retained copies of them stay)."""
        for key in keys:
            self._complete.discard(key)
            self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget everything, retained prefixes included (new weights make them stale)."""
        self._entries.clear()
        self._complete.clear()
        self._retained.clear()

    @property
    def retained(self) -> int:
        """Prefixes retained for later groups."""
        return len(self._retained)

    def __len__(self) -> int:
        return len(self._complete)
