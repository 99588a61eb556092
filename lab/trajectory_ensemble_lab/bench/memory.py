"""Peak memory per benchmark case.

On CUDA the peak is ``torch.cuda.max_memory_allocated``, reset before each case, measured in the benchmark process.

On CPU the only honest peak is the process RSS high-water mark (``getrusage(RUSAGE_SELF).ru_maxrss``), and it can
never be reset; so each case runs in a FRESH subprocess (``python -m trajectory_ensemble_lab.bench.memory``) that
builds its pipeline, records its baseline RSS after the build (the model's own footprint, plus torch), runs the case
once and reports ``ru_maxrss`` as is (nothing subtracted).

The child is started through ``/bin/sh``, which FORKS it: Linux carries ``ru_maxrss`` across ``execve`` from the
memory image that was replaced, and Python's ``subprocess`` vforks from the benchmark process, so a child exec'd
directly would start with the benchmark's own high-water mark (two pipelines) as its "peak". Forked from the small
shell, the child starts from the shell's few MiB. ``VmHWM`` (``/proc/self/status``, reset on exec) is reported next
to it as a cross-check.

The sequential reference is N upstream calls one after another: one subprocess makes ``max(N)`` calls and reads the
high-water mark after each, so the value after ``k`` calls is exactly the sequential case ``N = k`` measured in a
fresh process. Batched cases differ in N from the first allocation on, so each gets its own subprocess.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trajectory_ensemble_node.seeding import candidate_seeds
from .workload import DTYPES, BatchedRunner, PipelineSource, UpstreamRunner, Workload

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# The last stdout line of a child that starts with this marker carries its JSON result.
_RESULT_MARKER = "BENCH_MEMORY_RESULT "


@dataclass(frozen=True)
class MemoryCase:
    """One case whose peak is measured in its own process.

    Args:
        kind (`str`): ``"sequential"`` (upstream calls) or ``"batched"``.
        counts (`tuple[int, ...]`): Sequential: the N values to report (the child makes ``max(counts)`` calls).
            Batched: exactly one N.
        cfg_mode (`str`, *optional*): Batched topology, ``"fused"`` or ``"separate"``.
    """

    kind: str
    counts: tuple[int, ...]
    cfg_mode: str | None = None


def rss_bytes() -> int:
    """Current resident set size of this process, in bytes (Linux ``/proc``; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def vm_hwm_bytes() -> int:
    """Peak RSS of this process image since its exec (``VmHWM``; Linux only, 0 elsewhere)."""
    for line in _read_status():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _read_status() -> list[str]:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            return handle.read().splitlines()
    except OSError:
        return []


def max_rss_bytes() -> int:
    """The RSS high-water mark of this process, in bytes (``ru_maxrss`` is KiB on Linux, bytes on macOS)."""
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(value if sys.platform == "darwin" else value * 1024)


def run_cpu_case(
    case: MemoryCase,
    *,
    source: PipelineSource,
    dtype: str,
    workload: Workload,
    steps: int,
    threads: int,
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    """Measure ``case`` in a fresh Python subprocess and return its figures.

    Args:
        case (`MemoryCase`): What to run.
        source (`PipelineSource`): Pipeline config or checkpoint.
        dtype (`str`): ``"fp32"`` or ``"bf16"``.
        workload (`Workload`): Observation and call parameters (``steps`` is overridden by ``steps``).
        steps (`int`): Denoising steps of the measured run.
        threads (`int`): ``torch.set_num_threads`` in the child (0 keeps torch's default).
        timeout_s (`float`): Seconds before the child is killed.

    Returns:
        `dict`: ``baseline_rss_bytes`` (current RSS after the build), ``baseline_maxrss_bytes``, and
        ``peak_rss_bytes`` (``ru_maxrss``) and ``peak_vmhwm_bytes`` per N (``{N: bytes}``), plus ``steps``.

    Raises:
        RuntimeError: the child failed; its stderr tail is in the message.
    """
    request = {
        "case": asdict(case),
        "source": asdict(source),
        "dtype": dtype,
        "workload": {"steps": steps, "chunk": workload.chunk, "tier": workload.tier, "guidance": workload.guidance,
                     "base_seed": workload.base_seed, "row_blocks": workload.row_blocks},
        "threads": threads,
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PACKAGE_ROOT), env.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "trajectory_ensemble_lab.bench.memory", json.dumps(request)]
    if os.path.exists("/bin/sh"):
        # Forked by the shell, not exec'd from this process: see the module docstring.
        command = ["/bin/sh", "-c", '"$0" "$@"; exit $?', *command]
    proc = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_RESULT_MARKER)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(
            f"memory subprocess for {case} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    result = json.loads(lines[-1][len(_RESULT_MARKER):])
    for key in ("peak_rss_bytes", "peak_vmhwm_bytes"):
        result[key] = {int(k): v for k, v in result[key].items()}
    return result


def _child(request: dict[str, Any]) -> dict[str, Any]:
    threads = int(request["threads"])
    if threads > 0:
        torch.set_num_threads(threads)
    source = PipelineSource(**request["source"])
    workload = Workload(**request["workload"])
    case = MemoryCase(**{**request["case"], "counts": tuple(request["case"]["counts"])})
    pipe = source.build(DTYPES[request["dtype"]], torch.device("cpu"))
    peaks: dict[int, int] = {}
    hwm: dict[int, int] = {}
    if case.kind == "sequential":
        upstream = UpstreamRunner(pipe, workload)
        baseline, baseline_max = rss_bytes(), max_rss_bytes()
        seeds = candidate_seeds(workload.base_seed, max(case.counts))
        for index, seed in enumerate(seeds, start=1):
            upstream.call(seed)
            if index in case.counts:
                peaks[index], hwm[index] = max_rss_bytes(), vm_hwm_bytes()
    elif case.kind == "batched":
        if len(case.counts) != 1 or case.cfg_mode is None:
            raise ValueError(f"a batched memory case needs exactly one N and a cfg_mode, got {case}")
        runner = BatchedRunner(pipe, workload, case.cfg_mode, max_count=case.counts[0])
        baseline, baseline_max = rss_bytes(), max_rss_bytes()
        runner.call(case.counts[0])
        peaks[case.counts[0]], hwm[case.counts[0]] = max_rss_bytes(), vm_hwm_bytes()
    else:
        raise ValueError(f"unknown memory case kind {case.kind!r}")
    return {
        "baseline_rss_bytes": baseline,
        "baseline_maxrss_bytes": baseline_max,
        "peak_rss_bytes": peaks,
        "peak_vmhwm_bytes": hwm,
        "steps": workload.steps,
    }


def measure_cuda(fn: Any, device: torch.device) -> dict[str, int]:
    """Run ``fn()`` once and return the CUDA peak above a reset counter, with the allocation before it.

    Args:
        fn (`Callable[[], Any]`): The case (one upstream call, or one batched group).
        device (`torch.device`): A CUDA device.
    """
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"baseline_allocated_bytes": int(baseline), "peak_allocated_bytes": int(peak)}


def main(argv: Sequence[str] | None = None) -> int:
    """Child entry point: ``python -m trajectory_ensemble_lab.bench.memory '<json request>'``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m trajectory_ensemble_lab.bench.memory '<json request>'", file=sys.stderr)
        return 2
    result = _child(json.loads(args[0]))
    print(_RESULT_MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
