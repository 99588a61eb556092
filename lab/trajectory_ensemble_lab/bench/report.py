"""Benchmark outputs: the JSON with every figure, a markdown table, and a plot; plus machine and version info."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from .figures import TARGETS, faster_topology
from .plot import plot
from .runner import CaseResult, Settings, VariantResult, to_jsonable, variant_from_json
from .table import markdown
from .workload import PipelineSource, Workload
from ..records import write_json

SCHEMA = "trajectory_ensemble.bench/1"

METHOD = {
    "sequential": (
        "N real calls of the upstream Cosmos3OmniPipeline.__call__ (its own pipeline object, same weights, no "
        "processor of ours), generator=torch.Generator().manual_seed(seeds[i]), output_type='latent', "
        "enable_safety_check=False. Each repetition times one call per seed seeds[0..max(N)-1]; the figure for N is "
        "the sum of the first N calls of that repetition."
    ),
    "batched": "one Cosmos3ActionModel.generate(...) of N candidates (same seeds), per CFG topology, same repetition",
    "ratio": "per repetition batched / sequential of the same repetition; median, min, max over repetitions",
    "cpu_time": "time.process_time() of this process around the same calls (all its threads): the work itself, "
                "unaffected by other load on a shared CPU; cpu_ratio_vs_sequential is the load-independent "
                "cross-check of the wall-time ratio (host time only on CUDA)",
    "latency": "wall clock of the whole call (encode, denoise, reduce); median, min, max of the timed repetitions "
               "after one untimed warm-up of each path",
    "physical_forwards": "sequential: transformer forward calls counted by a forward pre-hook; batched: "
                         "result.metrics['physical_forwards']",
    "encode_ms": "sequential: tokenize_prompt + prepare_latents per call (prompt + VAE encode of chunk+1 frames), "
                 "summed over the N calls; batched: result.metrics['encode_ms'] (prompt + VAE encode of the "
                 "conditioning frame, once per group)",
    "reduce_ms": "result.metrics['reduce_ms']",
    "work": "forward FLOPs of one untimed call per case, counted by torch.utils.flop_counter.FlopCounterMode after "
            "the timing: gemm (mm, addmm, bmm, baddbmm), attention (fused SDPA kernels; grouped-query attention "
            "counted with key/value heads repeated, causal calls counting the unmasked scores only), conv; "
            "elementwise work is not counted. Sequential for N = N x one upstream call (the seed changes the noise, "
            "not the work). work.ratio_vs_sequential = batched total / sequential total",
    "autograd": "both sides run with autograd off: upstream __call__ is @torch.no_grad(), and the bench wraps "
                "generate() in torch.no_grad(). engine_grad_enabled says whether the engine itself leaves it on.",
    "parity": "max |batched - sequential| over the N candidates of the last repetition; rule: "
              "max|diff| <= 1e-3 * max(1, max|ref|); bitwise: torch.equal; for a dtype other than fp32 with an "
              "fp32 variant in the run, dtype_drift = max |upstream in that dtype - upstream fp32| over the same "
              "seeds, and within_dtype_drift = max|diff| <= dtype_drift",
}


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def machine_info(device: torch.device) -> dict[str, Any]:
    """CPU model, cores, RAM, GPU, load and torch threading of this machine."""
    cpu_model = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                      if line.startswith("model name")), platform.processor() or platform.machine())
    mem_total = re.search(r"MemTotal:\s+(\d+) kB", _read("/proc/meminfo"))
    info: dict[str, Any] = {
        "cpu_model": cpu_model,
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "ram_bytes": int(mem_total.group(1)) * 1024 if mem_total else None,
        "platform": platform.platform(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "gpu": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device if device.type == "cuda" else 0)
        info["gpu"] = {"name": props.name, "memory_bytes": int(props.total_memory)}
    return info


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (other work on a shared machine shows up here)."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def versions() -> dict[str, str | None]:
    """Library versions and the git commit of the benchmarked code."""
    found: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("diffusers", "transformers", "numpy", "trajectory_ensemble"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    try:
        found["git"] = subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        found["git"] = None
    return found


def _peak(case: CaseResult) -> int | None:
    memory = case.memory or {}
    return memory.get("peak_rss_bytes", memory.get("peak_allocated_bytes"))


def headline(variants: list[VariantResult], settings: Settings) -> dict[str, Any]:
    """The figures the acceptance criteria ask for, per dtype, with the targets they are compared against."""
    steps = settings.workload.steps
    out: dict[str, Any] = {"targets": TARGETS}
    for variant in variants:
        batched = [c for c in variant.cases if c.path == "batched"]
        ratios = {t: {c.n: round(c.ratio_vs_sequential.median, 4) for c in batched if c.topology == t}
                  for t in settings.topologies}
        cpu_ratios = {t: {c.n: round(c.cpu_ratio_vs_sequential.median, 4) for c in batched if c.topology == t}
                      for t in settings.topologies}
        winners = {n: faster_topology([c for c in batched if c.n == n], settings.device) for n in settings.ns}
        entry: dict[str, Any] = {
            "ratio_batched_over_sequential": ratios,
            "cpu_time_ratio_batched_over_sequential": cpu_ratios,
            "faster_topology_by_n": winners,
            "parity_within_rule_all": all(c.parity.within_rule for c in batched),
            "parity_within_dtype_drift_all": all(c.parity.within_dtype_drift for c in batched)
            if batched and all(c.parity.dtype_drift is not None for c in batched) else None,
            "fused_forwards_equal_steps_all_n": all(c.physical_forwards == steps for c in batched
                                                    if c.topology == "fused") if "fused" in settings.topologies
            else None,
            "engine_grad_enabled": variant.engine_grad_enabled,
        }
        if 1 in settings.ns:
            entry["n1"] = {
                t: {"ratio_vs_one_upstream_call": ratios[t][1], "cpu_time_ratio": cpu_ratios[t][1],
                    "bitwise": variant.case("batched", t, 1).parity.bitwise,
                    "physical_forwards": variant.case("batched", t, 1).physical_forwards,
                    "work_ratio": (variant.case("batched", t, 1).work or {}).get("ratio_vs_sequential")}
                for t in settings.topologies
            }
            encode_up = variant.case("sequential", None, 1).encode_ms.median
            entry["n1_encode_share_of_upstream_call"] = round(
                encode_up / 1e3 / variant.case("sequential", None, 1).latency_s.median, 4)
        if 8 in settings.ns:
            entry["ratio_n8"] = {t: ratios[t][8] for t in settings.topologies}
            entry["cpu_time_ratio_n8"] = {t: cpu_ratios[t][8] for t in settings.topologies}
            entry["ratio_n8_meets_target"] = {t: ratios[t][8] <= TARGETS["ratio_n8_max"] for t in settings.topologies}
            work = {t: (variant.case("batched", t, 8).work or {}).get("ratio_vs_sequential")
                    for t in settings.topologies}
            if all(v is not None for v in work.values()):
                entry["work_ratio_n8"] = {t: round(v, 4) for t, v in work.items()}
        if 1 in settings.ns and 8 in settings.ns and all(_peak(c) for c in variant.cases):
            entry["memory_n8_over_n1"] = {
                t: round(_peak(variant.case("batched", t, 8)) / _peak(variant.case("batched", t, 1)), 3)
                for t in settings.topologies
            }
        out[variant.dtype] = entry
    return out


def build_document(
    variants: list[VariantResult], settings: Settings, *, started: datetime.datetime, wall_s: float,
    load_start: list[float] | None, argv: list[str], code_versions: dict[str, str | None],
) -> dict[str, Any]:
    """The whole JSON document (``code_versions``: :func:`versions` taken when the run started)."""
    machine = machine_info(settings.device)
    machine["load_average_start"] = load_start
    machine["load_average_end"] = load_average()
    workload = settings.workload
    return {
        "schema": SCHEMA,
        "created_utc": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": argv,
        "wall_time_s": round(wall_s, 1),
        "settings": {
            "model": settings.source.label, "device": str(settings.device), "dtypes": list(settings.dtypes),
            "topologies": list(settings.topologies), "ns": list(settings.ns), "reps": settings.reps,
            "steps": workload.steps, "chunk": workload.chunk, "tier": workload.tier, "guidance": workload.guidance,
            "base_seed": workload.base_seed, "prompt_cache": workload.prompt_cache,
            "row_blocks": workload.row_blocks,
            "memory": settings.memory, "memory_steps": settings.memory_steps,
            "memory_jobs": settings.memory_jobs,
            "threads": settings.threads,
            "work": settings.work,
        },
        "machine": machine,
        "versions": code_versions,
        "method": {**METHOD, "memory": sorted({v.memory_method for v in variants if v.memory_method})},
        "headline": headline(variants, settings),
        "variants": [to_jsonable(v) for v in variants],
    }


def file_stem(settings: Settings) -> str:
    """``<model>_<device>``, e.g. ``bench_cpu-2core`` or ``large_cuda-nvidia-h200``: says where it was measured."""
    model = Path(settings.source.model_path).name if settings.source.model_path else settings.source.config
    return f"{model}_{device_label(settings.device)}"


def device_label(device: torch.device) -> str:
    """``cuda-nvidia-h200`` or ``cpu-2core``: the device part of a results file name."""
    if device.type == "cuda":
        return "cuda-" + re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")
    return f"cpu-{os.cpu_count()}core"


def write_outputs(
    document: dict[str, Any], variants: list[VariantResult], settings: Settings, stem: Path | None = None
) -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png``; returns their paths.

    Args:
        stem (`Path`, *optional*): Path without suffix; defaults to ``settings.out / file_stem(settings)``.
    """

    settings.out.mkdir(parents=True, exist_ok=True)
    stem = stem or settings.out / file_stem(settings)
    paths = {"json": stem.with_suffix(".json"), "markdown": stem.with_suffix(".md"), "plot": stem.with_suffix(".png")}
    write_json(paths["json"], document)
    paths["markdown"].write_text(markdown(document, variants, settings), encoding="utf-8")
    plot(document, variants, settings, paths["plot"])
    return paths


def load_document(path: Path) -> tuple[dict[str, Any], list[VariantResult], Settings]:
    """Read a benchmark JSON back: the document, its variants and the settings it ran with (``--replot``)."""
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    cfg = document["settings"]
    model = str(cfg["model"])
    source = PipelineSource(model_path=model) if ("/" in model or Path(model).exists()) else PipelineSource(model)
    settings = Settings(
        source=source, device=torch.device("cpu" if str(cfg["device"]).startswith("cpu") else cfg["device"]),
        dtypes=tuple(cfg["dtypes"]), topologies=tuple(cfg["topologies"]), ns=tuple(cfg["ns"]), reps=int(cfg["reps"]),
        workload=Workload(steps=cfg["steps"], chunk=cfg["chunk"], tier=cfg["tier"], guidance=cfg["guidance"],
                          base_seed=cfg["base_seed"], prompt_cache=cfg.get("prompt_cache", "cold"),
                          row_blocks=cfg.get("row_blocks", "off")),
        memory=cfg["memory"], memory_steps=cfg["memory_steps"], memory_jobs=cfg.get("memory_jobs", 1),
        threads=cfg["threads"], out=Path(path).parent, work=cfg.get("work", "skip"),
    )
    return document, [variant_from_json(v) for v in document["variants"]], settings


def print_summary(document: dict[str, Any], paths: dict[str, Path]) -> None:
    """A few lines on stdout: the headline ratios and where the files are."""
    for dtype, entry in document["headline"].items():
        if dtype == "targets":
            continue
        for topo, by_n in entry["ratio_batched_over_sequential"].items():
            cpu = entry["cpu_time_ratio_batched_over_sequential"][topo]
            figures = ", ".join(f"N={n}: {r:.2f} ({cpu[n]:.2f})" for n, r in by_n.items())
            print(f"{dtype} {topo}: batched/sequential wall (CPU time) {figures}")
    print(f"wall time {document['wall_time_s']:.0f} s")
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    sys.stdout.flush()
