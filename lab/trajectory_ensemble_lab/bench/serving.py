"""``bench --step-capture off,cuda_graph`` and ``bench --config nano``: serving-size figures from ONE pipeline.

What a robot team needs before choosing N, at the size it serves: latency per N with and without per-step overhead
removed (``step_capture``), what N sequential upstream calls would cost, and how busy that keeps the chip (achieved
TFLOP/s beside the dtype's dense peak). One run measures, for each N:

- **sequential**: N upstream ``Cosmos3OmniPipeline`` calls, summed per repetition (as the main bench does);
- **batched, per step_capture mode**: one ``generate`` of N candidates with that mode (same model, same pipeline);
- **parity**: each mode's candidates against the upstream calls (the 1e-3 rule; bf16 has no rule of its own, the
  figures say how far they are) and against the eager (``off``) candidates of the same repetition;
- **work**: FLOPs of one eager group and one upstream call (``work.py``; a replayed graph hides its kernels from the
  counter, and capture does not change what a step computes), so TFLOP/s = FLOPs / median latency;
- **memory**: CUDA peak per case (``torch.cuda.max_memory_allocated``); not measured on CPU here.

ONE pipeline serves the upstream calls and the model: at Nano size (30 GiB of bf16 weights) a copy is not affordable,
and the fan-out processor computes exactly the stock attention outside our own forwards. ``nano`` is built directly
on the device (``nano.py``); the other configs as ``build_pipeline`` builds them.

Writes ``<out>/<config>_<device>.{json,md,png}`` (``--stem-suffix`` appends to the stem).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from trajectory_ensemble_node.errors import GroupFailedError
from trajectory_ensemble_node.metrics import GroupCounters
from trajectory_ensemble_node.models.cosmos3 import STEP_CAPTURE_MODES, StepCaptureError, check_step_capture
from trajectory_ensemble_node.seeding import candidate_seeds
from . import memory as memory_mod
from .report import device_label, load_average, machine_info, versions
from .runner import Progress, Stats, parity, to_jsonable, token_counts
from .work import count_work
from .workload import DTYPES, BatchedRunner, PipelineSource, UpstreamRunner, Workload, module_bytes

SCHEMA = "trajectory_ensemble.bench.serving/1"

# Dense (no sparsity) bf16 tensor-core peaks by vendor datasheet, TFLOP/s, matched by substring of the device name
# in this order (H100 PCIe before the SXM part's plain "H100"). Unknown devices report null.
BF16_DENSE_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.0),
    ("GH200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H20", 148.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("RTX 4090", 165.0),
)

# The GPU targets (H200, bf16, 10 steps), by config; compared in the headline when the run matches them.
TARGETS: dict[str, dict[str, float]] = {
    "large": {"n1_latency_s_max": 0.10, "n8_latency_s_max": 0.35, "n8_peak_fraction_min": 0.60},
    "nano": {"ratio_n8_max": 0.65},
}


def bf16_peak_tflops(device: torch.device, dtype: str) -> float | None:
    """The chip's dense bf16 peak for a bf16 run on a known CUDA device, else ``None``."""
    if device.type != "cuda" or dtype != "bf16":
        return None
    return peak_for_name(torch.cuda.get_device_name(device))


def peak_for_name(name: str) -> float | None:
    """Dense bf16 TFLOP/s of a device called ``name`` (``torch.cuda.get_device_name``), ``None`` when unknown."""
    return next((peak for key, peak in BF16_DENSE_PEAK_TFLOPS if key in name), None)


@dataclass(frozen=True)
class ServingSettings:
    """A resolved serving run (see :func:`add_arguments` for each flag)."""

    config: str
    device: torch.device
    dtype: str
    ns: tuple[int, ...]
    modes: tuple[str, ...]
    cfg_mode: str
    reps: int
    workload: Workload
    work: str
    memory: str
    out: Path
    stem_suffix: str = ""


def resolve(args: argparse.Namespace) -> ServingSettings:
    """Serving settings from the ``bench`` flags (device-dependent defaults decided here)."""
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config = args.config or ("large" if device.type == "cuda" else "bench")
    dtypes = tuple(args.dtype) if args.dtype else (("bf16",) if device.type == "cuda" else ("fp32",))
    if len(dtypes) != 1:
        raise SystemExit(f"error: the serving benchmark runs one dtype at a time, got {list(dtypes)}")
    modes = tuple(args.step_capture or ("off",))
    if modes[0] != "off":
        modes = ("off",) + tuple(m for m in modes if m != "off")  # eager is the yardstick of every captured mode
    for mode in modes:
        check_step_capture(mode, device)
    steps = args.steps or (10 if device.type == "cuda" else 4)
    workload = Workload(steps=steps, chunk=args.chunk, tier=args.tier, guidance=args.guidance,
                        prompt_cache=args.prompt_cache, row_blocks=args.row_blocks)
    return ServingSettings(config=config, device=device, dtype=dtypes[0], ns=tuple(args.ns), modes=modes,
                           cfg_mode=args.cfg_mode, reps=args.reps, workload=workload, work=args.work,
                           memory=args.memory, out=args.out, stem_suffix=args.stem_suffix or "")


def build(settings: ServingSettings):
    """The one pipeline of the run."""
    dtype = DTYPES[settings.dtype]
    if settings.config == "nano":
        from .nano import build_nano_pipeline

        return build_nano_pipeline(dtype, settings.device)
    return PipelineSource(config=settings.config).build(dtype, settings.device)


def measure(settings: ServingSettings, log: Progress) -> dict[str, Any]:
    """Every figure of the run, as a JSON-ready dict (``cases`` keyed ``"<path>/<mode>/<N>"``)."""
    device, workload = settings.device, settings.workload
    log(f"building the {settings.config} pipeline ({settings.dtype}) on {device}: one object for both paths")
    pipe = build(settings)
    upstream = UpstreamRunner(pipe, workload)
    runner = BatchedRunner(pipe, workload, settings.cfg_mode, max(settings.ns))
    transformer = pipe.transformer
    model_info = {
        "transformer_parameters": sum(p.numel() for p in transformer.parameters()),
        "vae_parameters": sum(p.numel() for p in pipe.vae.parameters()),
        "transformer_bytes": module_bytes(transformer),
        "pipeline_bytes": module_bytes(transformer) + module_bytes(pipe.vae),
        "tokens": token_counts(pipe, workload),
        "row_block_rows": runner.model.adapter.row_block_rows,
    }
    if device.type == "cuda":
        model_info["allocated_after_build_bytes"] = int(torch.cuda.memory_allocated(device))
    log(f"{model_info['transformer_parameters'] / 1e9:.2f}B transformer parameters; warm-up (upstream once, every "
        f"N once per mode: this is where shapes are captured or compiled)")
    warmup: dict[str, float] = {}
    failed: dict[str, str] = {}
    upstream.call(workload.base_seed)
    for mode in settings.modes:
        for n in settings.ns:
            try:
                warmup[f"{mode}/{n}"] = runner.call(n, step_capture=mode).latency_s
            except (StepCaptureError, GroupFailedError) as error:
                if mode == "off":
                    raise
                # A mode that cannot capture here is reported, not fatal: the eager figures still come out.
                failed[mode] = f"{type(error).__name__}: {error}"
                log(f"warm-up {mode} N={n} FAILED, mode dropped: {failed[mode]}")
                break
            log(f"warm-up {mode} N={n}: {warmup[f'{mode}/{n}']:.2f} s")
    if failed:
        settings = replace(settings, modes=tuple(m for m in settings.modes if m not in failed))

    seeds = candidate_seeds(workload.base_seed, max(settings.ns))
    upstream_reps: list[list[Any]] = []
    batched: dict[tuple[str, int], list[Any]] = {(m, n): [] for m in settings.modes for n in settings.ns}
    for rep in range(settings.reps):
        upstream_reps.append([upstream.call(seed) for seed in seeds])
        log(f"rep {rep + 1}/{settings.reps}: upstream {sum(c.latency_s for c in upstream_reps[-1]):.2f} s for "
            f"{len(seeds)} calls")
        for n in settings.ns:
            for mode in settings.modes:  # modes alternate within each N: the pair compared is adjacent in time
                call = runner.call(n, step_capture=mode)
                batched[(mode, n)].append(call)
                log(f"rep {rep + 1}/{settings.reps}: {mode} N={n} {call.latency_s:.3f} s")

    cases: dict[str, Any] = {}
    for n in settings.ns:
        sums = [sum(c.latency_s for c in rep[:n]) for rep in upstream_reps]
        reference = torch.stack([c.action for c in upstream_reps[-1][:n]])
        cases[f"sequential/-/{n}"] = {"path": "sequential", "mode": None, "n": n, "latency_s": Stats.of(sums),
                                      "physical_forwards": sum(c.forwards for c in upstream_reps[-1][:n])}
        eager_last = batched[("off", n)][-1].result.candidates
        for mode in settings.modes:
            calls = batched[(mode, n)]
            last = calls[-1].result.candidates
            scale = float(eager_last.abs().max())
            cases[f"batched/{mode}/{n}"] = {
                "path": "batched", "mode": mode, "n": n,
                "latency_s": Stats.of([c.latency_s for c in calls]),
                "ratio_vs_sequential": Stats.of([c.latency_s / s for c, s in zip(calls, sums)]),
                "ratio_vs_eager": Stats.of([c.latency_s / e.latency_s for c, e in zip(calls, batched[("off", n)])]),
                "denoise_ms": Stats.of([c.result.report(GroupCounters).denoise_ms for c in calls]),
                "physical_forwards": int(calls[-1].result.report(GroupCounters).physical_forwards),
                "parity_vs_upstream": parity([c.result.candidates for c in calls], reference),
                "vs_eager": {"max_abs_diff": float((last - eager_last).abs().max()), "max_abs_eager": scale,
                             "within_rule": float((last - eager_last).abs().max()) <= 1e-3 * max(1.0, scale),
                             "bitwise": bool(torch.equal(last, eager_last))},
            }
    result = {"model": model_info, "warmup_s": warmup, "cases": cases, "failed_modes": failed,
              "modes_measured": list(settings.modes),
              "capture": runner.model.adapter.step_capture.stats()}
    result["capture"]["entries_detail"] = [
        {"gen_rows": e.key[2][0], "und_rows": e.key[1][0], "replays": e.replays, "kv_refills": e.kv_refills}
        for e in runner.model.adapter.step_capture.entries.values()
    ]
    if settings.work != "skip":
        log("counting FLOPs (one untimed eager call per N, one upstream call)")
        per_call = count_work(lambda: upstream.call(workload.base_seed)).total
        for n in settings.ns:
            group = count_work(lambda n=n: runner.call(n, step_capture="off")).total
            cases[f"sequential/-/{n}"]["gflop"] = per_call * n / 1e9
            for mode in settings.modes:
                cases[f"batched/{mode}/{n}"]["gflop"] = group / 1e9
    if settings.memory != "skip" and device.type == "cuda":
        log("CUDA peak memory per case")
        cases_mem = {f"sequential/-/{n}": (lambda: upstream.call(workload.base_seed)) for n in settings.ns[:1]}
        for mode in settings.modes:
            for n in settings.ns:
                cases_mem[f"batched/{mode}/{n}"] = lambda n=n, m=mode: runner.call(n, step_capture=m)
        for key, fn in cases_mem.items():
            cases[key]["memory"] = memory_mod.measure_cuda(fn, device)
    add_rates(cases, bf16_peak_tflops(device, settings.dtype))
    return result


def add_rates(cases: dict[str, Any], peak_tflops: float | None) -> None:
    """Achieved TFLOP/s (work / median latency) and its fraction of the peak, per case with counted work."""
    for case in cases.values():
        if case.get("gflop") is None:
            continue
        tflops = case["gflop"] / 1e3 / case["latency_s"].median
        case["tflops"] = tflops
        case["peak_fraction"] = tflops / peak_tflops if peak_tflops else None


def headline(settings: ServingSettings, cases: dict[str, Any], peak_tflops: float | None) -> dict[str, Any]:
    """Per mode: N=1 and N=8 (or the largest N) latency, TFLOP/s and ratios, and the issue's targets where they
    apply."""
    top = 8 if 8 in settings.ns else max(settings.ns)
    out: dict[str, Any] = {"peak_tflops_bf16_dense": peak_tflops, "largest_n": top, "modes": {}}
    for mode in settings.modes:
        figures: dict[str, Any] = {}
        for label, n in (("n1", 1), (f"n{top}", top)):
            case = cases.get(f"batched/{mode}/{n}")
            if case is None:
                continue
            figures[label] = {"latency_s": case["latency_s"].median, "tflops": case.get("tflops"),
                              "peak_fraction": case.get("peak_fraction"),
                              "ratio_vs_sequential": case["ratio_vs_sequential"].median,
                              "ratio_vs_eager": case["ratio_vs_eager"].median,
                              "parity_within_rule": case["parity_vs_upstream"].within_rule,
                              "vs_eager_within_rule": case["vs_eager"]["within_rule"]}
        out["modes"][mode] = figures
    targets = TARGETS.get(settings.config)
    if targets and settings.device.type == "cuda" and settings.dtype == "bf16":
        met: dict[str, Any] = {}
        for mode, figures in out["modes"].items():
            n1, n8 = figures.get("n1"), figures.get("n8")
            checks = {}
            if n1 and "n1_latency_s_max" in targets:
                checks["n1_latency_s"] = n1["latency_s"] <= targets["n1_latency_s_max"]
            if n8 and "n8_latency_s_max" in targets:
                checks["n8_latency_s"] = n8["latency_s"] <= targets["n8_latency_s_max"]
            if n8 and "n8_peak_fraction_min" in targets and n8["peak_fraction"] is not None:
                checks["n8_peak_fraction"] = n8["peak_fraction"] >= targets["n8_peak_fraction_min"]
            if n8 and "ratio_n8_max" in targets:
                checks["ratio_n8"] = n8["ratio_vs_sequential"] <= targets["ratio_n8_max"]
            met[mode] = checks
        out["targets"] = {"values": targets, "met": met}
    return out


def run(args: argparse.Namespace) -> int:
    """Measure, then write ``<stem>.json``, ``.md`` and ``.png``; returns the exit code.

    ``--dry-shapes`` (with ``--config nano``) prints the transformer's shape instead, and ``--replot JSON`` re-renders
    the table and plot of a serving JSON, measuring nothing.
    """
    from .serving_report import replot, write_outputs

    if args.dry_shapes:
        if args.config != "nano":
            raise SystemExit(f"error: --dry-shapes needs --config nano, got {args.config!r}")
        from .nano import dry_shapes

        print("\n".join(dry_shapes()))
        return 0
    if args.replot:
        print(replot(args.replot))
        return 0
    settings = resolve(args)
    # One thread per process on CPU unless told otherwise, as the main bench (cli.py says why).
    threads = args.threads if args.threads is not None else (1 if settings.device.type == "cpu" else 0)
    if threads > 0:
        torch.set_num_threads(threads)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start, code_versions = load_average(), versions()
    log = Progress(quiet=args.quiet)
    result = measure(settings, log)
    # The pipeline went out of scope with measure(); give its memory back before the next config in this process.
    gc.collect()
    if settings.device.type == "cuda":
        torch.cuda.empty_cache()
    settings = replace(settings, modes=tuple(result["modes_measured"]))
    peak = bf16_peak_tflops(settings.device, settings.dtype)
    document = {
        "schema": SCHEMA,
        "created_utc": started.isoformat(timespec="seconds"),
        "command": ["trajectory-ensemble", "bench", *sys.argv[2:]] if sys.argv[1:2] == ["bench"] else sys.argv,
        "wall_time_s": round(log.elapsed_s, 1),
        "settings": {"config": settings.config, "device": str(settings.device), "dtype": settings.dtype,
                     "ns": list(settings.ns), "step_capture": list(settings.modes), "cfg_mode": settings.cfg_mode,
                     "reps": settings.reps, "steps": settings.workload.steps, "chunk": settings.workload.chunk,
                     "tier": settings.workload.tier, "guidance": settings.workload.guidance,
                     "prompt_cache": settings.workload.prompt_cache, "row_blocks": settings.workload.row_blocks,
                     "base_seed": settings.workload.base_seed},
        "machine": {**machine_info(settings.device), "load_average_start": load_start,
                    "load_average_end": load_average()},
        "versions": code_versions,
        "headline": headline(settings, result["cases"], peak),
        **result,
    }
    stem = f"{settings.config}_{device_label(settings.device)}{settings.stem_suffix}"
    settings.out.mkdir(parents=True, exist_ok=True)
    paths = write_outputs(to_jsonable(document), settings.out / stem)
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    print(json.dumps(document["headline"], indent=1, default=str))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags only the serving benchmark reads (the rest are the main bench's, shared)."""
    group = parser.add_argument_group("serving size (--step-capture, --config nano)")
    group.add_argument("--step-capture", type=_modes, default=None,
                       help=f"compare step_capture modes, comma-separated from {list(STEP_CAPTURE_MODES)}, e.g. "
                            "off,compile (CPU) or off,cuda_graph (CUDA); off is always measured as the yardstick. "
                            "Runs the serving benchmark (one shared pipeline, latency per N, TFLOP/s vs peak)")
    group.add_argument("--cfg-mode", choices=("auto", "fused", "separate"), default="auto",
                       help="serving benchmark: the model's cfg_mode (default auto: a lone candidate separate)")
    group.add_argument("--stem-suffix", default="", help="serving benchmark: appended to the output file stem")
    group.add_argument("--dry-shapes", action="store_true",
                       help="with --config nano: build the transformer on the meta device (nothing allocated), print "
                            "its shape and parameter count, and exit")


def _modes(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in STEP_CAPTURE_MODES]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"choose from {list(STEP_CAPTURE_MODES)}, got {text!r}")
    return values
