"""Per-group metrics: names, units, the engine's group counters, and the two measurements that depend on the device.

Keys carry their unit (``_ms``, ``_bytes``). Each typed report (the counters here, steps, validity, continuity,
uncertainty, novelty) has one ``as_metrics()`` and one ``from_metrics()``, so no other module reads a metric by its
key; a sequence of floats becomes text only where it leaves for a wire (:func:`numbers_text`).
"""

from __future__ import annotations

import math
import resource
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch


@dataclass(frozen=True)
class GroupCounters:
    """The engine's counts, timings and memory of one finished group: every key an engine result carries in
    ``EnsembleResult.metrics`` (:data:`GROUP_METRIC_KEYS`, its fields in order; units in the names; adapters may add
    others). ``None``: absent from the mapping it was read from.

    Args:
        candidate_count (`int`), physical_forwards (`int`), microbatches (`int`), fallback_reason (`str`,
        *optional*), co_batched_groups_max (`int`), num_inference_steps (`int`, *optional*), retries (`int`),
        queue_ms (`float`), encode_ms (`float`), denoise_ms (`float`), action_postprocess_ms (`float`),
        reduce_ms (`float`), total_ms (`float`), peak_memory_bytes (`int`), weights_version (`int`).
    """

    candidate_count: int | None = None
    physical_forwards: int | None = None
    microbatches: int | None = None
    fallback_reason: str | None = None
    co_batched_groups_max: int | None = None
    num_inference_steps: int | None = None
    retries: int | None = None
    queue_ms: float | None = None
    encode_ms: float | None = None
    denoise_ms: float | None = None
    action_postprocess_ms: float | None = None
    reduce_ms: float | None = None
    total_ms: float | None = None
    peak_memory_bytes: int | None = None
    weights_version: int | None = None

    def as_metrics(self) -> dict[str, Any]:
        """Every counter under its key, in :data:`GROUP_METRIC_KEYS` order (``None`` included, as results carry it)."""
        return {key: getattr(self, key) for key in GROUP_METRIC_KEYS}

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any]) -> GroupCounters:
        """The counters in a flat metrics mapping (a result's, or one that came back over a wire)."""
        return cls(**{key: metrics.get(key) for key in GROUP_METRIC_KEYS})


GROUP_METRIC_KEYS = tuple(f.name for f in fields(GroupCounters))
"""The keys of :class:`GroupCounters`, in the order a result's metrics list them."""


@dataclass(frozen=True)
class AdapterExtras:
    """The adapter's scalar per-group extras: they fill keys no engine report has set, never replace one.

    Args:
        entries (`tuple[tuple[str, Any], ...]`): ``(key, value)`` pairs in the adapter's order.
    """

    entries: tuple[tuple[str, Any], ...] = ()
    fills_gaps = True  # read by EnsembleResult when it flattens its reports

    def as_metrics(self) -> dict[str, Any]:
        """The entries as a mapping."""
        return dict(self.entries)


def numbers_text(values: Sequence[float]) -> str:
    """A sequence of numbers as one wire text field: 4 significant digits each, comma-separated.

    The only place a number becomes part of a string list; nothing parses it back (in-process readers take the
    numbers from the typed report, see :func:`numbers_as_sent`).
    """
    return ",".join(f"{v:.4g}" for v in values)


def numbers_as_sent(values: Sequence[float]) -> tuple[float, ...]:
    """The numbers :func:`numbers_text` sends, as numbers: each rounded to 4 significant digits (so a typed message
    field carries the same values the text does)."""
    return tuple(_significant(float(v), 4) for v in values)


def _significant(value: float, digits: int) -> float:
    if value == 0 or value != value or value in (float("inf"), float("-inf")):
        return value
    # round() is correctly rounded, so this is the double nearest to the '.4g' decimal, as float(f"{v:.4g}") is.
    exponent = _decimal_exponent(value)
    return round(value, digits - 1 - exponent)


def _decimal_exponent(value: float) -> int:
    # The exponent of the first significant digit of |value| once rounded as '.4g' rounds it (9.9996 -> 10.00).
    exponent = math.floor(math.log10(abs(value)))
    if abs(round(value, 3 - exponent)) >= 10.0 ** (exponent + 1):
        exponent += 1
    return exponent


def wire_metrics(metrics: Mapping[str, Any]) -> dict[str, bool | int | float | str | None]:
    """A flat metrics mapping as a wire carries it: scalars and ``None`` as they are, a sequence of numbers as
    :func:`numbers_text`; anything else (tensors, payloads) stays behind."""
    out: dict[str, bool | int | float | str | None] = {}
    for key, value in metrics.items():
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[key] = value
        elif isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value):
            out[key] = numbers_text(value)
    return out


def now_ms() -> float:
    """Monotonic clock in milliseconds."""
    return time.perf_counter() * 1e3


def _linux_vm_hwm() -> int | None:
    # VmHWM belongs to the address space, so unlike ru_maxrss it does not inherit the peak of a process that
    # exec'd into this one (the ROS wheels' bootstrapper re-execs Python), and clear_refs can reset it.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_memory_bytes(device: torch.device | str) -> int:
    """Peak memory so far: CUDA max allocated on a GPU, the RSS high-water mark on CPU.

    On CPU this is process-wide (weights, other groups and Python included), so it bounds a group's peak from
    above. On Linux it is ``VmHWM``; elsewhere ``ru_maxrss``.
    """
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated(device))
    hwm = _linux_vm_hwm() if sys.platform.startswith("linux") else None
    if hwm is not None:
        return hwm
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is KiB on Linux and bytes on macOS.
    return int(rss if sys.platform == "darwin" else rss * 1024)
