"""The serving benchmark's table and plot, from its JSON document alone (so a committed JSON re-renders)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..records import write_json

MIB = 1024 * 1024


def _cell(stats: dict[str, Any] | None, digits: int = 3) -> str:
    if not stats:
        return "—"
    return f"{stats['median']:.{digits}f} [{stats['min']:.{digits}f}–{stats['max']:.{digits}f}]"


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def markdown(document: dict[str, Any]) -> str:
    """One table per step_capture mode plus the sequential reference, then the capture counters."""
    s, model, cases = document["settings"], document["model"], document["cases"]
    machine, versions = document["machine"], document["versions"]
    peak = document["headline"]["peak_tflops_bf16_dense"]
    gpu = (machine.get("gpu") or {}).get("name") or machine.get("cpu_model")
    lines = [
        f"# Serving benchmark: `{s['config']}` on {gpu}, {s['dtype']}",
        "",
        f"- {model['transformer_parameters']:,} transformer parameters ({model['transformer_bytes'] / 2**30:.2f} GiB), "
        f"VAE {model['vae_parameters']:,}; tokens per candidate {model['tokens']}",
        f"- {s['steps']} steps, chunk {s['chunk']}, tier {s['tier']}, CFG {s['guidance']} ({s['cfg_mode']}), "
        f"{s['reps']} reps after a warm-up, prompt cache {s['prompt_cache']}, row blocks {s['row_blocks']}",
        f"- dense bf16 peak of this chip: {_num(peak, '.0f')} TFLOP/s; TFLOP/s = counted FLOPs of one eager group / "
        "median latency (capture does not change the work)",
        f"- code {versions.get('git')}, torch {versions.get('torch')}, diffusers {versions.get('diffusers')}, "
        f"created {document['created_utc']}, wall {document['wall_time_s']} s",
        "",
        "| N | path | step_capture | latency s (median [min–max]) | vs sequential | vs eager | TFLOP/s | % peak "
        "| forwards | max\\|diff\\| vs upstream (tol) | vs eager | peak MiB |",
        "|--:|---|---|---|--:|--:|--:|--:|--:|---|---|--:|",
    ]
    for n in s["ns"]:
        rows = [cases[f"sequential/-/{n}"]] + [cases[f"batched/{m}/{n}"] for m in s["step_capture"]]
        for case in rows:
            memory = case.get("memory") or {}
            peak_mib = memory.get("peak_allocated_bytes")
            parity = case.get("parity_vs_upstream")
            vs_eager = case.get("vs_eager")
            lines.append("| " + " | ".join([
                str(n), case["path"], case["mode"] or "—", _cell(case["latency_s"]),
                _num((case.get("ratio_vs_sequential") or {}).get("median"), ".3f"),
                _num((case.get("ratio_vs_eager") or {}).get("median"), ".3f"),
                _num(case.get("tflops"), ".3g"),
                _num(None if case.get("peak_fraction") is None else 100 * case["peak_fraction"], ".1f"),
                str(case["physical_forwards"]),
                "—" if parity is None else (f"{parity['max_abs_diff']:.2e} ({parity['tolerance']:.2e})"
                                            + (" bitwise" if parity["bitwise"] else "")),
                "—" if vs_eager is None or case["mode"] == "off" else (
                    "bitwise" if vs_eager["bitwise"] else f"{vs_eager['max_abs_diff']:.2e}"
                    + (" ok" if vs_eager["within_rule"] else " OUT")),
                "—" if peak_mib is None else f"{peak_mib / MIB:.0f}",
            ]) + " |")
    capture = document.get("capture", {})
    lines += ["", f"Capture counters (whole run): {capture.get('captures')} shapes captured, "
              f"{sum(e['replays'] for e in capture.get('entries_detail', []))} forwards replayed, "
              f"{capture.get('eager_forwards')} forwards eager (a prefix computed into the cache).", ""]
    targets = document["headline"].get("targets")
    if targets:
        lines += [f"Targets {targets['values']}: met {targets['met']}", ""]
    return "\n".join(lines)


def plot(document: dict[str, Any], path: Path) -> None:
    """Latency per N (sequential and each mode) and achieved TFLOP/s per N beside the peak."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, cases = document["settings"], document["cases"]
    ns = s["ns"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = [("sequential upstream", [cases[f"sequential/-/{n}"] for n in ns])]
    series += [(f"batched, step_capture={m}", [cases[f"batched/{m}/{n}"] for n in ns]) for m in s["step_capture"]]
    for label, rows in series:
        left.plot(ns, [r["latency_s"]["median"] for r in rows], marker="o", label=label)
        if rows[0].get("tflops") is not None:
            right.plot(ns, [r["tflops"] for r in rows], marker="o", label=label)
    peak = document["headline"]["peak_tflops_bf16_dense"]
    if peak:
        right.axhline(peak, color="grey", linestyle="--", label=f"dense bf16 peak {peak:.0f}")
    left.set(xlabel="candidates N", ylabel="latency per group (s, median)", xscale="log", yscale="log",
             title=f"{s['config']} {s['dtype']} {s['device']}, {s['steps']} steps")
    right.set(xlabel="candidates N", ylabel="achieved TFLOP/s", xscale="log", title="work / latency")
    for axis in (left, right):
        axis.set_xticks(ns, [str(n) for n in ns])
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(document: dict[str, Any], stem: Path) -> dict[str, Path]:
    """``<stem>.json``, ``.md`` and ``.png``; the png is skipped (and said so) where matplotlib is missing."""
    paths = {"json": stem.with_suffix(".json"), "md": stem.with_suffix(".md")}
    write_json(paths["json"], document)
    paths["md"].write_text(markdown(document), encoding="utf-8")
    try:
        plot(document, stem.with_suffix(".png"))
        paths["png"] = stem.with_suffix(".png")
    except ImportError as error:
        print(f"warning: no plot ({error})")
    return paths


def replot(path: Path) -> dict[str, Path]:
    """Re-render the table and plot of a committed serving JSON."""
    document = json.loads(path.read_text(encoding="utf-8"))
    return write_outputs(document, path.with_suffix(""))
