"""The benchmark plot: per dtype, latency, speed-up ratio and peak memory against N, sequential vs batched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .figures import MIB, TARGETS
from .runner import CaseResult, Settings, VariantResult

# One colour per path, the same in every panel.
COLORS = {"sequential": "#444444", "fused": "#1f77b4", "separate": "#ff7f0e"}
MARKERS = {"sequential": "s", "fused": "o", "separate": "^"}


def _label(topology: str | None) -> str:
    return "sequential upstream (N calls)" if topology is None else f"batched, CFG {topology}"


def _inverse(values: Any) -> Any:
    import numpy as np

    with np.errstate(divide="ignore"):
        return 1.0 / np.asarray(values, dtype=float)


def _peak_mib(case: CaseResult) -> float | None:
    memory = case.memory or {}
    peak = memory.get("peak_rss_bytes", memory.get("peak_allocated_bytes"))
    return None if peak is None else peak / MIB


def plot(document: dict[str, Any], variants: list[VariantResult], settings: Settings, path: Path) -> None:
    """Write the PNG to ``path``.

    Args:
        document (`dict`): The JSON document (for the title).
        variants (`list[VariantResult]`): One row of panels each.
        settings (`Settings`): Ns and topologies.
        path (`Path`): Output file.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = list(settings.ns)
    fig, axes = plt.subplots(len(variants), 3, figsize=(16, 4.8 * len(variants)), squeeze=False)
    for row, variant in zip(axes, variants):
        ax_lat, ax_ratio, ax_mem = row
        series: list[tuple[str | None, list[CaseResult]]] = [(None, [variant.case("sequential", None, n) for n in ns])]
        series += [(t, [variant.case("batched", t, n) for n in ns]) for t in settings.topologies]
        for topo, cases in series:
            key = topo or "sequential"
            med = [c.latency_s.median for c in cases]
            err = [[m - c.latency_s.min for m, c in zip(med, cases)], [c.latency_s.max - m for m, c in zip(med, cases)]]
            ax_lat.errorbar(ns, med, yerr=err, color=COLORS.get(key), marker=MARKERS.get(key), capsize=3,
                            label=_label(topo))
            if topo is not None:
                ratios = [c.ratio_vs_sequential.median for c in cases]
                ax_ratio.plot(ns, ratios, color=COLORS.get(key), marker=MARKERS.get(key), label=_label(topo) + ", wall")
                ax_ratio.plot(ns, [c.cpu_ratio_vs_sequential.median for c in cases], color=COLORS.get(key),
                              linestyle="--", linewidth=1, alpha=0.7, label=_label(topo) + ", CPU time")
                # Labels above the first topology's points and below the others', so they never overlap.
                above = topo == settings.topologies[0]
                for n, r in zip(ns, ratios):
                    ax_ratio.annotate(f"{r:.2f}", (n, r), textcoords="offset points", xytext=(0, 7 if above else -13),
                                      ha="center", fontsize=8, color=COLORS.get(key))
            peaks = [_peak_mib(c) for c in cases]
            if all(p is not None for p in peaks):
                ax_mem.plot(ns, peaks, color=COLORS.get(key), marker=MARKERS.get(key), label=_label(topo))

        ax_lat.set_title(f"{variant.dtype}: latency per observation (lower is better)")
        ax_lat.set_xlabel("candidates per observation, N")
        ax_lat.set_ylabel("wall time per group [s]\n(median, bars: min–max)")
        ax_lat.set_ylim(bottom=0)
        ax_lat.legend(fontsize=8)

        ax_ratio.axhline(1.0, color="#999999", linestyle=":", linewidth=1)
        ax_ratio.text(ns[0], 1.0, " no gain", va="bottom", fontsize=8, color="#666666")
        ax_ratio.axhline(TARGETS["ratio_n8_max"], color="#2ca02c", linestyle="--", linewidth=1)
        ax_ratio.text(ns[-1], TARGETS["ratio_n8_max"], f"design target at N=8: ≤ {TARGETS['ratio_n8_max']:.2f} ",
                      va="top", ha="right", fontsize=8, color="#2ca02c")
        ax_ratio.set_ylim(0.1, 1.15)
        # The same scale read as a speed-up: ratio r means the N candidates cost 1/r times less than N calls.
        speedup = ax_ratio.secondary_yaxis("right", functions=(_inverse, _inverse))
        speedup.set_yticks([1, 1.5, 2, 3, 5])
        speedup.set_yticklabels(["1×", "1.5×", "2×", "3×", "5×"])
        speedup.set_ylabel("speed-up over N upstream calls")
        ax_ratio.set_title(f"{variant.dtype}: batched time / sequential time (median of per-rep ratios)")
        ax_ratio.set_xlabel("candidates per observation, N")
        ax_ratio.set_ylabel("ratio (lower is better)")
        ax_ratio.legend(fontsize=8, loc="upper right")

        baseline = next((c.memory for c in variant.cases if c.path == "batched" and c.memory), None)
        if baseline:
            base = baseline.get("baseline_rss_bytes", baseline.get("baseline_allocated_bytes", 0)) / MIB
            ax_mem.axhline(base, color="#999999", linestyle=":", linewidth=1)
            ax_mem.text(ns[0], base, " baseline after model build", va="bottom", fontsize=8, color="#666666")
            is_cuda = "peak_allocated_bytes" in baseline
            ax_mem.set_ylabel("peak CUDA allocated [MiB]" if is_cuda else "peak RSS [MiB]\n(fresh process per case)")
            ax_mem.set_ylim(bottom=0)
            ax_mem.legend(fontsize=8)
        else:
            ax_mem.text(0.5, 0.5, "memory not measured (--memory skip)", ha="center", va="center",
                        transform=ax_mem.transAxes)
        ax_mem.set_title(f"{variant.dtype}: peak memory per group")
        ax_mem.set_xlabel("candidates per observation, N")
        for ax in row:
            ax.set_xticks(ns)
            ax.grid(alpha=0.3)

    settings_doc, machine = document["settings"], document["machine"]
    where = machine["gpu"]["name"] if machine.get("gpu") and settings.device.type == "cuda" else (
        f"CPU, {machine['logical_cores']} cores, {machine['torch_threads']} torch threads")
    fig.suptitle(
        f"Cosmos 3 '{settings_doc['model']}': N candidates in one batched path vs N upstream calls — {where}; "
        f"{settings_doc['steps']} steps, guidance {settings_doc['guidance']}, chunk {settings_doc['chunk']}, "
        f"tier {settings_doc['tier']}, {settings_doc['reps']} reps",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
