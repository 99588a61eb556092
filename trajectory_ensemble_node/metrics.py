"""Per-group metrics: names, units and the two measurements that depend on the device.

Metric keys carry their unit (``_ms``, ``_bytes``) so that ``/diagnostics`` can show them verbatim.
"""

from __future__ import annotations

import resource
import sys
import time

import torch

# Every key an engine result carries in ``EnsembleResult.metrics`` (others may be added by adapters).
GROUP_METRIC_KEYS = (
    "candidate_count",
    "physical_forwards",
    "microbatches",
    "fallback_reason",
    "co_batched_groups_max",
    "num_inference_steps",
    "retries",
    "queue_ms",
    "encode_ms",
    "denoise_ms",
    "action_postprocess_ms",
    "reduce_ms",
    "total_ms",
    "peak_memory_bytes",
    "weights_version",
)


def now_ms() -> float:
    """Monotonic clock in milliseconds."""
    return time.perf_counter() * 1e3


def peak_memory_bytes(device: torch.device | str) -> int:
    """Peak memory so far: CUDA max allocated on a GPU, the process RSS high-water mark on CPU.

    On CPU the RSS high-water mark is process-wide and never decreases, so it bounds a group's peak from above;
    the benchmark measures each case in a fresh subprocess to get per-case figures.
    """
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is KiB on Linux and bytes on macOS.
    return int(rss if sys.platform == "darwin" else rss * 1024)


def reset_peak_memory(device: torch.device | str) -> None:
    """Reset the CUDA peak counter (no-op on CPU, where the RSS high-water mark cannot be reset)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)
