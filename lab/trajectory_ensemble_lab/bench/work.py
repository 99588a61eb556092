"""Work per group: the floating-point operations each path performs, counted, not timed.

Latency ratios move with the machine; the work a path does does not. Counting it tells a reader how much of a
measured ratio comes from doing less (the prefix once, one conditioning frame instead of ``chunk + 1``) and how much
from doing the same work faster (larger kernels keeping a device busy). On a CPU core running near its GEMM peak
the work ratio is close to a floor for the latency ratio.

Counted with ``torch.utils.flop_counter.FlopCounterMode`` around one real call of each path, in one untimed run.
Three operator kinds carry all of it here:

- ``gemm``: ``mm``, ``addmm``, ``bmm``, ``baddbmm`` (projections, MLPs, heads);
- ``attention``: the fused scaled-dot-product kernels (the transformer's, and the VAE's per-frame mid-block
  attention). torch's own formulas do not cover the CPU flash kernel and count a causal call as a full one, so
  this module supplies one formula for all of them: grouped-query attention counts as if each key/value head were
  repeated for its query heads (the arithmetic the kernel does), and a causal call counts the unmasked half of
  the score matrix (what a flash kernel computes);
- ``conv``: convolutions (the VAE encode).

Anything else the counter knows (none here) goes to ``other``. Elementwise work (norms, rotary, activations) is not
counted: it is memory-bound, and its cost shows in the latency, not in these figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

_aten = torch.ops.aten

GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm")

# (op, index of ``is_causal`` when passed positionally): flash kernels take (q, k, v, dropout_p, is_causal, ...),
# the efficient and cuDNN ones (q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, ...).
_ATTENTION_OPS: tuple[tuple[str, int], ...] = (
    ("_scaled_dot_product_flash_attention_for_cpu", 4),
    ("_scaled_dot_product_flash_attention", 4),
    ("_scaled_dot_product_efficient_attention", 6),
    ("_scaled_dot_product_cudnn_attention", 6),
)


def attention_flops(
    query_shape: tuple[int, ...], key_shape: tuple[int, ...], value_shape: tuple[int, ...], is_causal: bool = False
) -> int:
    """Forward FLOPs of ``softmax(q kᵀ) v`` (two GEMMs; the softmax is not counted).

    Args:
        query_shape (`tuple[int, ...]`): ``[B, H, Lq, D]``.
        key_shape (`tuple[int, ...]`): ``[B, Hkv, Lk, D]`` with ``H % Hkv == 0`` (grouped-query attention).
        value_shape (`tuple[int, ...]`): ``[B, Hkv, Lk, Dv]``.
        is_causal (`bool`): Count only the scores on or below the diagonal (aligned at the top left, as torch's
            ``is_causal`` is), which is what a flash kernel computes.

    Returns:
        `int`: ``2 * B * H * pairs * (D + Dv)``, ``pairs`` being the query/key pairs scored.
    """
    batch, heads, q_len, head_dim = query_shape
    kv_batch, kv_heads, k_len, k_dim = key_shape
    value_dim = value_shape[-1]
    if kv_batch != batch or k_dim != head_dim or value_shape[2] != k_len or heads % kv_heads:
        raise ValueError(f"Incompatible attention shapes q={tuple(query_shape)!r}, k={tuple(key_shape)!r}, "
                         f"v={tuple(value_shape)!r}.")
    if is_causal:
        # Row i sees keys 0..i (clipped to k_len).
        seen = min(q_len, k_len)
        pairs = seen * (seen + 1) // 2 + max(0, q_len - k_len) * k_len
    else:
        pairs = q_len * k_len
    return 2 * batch * heads * pairs * (head_dim + value_dim)


def _attention_formula(causal_index: int) -> Callable[..., int]:
    def formula(query_shape, key_shape, value_shape, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
        is_causal = kwargs.get("is_causal", args[causal_index - 3] if len(args) > causal_index - 3 else False)
        return attention_flops(tuple(query_shape), tuple(key_shape), tuple(value_shape), bool(is_causal))

    return formula


def _custom_mapping() -> dict[Any, Callable[..., int]]:
    mapping = {}
    for name, causal_index in _ATTENTION_OPS:
        op = getattr(_aten, name, None)
        if op is not None:
            mapping[op] = _attention_formula(causal_index)
    return mapping


def _kind(op: Any) -> str:
    name = str(op).split(".")[-1]
    if name in GEMM_OPS:
        return "gemm"
    if "attention" in name:
        return "attention"
    if "conv" in name:
        return "conv"
    return "other"


@dataclass(frozen=True)
class Work:
    """Forward FLOPs of one call, by operator kind (see the module docstring)."""

    gemm: int = 0
    attention: int = 0
    conv: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.gemm + self.attention + self.conv + self.other

    def scaled(self, factor: int) -> Work:
        """``factor`` calls' worth (the sequential reference for N is N calls of identical work)."""
        return Work(self.gemm * factor, self.attention * factor, self.conv * factor, self.other * factor)

    def as_gflop(self) -> dict[str, float]:
        """GFLOP per kind plus ``total``, for the JSON."""
        return {"gemm": self.gemm / 1e9, "attention": self.attention / 1e9, "conv": self.conv / 1e9,
                "other": self.other / 1e9, "total": self.total / 1e9}


def count_work(fn: Callable[[], Any]) -> Work:
    """Run ``fn`` once under a FLOP counter and return what it did, by kind.

    Args:
        fn (`Callable[[], Any]`): One call of a path (its result is discarded).
    """
    with FlopCounterMode(display=False, custom_mapping=_custom_mapping()) as counter:
        fn()
    totals = {"gemm": 0, "attention": 0, "conv": 0, "other": 0}
    for op, flops in counter.get_flop_counts().get("Global", {}).items():
        totals[_kind(op)] += int(flops)
    return Work(**totals)
