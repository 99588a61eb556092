"""The markdown rendering of a benchmark document (what README's "## Benchmark" section shows)."""

from __future__ import annotations

from typing import Any

from .figures import MIB, faster_topology
from .runner import CaseResult, Settings, Stats, VariantResult



def _s(stats: Stats | None, digits: int = 2) -> str:
    if stats is None:
        return "–"
    return f"{stats.median:.{digits}f} [{stats.min:.{digits}f}–{stats.max:.{digits}f}]"


def _g(value: float) -> str:
    # Whole numbers for the real configs; three significant digits keep the tiny config's figures readable.
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _mib(case: CaseResult) -> str:
    memory = case.memory or {}
    peak = memory.get("peak_rss_bytes", memory.get("peak_allocated_bytes"))
    return "–" if peak is None else f"{peak / MIB:.0f}"


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _header(cells: list[str], align: list[str]) -> list[str]:
    return [_row(cells), "|" + "|".join(align) + "|"]


def _variant_tables(variant: VariantResult, settings: Settings) -> list[str]:
    topos = settings.topologies
    lines = [f"### {variant.dtype}: latency in seconds, median [min–max] of {settings.reps} reps", ""]
    cells = ["N", "sequential (N upstream calls)"]
    for topo in topos:
        cells += [f"batched {topo}", f"{topo} / sequential", "same, CPU time"]
    cells.append("faster batched topology (by, margin)")
    lines += _header(cells, ["--:"] + ["---"] * (len(cells) - 1))
    for n in settings.ns:
        seq = variant.case("sequential", None, n)
        row = [str(n), _s(seq.latency_s)]
        for topo in topos:
            case = variant.case("batched", topo, n)
            row += [_s(case.latency_s), f"**{case.ratio_vs_sequential.median:.2f}** "
                    f"[{case.ratio_vs_sequential.min:.2f}–{case.ratio_vs_sequential.max:.2f}]",
                    _s(case.cpu_ratio_vs_sequential)]
        winner = faster_topology([variant.case("batched", t, n) for t in topos], settings.device)
        by = "CPU time" if winner["decided_by"] == "cpu_time" else "wall"
        row.append(f"{winner['topology']} ({by}, {winner['margin_pct']:.1f}%)" if len(topos) > 1 else "–")
        lines.append(_row(row))

    lines += ["", f"### {variant.dtype}: work per group, conditioning encode, reduction, peak memory", ""]
    names = ["sequential"] + list(topos)
    counted = all(c.work for c in variant.cases)
    cells = ["N", "transformer forwards (" + " / ".join(names) + ")"]
    if counted:
        cells += ["GFLOP (" + " / ".join(names) + ")", "work ratio (" + " / ".join(topos) + ")",
                  "GFLOP/s (" + " / ".join(names) + ")"]
    cells += ["encode ms (" + " / ".join(names) + ")",
              "reduce ms (" + " / ".join(topos) + ")",
              "peak memory MiB (" + " / ".join(names) + ")"]
    lines += _header(cells, ["--:"] + ["---"] * (len(cells) - 1))
    for n in settings.ns:
        cases = [variant.case("sequential", None, n)] + [variant.case("batched", t, n) for t in topos]
        row = [str(n), " / ".join(str(c.physical_forwards) for c in cases)]
        if counted:
            row += [" / ".join(_g(c.work["gflop"]["total"]) for c in cases),
                    " / ".join(f"{c.work['ratio_vs_sequential']:.2f}" for c in cases[1:]),
                    " / ".join(_g(c.work["gflop"]["total"] / c.latency_s.median) for c in cases)]
        row += [" / ".join(f"{c.encode_ms.median:.0f}" for c in cases),
                " / ".join(f"{c.reduce_ms.median:.2f}" for c in cases[1:]),
                " / ".join(_mib(c) for c in cases)]
        lines.append(_row(row))
    if counted:
        lines += ["", "GFLOP: forward FLOPs of one group (GEMM + attention + conv; elementwise not counted). Work "
                  "ratio: batched / sequential GFLOP. GFLOP/s: GFLOP over the median wall time."]

    lines += ["", f"### {variant.dtype}: parity of batched candidates with the upstream calls of the same seeds", ""]
    # Outside fp32 the 1e-3 rule is not the yardstick; the drift the dtype puts on upstream's own result is.
    drift = all(variant.case("batched", t, n).parity.dtype_drift is not None for t in topos for n in settings.ns)
    cells = ["N"] + ([f"upstream {variant.dtype} vs upstream fp32 (dtype drift)"] if drift else [])
    for topo in topos:
        cells += [f"{topo} max abs diff", f"{topo} within 1e-3·max(1,max abs ref)"]
        cells += [f"{topo} within dtype drift"] if drift else []
        cells += [f"{topo} bitwise"]
    lines += _header(cells, ["--:"] + ["---"] * (len(cells) - 1))
    for n in settings.ns:
        row = [str(n)]
        if drift:
            row.append(f"{variant.case('batched', topos[0], n).parity.dtype_drift:.2e}")
        for topo in topos:
            p = variant.case("batched", topo, n).parity
            row += [f"{p.max_abs_diff:.2e}", "yes" if p.within_rule else "**NO**"]
            row += ["yes" if p.within_dtype_drift else "**NO**"] if drift else []
            row += ["yes" if p.bitwise else "no"]
        lines.append(_row(row))
    return lines


def markdown(document: dict[str, Any], variants: list[VariantResult], settings: Settings) -> str:
    """Render ``document`` as markdown: context lines, then three tables per dtype."""
    machine, versions, workload = document["machine"], document["versions"], settings.workload
    ram = f"{machine['ram_bytes'] / 2**30:.0f} GiB RAM" if machine.get("ram_bytes") else "RAM unknown"
    gpu = machine["gpu"]["name"] if machine.get("gpu") else "no GPU"
    lines = [
        f"## Batched candidates vs sequential upstream: `{settings.source.label}` on {settings.device}",
        "",
        f"- Run: {document['created_utc']}, wall time {document['wall_time_s'] / 60:.1f} min; "
        f"{workload.steps} steps, chunk {workload.chunk}, tier {workload.tier}, guidance {workload.guidance}, "
        f"N in {list(settings.ns)}, instruction {workload.prompt_cache} (see README), "
        f"row blocks {workload.row_blocks}, "
        f"{settings.reps} timed reps after one warm-up; peak memory from runs of "
        f"{settings.memory_steps} step(s).",
        f"- Machine: {machine['cpu_model']}, {machine['logical_cores']} cores, {ram}, {gpu}; torch threads "
        f"{machine['torch_threads']}; load average (1 min) {(machine.get('load_average_start') or ['?'])[0]} at "
        f"start, {(machine.get('load_average_end') or ['?'])[0]} at end.",
        f"- Versions: python {versions['python']}, torch {versions['torch']}, diffusers {versions['diffusers']}, "
        f"transformers {versions['transformers']}; code {versions.get('git')}.",
    ]
    for variant in variants:
        model, tokens = variant.model, variant.model.get("tokens", {})
        prefix = " + ".join(str(tokens[k]) for k in ("prefix_cond", "prefix_uncond") if k in tokens)
        baseline = next((c.memory for c in variant.cases if c.path == "batched" and c.memory), None) or {}
        base_rss = baseline.get("baseline_rss_bytes", baseline.get("baseline_allocated_bytes"))
        lines.append(
            f"- {variant.dtype} model: transformer {model['transformer_parameters'] / 1e6:.1f}M parameters, VAE "
            f"{model['vae_parameters'] / 1e6:.2f}M; text prefix {prefix} tokens (shared by the group), generation "
            f"block {tokens.get('generation_block')} tokens per candidate per CFG branch"
            + (f"; memory baseline after build {base_rss / MIB:.0f} MiB" if base_rss else "")
            + (f"; autograd in the engine's forwards when the caller leaves it on: "
               f"{'ON (serving would build a graph)' if variant.engine_grad_enabled else 'off'}"
               if variant.engine_grad_enabled is not None else "")
            + "."
        )
    lines.append("")
    for variant in variants:
        lines += _variant_tables(variant, settings) + [""]
    return "\n".join(lines)
