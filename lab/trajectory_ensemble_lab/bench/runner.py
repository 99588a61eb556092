"""The measurement loop: sequential upstream vs batched candidates, side by side, in one process.

How each figure is measured (also written into the JSON ``method`` block):

- **Sequential reference for N** = the sum of N real upstream calls made in the same repetition. Each repetition
  calls upstream once per seed ``seeds[0..max(N)-1]`` (``candidate_seeds(base_seed, max(N))``, the seeds the batched
  groups use: a group of N uses the first N) and times every call; the figure for N sums the first N calls of that
  repetition. So one repetition costs ``max(N)`` upstream calls, not ``sum(N)``, and every figure is still a sum of
  real measured calls.
- **Batched for N** = one ``generate`` of N candidates, per topology, in the same repetition.
- **Ratio** = per repetition, batched / sequential of that same repetition (so load changes on a shared machine hit
  both sides), then median, min and max over repetitions.
- **CPU time** (``time.process_time``, all threads of this process) is recorded next to every wall time. On a CPU
  shared with other work it measures the work itself, unaffected by how much of the machine others took at that
  moment, so the CPU-time ratio is the load-independent cross-check of the wall-time ratio. (On CUDA it is host time
  only and says little.)
- Repetitions are interleaved (upstream calls, then every N with its topologies back to back), after one untimed
  warm-up of each path.
- **Work** (FLOPs per group, :mod:`.work`) is counted in one extra untimed call of each case after the timing, so
  the counter's overhead never reaches a timed figure.
"""

from __future__ import annotations

import concurrent.futures
import copy
import gc
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from trajectory_ensemble_node.models.cosmos3 import encode_conditioning
from trajectory_ensemble_node.seeding import candidate_seeds
from . import memory as memory_mod
from .work import Work, count_work
from .workload import (
    DTYPES,
    FPS,
    PROMPT,
    BatchedCall,
    BatchedRunner,
    PipelineSource,
    UpstreamCall,
    UpstreamRunner,
    Workload,
    module_bytes,
    module_parameters,
    probe_grad_mode,
)


@dataclass(frozen=True)
class Settings:
    """A fully resolved benchmark run.

    Args:
        source (`PipelineSource`): Pipeline config or checkpoint.
        device (`torch.device`): Where the models run.
        dtypes (`tuple[str, ...]`): ``"fp32"`` and/or ``"bf16"``; each gets its own pipelines and reference.
        topologies (`tuple[str, ...]`): Batched CFG topologies, ``"fused"`` and/or ``"separate"``.
        ns (`tuple[int, ...]`): Candidate counts N, ascending.
        reps (`int`): Timed repetitions per figure (after one warm-up).
        workload (`Workload`): Observation and call parameters.
        memory (`str`): ``"auto"`` (subprocess per case on CPU, in-process on CUDA) or ``"skip"``.
        memory_steps (`int`): Denoising steps of the memory runs.
        memory_jobs (`int`): CPU memory subprocesses at once (each measures only itself, so they may overlap).
        threads (`int`): ``torch.set_num_threads`` (0 keeps torch's default).
        out (`Path`): Output directory.
        work (`str`): ``"count"`` (FLOPs per group of every case, one untimed call each) or ``"skip"``.
    """

    source: PipelineSource
    device: torch.device
    dtypes: tuple[str, ...]
    topologies: tuple[str, ...]
    ns: tuple[int, ...]
    reps: int
    workload: Workload
    memory: str
    memory_steps: int
    memory_jobs: int
    threads: int
    out: Path
    work: str = "count"


@dataclass(frozen=True)
class Stats:
    """Summary of repeated measurements (same unit as ``samples``)."""

    median: float
    min: float
    max: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        values = tuple(float(v) for v in samples)
        return cls(median=statistics.median(values), min=min(values), max=max(values), samples=values)


@dataclass(frozen=True)
class Parity:
    """Batched candidates vs the upstream calls with the same seeds.

    Args:
        max_abs_diff (`float`): ``max |batched - sequential|`` over all N candidates.
        max_abs_ref (`float`): ``max |sequential|``.
        tolerance (`float`): ``1e-3 * max(1, max_abs_ref)``.
        within_rule (`bool`): ``max_abs_diff <= tolerance``.
        bitwise (`bool`): Every candidate bit-identical to its upstream call.
        deterministic (`bool`): The batched candidates were bit-identical in every repetition.
        dtype_drift (`float`, *optional*): For a dtype other than fp32, ``max |upstream in this dtype - upstream in
            fp32|`` over the same N seeds: how far the dtype alone moves the reference. ``None`` for fp32, or when
            the run has no fp32 variant.
        within_dtype_drift (`bool`, *optional*): ``max_abs_diff <= dtype_drift``: batching moved the candidates no
            further than choosing the dtype moved the reference.
    """

    max_abs_diff: float
    max_abs_ref: float
    tolerance: float
    within_rule: bool
    bitwise: bool
    deterministic: bool
    dtype_drift: float | None = None
    within_dtype_drift: bool | None = None


@dataclass
class CaseResult:
    """Every figure of one (dtype, path, topology, N) case.

    ``path`` is ``"sequential"`` (N upstream calls) or ``"batched"``; ``topology`` is ``None`` for sequential.
    Times are in seconds (``latency_s``) or milliseconds (``*_ms``); memory in bytes.
    """

    dtype: str
    path: str
    topology: str | None
    n: int
    latency_s: Stats
    cpu_s: Stats
    physical_forwards: int
    encode_ms: Stats
    ratio_vs_sequential: Stats | None = None
    cpu_ratio_vs_sequential: Stats | None = None
    reduce_ms: Stats | None = None
    denoise_ms: Stats | None = None
    parity: Parity | None = None
    memory: dict[str, Any] | None = None
    work: dict[str, Any] | None = None


@dataclass
class VariantResult:
    """All cases of one dtype, plus what describes the model under test."""

    dtype: str
    cases: list[CaseResult] = field(default_factory=list)
    upstream_deterministic: bool = True
    engine_grad_enabled: bool | None = None
    upstream_grad_enabled: bool | None = None
    model: dict[str, Any] = field(default_factory=dict)
    memory_method: str = ""

    def case(self, path: str, topology: str | None, n: int) -> CaseResult:
        for case in self.cases:
            if case.path == path and case.topology == topology and case.n == n:
                return case
        raise KeyError((path, topology, n))


class Progress:
    """One line per measurement on stderr, with the elapsed wall time, so a long run shows where it is."""

    def __init__(self, quiet: bool = False) -> None:
        self.started = time.perf_counter()
        self.quiet = quiet

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.started

    def __call__(self, message: str) -> None:
        if not self.quiet:
            minutes, seconds = divmod(int(self.elapsed_s), 60)
            print(f"[bench +{minutes:02d}:{seconds:02d}] {message}", file=sys.stderr, flush=True)


def parity(batched: Sequence[torch.Tensor], reference: torch.Tensor) -> Parity:
    """Compare batched candidates (one ``[N, H, D]`` tensor per repetition) with ``reference`` ``[N, H, D]``."""
    last = batched[-1]
    max_ref = float(reference.abs().max())
    diff = float((last - reference).abs().max())
    tolerance = 1e-3 * max(1.0, max_ref)
    return Parity(
        max_abs_diff=diff,
        max_abs_ref=max_ref,
        tolerance=tolerance,
        within_rule=diff <= tolerance,
        bitwise=bool(torch.equal(last, reference)),
        deterministic=all(torch.equal(c, last) for c in batched),
    )


def token_counts(pipe: Any, workload: Workload) -> dict[str, int]:
    """Sequence lengths of one candidate: text prefixes (shared by a group) and its generation block."""
    conditioning = encode_conditioning(
        pipe, prompt=PROMPT, negative_prompt=None, action=workload.action(), fps=FPS,
        guidance_scale=workload.guidance, device=pipe._get_execution_device(),
    )
    counts = {"prefix_cond": conditioning.branches[0].prefix.length,
              "generation_block": conditioning.branches[0].template.length}
    if len(conditioning.branches) > 1:
        counts["prefix_uncond"] = conditioning.branches[1].prefix.length
    return counts


def run_variant(
    settings: Settings, dtype: str, log: Progress, references: dict[str, torch.Tensor] | None = None
) -> VariantResult:
    """Measure every case of one dtype: warm-up, interleaved timed repetitions, then memory.

    Args:
        references (`dict[str, torch.Tensor]`, *optional*): Receives ``references[dtype]``, the upstream actions of
            the last repetition ``[max N, chunk, action_dim]`` (float32, CPU), for :func:`add_dtype_drift`.
    """
    device, workload = settings.device, settings.workload
    log(f"{dtype}: building the {settings.source.label} pipeline and a copy of it (upstream reference, batched model)")
    reference_pipe = settings.source.build(DTYPES[dtype], device)
    # A copy, not a second build: identical weights by construction, and one build of the `large` config (random
    # init of 1.6B values on the CPU, or a checkpoint load) instead of two. Copied before the model wraps it, so the
    # fan-out processor is only ever installed on the copy.
    model_pipe = copy.deepcopy(reference_pipe)
    upstream = UpstreamRunner(reference_pipe, workload)
    max_n = max(settings.ns)
    runners = {topo: BatchedRunner(model_pipe, workload, topo, max_n) for topo in settings.topologies}
    result = VariantResult(dtype=dtype)
    result.model = {
        "transformer_parameters": module_parameters(model_pipe.transformer),
        "vae_parameters": module_parameters(model_pipe.vae),
        "pipeline_bytes": module_bytes(model_pipe.transformer) + module_bytes(model_pipe.vae),
        "tokens": token_counts(model_pipe, workload),
        "row_block_rows": next(iter(runners.values())).model.adapter.row_block_rows,
    }

    log(f"{dtype}: warm-up (one upstream call, one batched group per topology; not timed)")
    upstream.call(workload.base_seed)
    result.upstream_grad_enabled = True in upstream.counter.grad_enabled
    result.engine_grad_enabled = probe_grad_mode(next(iter(runners.values())))
    for runner in runners.values():
        runner.call(min(2, max_n))

    upstream_reps, batched_reps = _repetitions(settings, dtype, upstream, runners, log)
    result.upstream_deterministic = all(
        torch.equal(rep[i].action, upstream_reps[-1][i].action) for rep in upstream_reps for i in range(max_n)
    )
    result.cases = _cases(settings, dtype, upstream_reps, batched_reps)
    if references is not None:
        references[dtype] = torch.stack([c.action for c in upstream_reps[-1]])
    if settings.work != "skip":
        measure_work(settings, dtype, result, upstream, runners, log)
    if settings.memory != "skip":
        measure_memory(settings, dtype, result, upstream, runners, log)
    return result


def _repetitions(
    settings: Settings, dtype: str, upstream: UpstreamRunner, runners: dict[str, BatchedRunner], log: Progress
) -> tuple[list[list[UpstreamCall]], dict[tuple[str, int], list[BatchedCall]]]:
    """The timed repetitions: per repetition, one upstream call per seed, then every N with every topology."""
    seeds = candidate_seeds(settings.workload.base_seed, max(settings.ns))
    upstream_reps: list[list[UpstreamCall]] = []
    batched_reps: dict[tuple[str, int], list[BatchedCall]] = {
        (t, n): [] for t in settings.topologies for n in settings.ns
    }
    for rep in range(settings.reps):
        rep_started = log.elapsed_s
        calls = []
        for index, seed in enumerate(seeds):
            calls.append(upstream.call(seed))
            log(f"{dtype} rep {rep + 1}/{settings.reps}: upstream call {index + 1}/{len(seeds)} "
                f"{calls[-1].latency_s:.2f} s")
        upstream_reps.append(calls)
        # Topologies alternate within each N, so the two runs compared for "which topology wins" are adjacent in time.
        for n in settings.ns:
            for topo, runner in runners.items():
                call = runner.call(n)
                batched_reps[(topo, n)].append(call)
                log(f"{dtype} rep {rep + 1}/{settings.reps}: batched {topo} N={n} {call.latency_s:.2f} s")
        if rep == 0 and settings.reps > 1:
            per_rep = log.elapsed_s - rep_started
            log(f"{dtype}: one repetition takes {per_rep:.0f} s; about {per_rep * (settings.reps - 1):.0f} s to go "
                "before memory")
    return upstream_reps, batched_reps


def _cases(
    settings: Settings,
    dtype: str,
    upstream_reps: list[list[UpstreamCall]],
    batched_reps: dict[tuple[str, int], list[BatchedCall]],
) -> list[CaseResult]:
    """Every (path, topology, N) figure from the raw repetitions; parity uses the last repetition."""
    cases = []
    for n in settings.ns:
        # Sequential for N, per repetition: the sum of that repetition's first N upstream calls.
        sums = [sum(c.latency_s for c in rep[:n]) for rep in upstream_reps]
        cpu_sums = [sum(c.cpu_s for c in rep[:n]) for rep in upstream_reps]
        cases.append(CaseResult(
            dtype=dtype, path="sequential", topology=None, n=n,
            latency_s=Stats.of(sums),
            cpu_s=Stats.of(cpu_sums),
            physical_forwards=sum(c.forwards for c in upstream_reps[-1][:n]),
            encode_ms=Stats.of([sum(c.encode_ms for c in rep[:n]) for rep in upstream_reps]),
        ))
        reference = torch.stack([c.action for c in upstream_reps[-1][:n]])
        for topo in settings.topologies:
            calls = batched_reps[(topo, n)]
            metrics = [c.result.metrics for c in calls]
            cases.append(CaseResult(
                dtype=dtype, path="batched", topology=topo, n=n,
                latency_s=Stats.of([c.latency_s for c in calls]),
                cpu_s=Stats.of([c.cpu_s for c in calls]),
                ratio_vs_sequential=Stats.of([c.latency_s / s for c, s in zip(calls, sums)]),
                cpu_ratio_vs_sequential=Stats.of([c.cpu_s / s for c, s in zip(calls, cpu_sums)]),
                physical_forwards=int(metrics[-1]["physical_forwards"]),
                encode_ms=Stats.of([m["encode_ms"] for m in metrics]),
                reduce_ms=Stats.of([m["reduce_ms"] for m in metrics]),
                denoise_ms=Stats.of([m["denoise_ms"] for m in metrics]),
                parity=parity([c.result.candidates for c in calls], reference),
            ))
    return cases


def measure_work(
    settings: Settings,
    dtype: str,
    result: VariantResult,
    upstream: UpstreamRunner,
    runners: dict[str, BatchedRunner],
    log: Progress,
) -> None:
    """FLOPs per group of every case (see :mod:`.work`), stored in ``case.work``.

    Upstream does the same work for every seed (the seed only changes the noise), so one counted call stands for
    each of the N; a batched group is counted once per N and topology. Under the prompt-cache mode of the timed
    runs, so a cold group counts its text prefix and a warm one does not.
    """
    log(f"{dtype}: counting FLOPs (one untimed call per case)")
    per_call = count_work(lambda: upstream.call(settings.workload.base_seed))
    for n in settings.ns:
        sequential = per_call.scaled(n)
        result.case("sequential", None, n).work = {"gflop": sequential.as_gflop()}
        for topo, runner in runners.items():
            batched: Work = count_work(lambda n=n, r=runner: r.call(n))
            result.case("batched", topo, n).work = {
                "gflop": batched.as_gflop(),
                "ratio_vs_sequential": batched.total / sequential.total if sequential.total else None,
            }


def measure_memory(
    settings: Settings,
    dtype: str,
    result: VariantResult,
    upstream: UpstreamRunner,
    runners: dict[str, BatchedRunner],
    log: Progress,
) -> None:
    """Peak memory of every case (see :mod:`.memory` for the method), stored in ``case.memory``."""
    steps = settings.memory_steps
    seeds = candidate_seeds(settings.workload.base_seed, max(settings.ns))
    if settings.device.type == "cuda":
        result.memory_method = "torch.cuda.max_memory_allocated, reset before each case, in the benchmark process"
        for n in settings.ns:
            figures = memory_mod.measure_cuda(
                lambda n=n: [upstream.call(s, steps=steps) for s in seeds[:n]], settings.device
            )
            result.case("sequential", None, n).memory = {**figures, "steps": steps}
            for topo, runner in runners.items():
                figures = memory_mod.measure_cuda(lambda n=n, r=runner: r.call(n, steps=steps), settings.device)
                result.case("batched", topo, n).memory = {**figures, "steps": steps}
        return
    result.memory_method = (
        "ru_maxrss (RSS high-water mark, nothing subtracted) of a fresh subprocess per case; baseline = RSS after "
        "the pipeline (and model) build in that subprocess"
    )
    cases = [memory_mod.MemoryCase("sequential", tuple(settings.ns))]
    cases += [memory_mod.MemoryCase("batched", (n,), t) for t in settings.topologies for n in settings.ns]
    log(f"{dtype}: memory, {len(cases)} fresh subprocesses ({settings.memory_jobs} at a time; the sequential one "
        f"makes {max(settings.ns)} calls)")

    def measure(case: memory_mod.MemoryCase) -> dict[str, Any]:
        return memory_mod.run_cpu_case(case, source=settings.source, dtype=dtype, workload=settings.workload,
                                       steps=steps, threads=settings.threads)

    with concurrent.futures.ThreadPoolExecutor(max_workers=settings.memory_jobs) as pool:
        # The longest case first, so the pool does not end on it alone.
        for case, figures in zip(cases, pool.map(measure, cases)):
            for n in case.counts:
                topology = case.cfg_mode if case.kind == "batched" else None
                result.case(case.kind, topology, n).memory = _cpu_memory(figures, n)
            log(f"{dtype}: memory {case.kind} {case.cfg_mode or ''} N={list(case.counts)} done")


def _cpu_memory(figures: dict[str, Any], n: int) -> dict[str, Any]:
    return {
        "peak_rss_bytes": int(figures["peak_rss_bytes"][n]),
        "peak_vmhwm_bytes": int(figures["peak_vmhwm_bytes"][n]),
        "baseline_rss_bytes": int(figures["baseline_rss_bytes"]),
        "baseline_maxrss_bytes": int(figures["baseline_maxrss_bytes"]),
        "steps": int(figures["steps"]),
    }


def run_all(settings: Settings, log: Progress | None = None) -> list[VariantResult]:
    """Run every dtype variant of ``settings``, one after the other."""
    log = log or Progress()
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    results = []
    references: dict[str, torch.Tensor] = {}
    for dtype in settings.dtypes:
        results.append(run_variant(settings, dtype, log, references))
        # The next dtype builds its own pipeline pair; give this one's memory back first.
        gc.collect()
        if settings.device.type == "cuda":
            torch.cuda.empty_cache()
    add_dtype_drift(results, references)
    return results


def add_dtype_drift(variants: list[VariantResult], references: dict[str, torch.Tensor]) -> None:
    """Give every non-fp32 batched case the distance its dtype alone puts between two upstream references.

    The equivalence rule (bitwise for one candidate, ``1e-3 * max(1, max|ref|)`` otherwise) is an fp32 rule. In
    bf16 a different GEMM shape rounds differently, and ten denoising steps of a random-weight model amplify that, so
    the useful question is whether batching moves a candidate further than the dtype itself moves the reference:
    ``max |upstream bf16 - upstream fp32|`` over the same seeds. Needs an fp32 variant in the same run.
    """
    fp32 = references.get("fp32")
    if fp32 is None:
        return
    for variant in variants:
        reference = references.get(variant.dtype)
        if variant.dtype == "fp32" or reference is None:
            continue
        for case in variant.cases:
            if case.path != "batched" or case.parity is None:
                continue
            drift = float((reference[: case.n] - fp32[: case.n]).abs().max())
            case.parity = replace(case.parity, dtype_drift=drift,
                                  within_dtype_drift=case.parity.max_abs_diff <= drift)


def variant_from_json(data: dict[str, Any]) -> VariantResult:
    """Rebuild a :class:`VariantResult` from its JSON form (``to_jsonable`` output), e.g. to re-render a report."""
    cases = []
    for raw in data["cases"]:
        fields = dict(raw)
        for key in ("latency_s", "cpu_s", "encode_ms", "ratio_vs_sequential", "cpu_ratio_vs_sequential", "reduce_ms",
                    "denoise_ms"):
            if fields.get(key) is not None:
                fields[key] = Stats(**{**fields[key], "samples": tuple(fields[key]["samples"])})
        if fields.get("parity") is not None:
            fields["parity"] = Parity(**fields["parity"])
        cases.append(CaseResult(**fields))
    return VariantResult(**{**data, "cases": cases})


def to_jsonable(value: Any) -> Any:
    """Dataclasses, tuples and dict keys into plain JSON types."""
    if hasattr(value, "__dataclass_fields__"):
        return to_jsonable(asdict(value))
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, torch.device):
        return str(value)
    return value

