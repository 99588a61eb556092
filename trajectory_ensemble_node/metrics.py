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


def reset_peak_memory(device: torch.device | str) -> None:
    """Reset the CUDA peak counter (no-op on CPU, where the RSS high-water mark is not reset)."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats(device)
