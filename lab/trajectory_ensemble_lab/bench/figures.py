"""The benchmark's yardsticks, shared by the report, the table and the plot: targets, units, the faster topology."""

from __future__ import annotations

from typing import Any

import torch

from .runner import CaseResult

# design.md targets, all measured as ratios within one run.
TARGETS = {
    "ratio_n8_max": 0.30,
    "n1_vs_one_upstream_call_max": 0.40,
    "memory_n8_over_n1_max": 2.0,
}
MIB = 1024 * 1024


# Below this difference of the medians the topologies are reported as a tie.
TIE_PCT = 1.0


def faster_topology(cases: list[CaseResult], device: torch.device) -> dict[str, Any]:
    """Which batched topology was faster for one N, and by how much.

    Decided on median CPU time on a CPU (load-independent: wall medians on a shared machine move with other work),
    on median wall time on CUDA. ``topology`` is ``"tie"`` when the medians differ by less than ``TIE_PCT`` percent.
    """
    by = "wall" if device.type == "cuda" else "cpu_time"
    values = {c.topology: (c.latency_s.median if by == "wall" else c.cpu_s.median) for c in cases}
    ranked = sorted(values, key=values.get)
    margin = 100.0 * (values[ranked[-1]] / values[ranked[0]] - 1.0) if len(ranked) > 1 else 0.0
    return {
        "topology": ranked[0] if margin >= TIE_PCT or len(ranked) == 1 else "tie",
        "decided_by": by,
        "margin_pct": round(margin, 2),
        "wall_s": {c.topology: round(c.latency_s.median, 4) for c in cases},
        "cpu_s": {c.topology: round(c.cpu_s.median, 4) for c in cases},
    }
