"""``trajectory-ensemble bench``: batched candidates vs sequential upstream calls (and ``--quality``, ``--ros``).

The default mode measures, in one process and one run, for each N: N upstream ``Cosmos3OmniPipeline`` calls against
one batched group per CFG topology, and writes ``<out>/<model>_<device>.{json,md,png}``. ``--quality`` and ``--ros``
dispatch to the modules that own those measurements.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
from pathlib import Path
from types import ModuleType

import torch

from .workload import DTYPES, PipelineSource, Workload

DEFAULT_NS = (1, 2, 4, 8, 10)
# Steps by device. 10 on CUDA. On CPU 4, the published guidance-3.0 pair (4 steps / CFG 3.0): with 10 steps one
# `bench` upstream call takes ~16 s on one core, and the whole default run (5 reps x (10 upstream calls + 2 x 25
# batched candidates), plus memory) would take ~50 min instead of fitting in 25 (docs/benchmarks.md).
CPU_STEPS = 4
CUDA_STEPS = 10
CFG_TOPOLOGIES = ("fused", "separate")
# Modes owned by other modules: flag -> module exposing run(args) -> int.
DELEGATED = {
    "quality": "trajectory_ensemble_node.toy.quality",
    "ros": "trajectory_ensemble_node.bench.ros_overhead",
    "closed-loop": "trajectory_ensemble_node.toy.closed_loop",
}


CLOSED_LOOP_ROS_SCENES = 3
"""``--closed-loop --ros`` runs every scene three times in real time at factor 0.1 (up to ~40 s each): 3 by default."""


class _ExplicitScenes(argparse.Action):
    # Remembers that --scenes was typed, so --closed-loop --ros can have a smaller default than the other modes.
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.scenes_given = True


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"every N must be >= 1, got {text!r}")
    return values


def _names(choices: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        values = tuple(v.strip() for v in text.split(",") if v.strip())
        bad = [v for v in values if v not in choices]
        if not values or bad:
            raise argparse.ArgumentTypeError(f"choose from {list(choices)}, got {text!r}")
        return values

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` flags to ``parser``."""
    modes = parser.add_argument_group("modes (default: batched vs sequential latency benchmark)")
    exclusive = modes.add_mutually_exclusive_group()
    exclusive.add_argument("--quality", action="store_true",
                           help="reducer quality on the toy task (trajectory_ensemble_node.toy.quality)")
    exclusive.add_argument("--ros", action="store_true",
                           help="node overhead over engine time (trajectory_ensemble_node.bench.ros_overhead); with "
                                "--closed-loop: the closed loop through the real node and the simulated robot")
    # Not in the exclusive group: --closed-loop --ros is its own mode (trajectory_ensemble_node.tools.sim_report).
    modes.add_argument("--closed-loop", action="store_true",
                       help="chunks executed back to back on the toy task, per method and inference delay "
                            "(trajectory_ensemble_node.toy.closed_loop); with --ros: through the node on sim time")
    modes.add_argument("--scenes", type=int, default=50, action=_ExplicitScenes,
                       help="--quality, --closed-loop: number of toy scenes (default 50; 3 with --closed-loop --ros, "
                            "up to ~2 min of wall time per scene)")
    modes.add_argument("--scene-seed", type=int, default=0,
                       help="--quality, --closed-loop: offset of the first held-out scene (default 0)")
    modes.add_argument("--json", type=Path, default=None, help="--quality: write its results to this JSON file "
                       "(default bench/results/quality-toy.json)")
    modes.add_argument("--delays", type=str, default="0,2",
                       help="--closed-loop: inference delays in control steps, comma-separated (default 0,2)")
    modes.add_argument("--methods", type=str, default=None,
                       help="--closed-loop: methods, comma-separated (default: all eight)")
    modes.add_argument("--context-guidance", choices=("prefix", "mask"), default="prefix",
                       help="--closed-loop: guidance of the gradient-free methods (guided, guided_mode); 'mask' "
                            "suits a policy trained with clean action prefixes (train-toy --prefix-conditioning)")
    modes.add_argument("--client-executor", choices=("events", "single"), default="events",
                       help="--ros: the client's rclpy executor, the C++ EventsExecutor (default) or the Python "
                            "SingleThreadedExecutor; its cost is inside the measured latency")

    what = parser.add_argument_group("model")
    what.add_argument("--config", choices=("tiny", "bench", "large", "nano"), default=None,
                      help="random-weight config from build_pipeline (default: bench on CPU, large on CUDA); nano: "
                           "Cosmos3-Nano's shape, built on the device, measured by the serving benchmark "
                           "(bench/serving.py)")
    what.add_argument("--model", default=None, metavar="PATH",
                      help="benchmark a Cosmos3OmniPipeline checkpoint directory instead of a random-weight config; "
                           "with --quality or --closed-loop: the toy pipeline to evaluate (default: the bundled one)")
    what.add_argument("--device", default=None, help="cpu or cuda[:i] (default: cuda when available)")
    what.add_argument("--dtype", type=_names(tuple(DTYPES)), default=None,
                      help="transformer dtypes, comma-separated, e.g. bf16 or fp32,bf16 (default: fp32 on CPU; fp32 "
                           "and bf16 side by side on CUDA; with both, bf16 parity is also compared with the drift "
                           "bf16 itself puts on the upstream reference)")

    run = parser.add_argument_group("workload and repetitions")
    run.add_argument("--steps", type=int, default=None,
                     help=f"denoising steps (default {CPU_STEPS} on CPU, {CUDA_STEPS} on CUDA; see docs/benchmarks.md)")
    run.add_argument("--chunk", type=int, default=16, help="action chunk size; the video has chunk+1 frames (16)")
    run.add_argument("--tier", type=int, default=256, help="resolution tier of the conditioning canvas (256)")
    run.add_argument("--guidance", type=float, default=3.0, help="CFG scale, > 1 runs two branches (3.0)")
    run.add_argument("--reps", type=int, default=5, help="timed repetitions after one warm-up (default 5)")
    run.add_argument("--prompt-cache", choices=("cold", "warm"), default="cold",
                     help="cold: nothing retained from earlier groups (as after start or a weight update); warm: the same "
                          "instruction as the group before, so the text prefixes retained from it are reused "
                          "(default cold; see docs/benchmarks.md)")
    run.add_argument("--row-blocks", choices=("auto", "off"), default="auto",
                     help="auto: the engine's default (decoder layers run token-wise work per candidate block on "
                          "CPU); off: whole layers, to measure what blocking gives (default auto)")
    run.add_argument("--ns", type=_int_list, default=DEFAULT_NS, help="candidate counts N (default 1,2,4,8,10)")
    run.add_argument("--topologies", type=_names(CFG_TOPOLOGIES), default=CFG_TOPOLOGIES,
                     help="batched CFG topologies (default fused,separate)")
    run.add_argument("--threads", type=int, default=None,
                     help="torch.set_num_threads; 0 keeps torch's default (default: 1 on CPU, 0 on CUDA; see docs/benchmarks.md)")
    run.add_argument("--memory", choices=("auto", "skip"), default="auto",
                     help="peak memory per case: fresh subprocess per case on CPU, CUDA counters on GPU (auto)")
    run.add_argument("--work", choices=("count", "skip"), default="count",
                     help="FLOPs per group of every case, by kind (GEMM, attention, conv), from one extra untimed "
                          "call each after the timing (default count)")
    run.add_argument("--memory-steps", type=int, default=None,
                     help="denoising steps of the memory runs (default: 1 on CPU, --steps on CUDA; see docs/benchmarks.md)")
    run.add_argument("--memory-jobs", type=int, default=2,
                     help="CPU memory subprocesses run at once, after all timing is done (default 2)")
    run.add_argument("--out", type=Path, default=Path("out/bench"), help="output directory (default out/bench)")
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    run.add_argument("--replot", type=Path, default=None, metavar="JSON",
                     help="re-render the markdown, plot and derived headline of an existing benchmark JSON, next to "
                          "it (no measurement)")
    from .serving import add_arguments as add_serving_arguments

    add_serving_arguments(parser)


def resolve_settings(args: argparse.Namespace):
    """Turn parsed flags into :class:`~.runner.Settings` (defaults that depend on the device are decided here)."""
    from .runner import Settings

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda requested but CUDA is not available")
    config = args.config or ("large" if device.type == "cuda" else "bench")
    if args.dtype:
        dtypes: tuple[str, ...] = tuple(args.dtype)
    else:
        dtypes = ("fp32", "bf16") if device.type == "cuda" else ("fp32",)
    steps = args.steps or (CUDA_STEPS if device.type == "cuda" else CPU_STEPS)
    # One thread per process on CPU: on a shared machine, OpenMP over all cores stalls at every barrier whenever
    # another process holds a core, which inflates small ops ~10x and flatters the batched path (fewer, larger ops).
    threads = args.threads if args.threads is not None else (0 if device.type == "cuda" else 1)
    for name, value in (("--steps", steps), ("--reps", args.reps), ("--chunk", args.chunk),
                        ("--memory-jobs", args.memory_jobs)):
        if value < 1:
            raise SystemExit(f"error: {name} must be >= 1, got {value}")
    if args.reps < 5:
        print(f"warning: --reps {args.reps} < 5: the figures are indicative only", file=sys.stderr)
    workload = Workload(steps=steps, chunk=args.chunk, tier=args.tier, guidance=args.guidance,
                        prompt_cache=args.prompt_cache, row_blocks=args.row_blocks)
    return Settings(
        source=PipelineSource(config=config, model_path=args.model),
        device=device,
        dtypes=dtypes,
        topologies=tuple(args.topologies),
        ns=tuple(args.ns),
        reps=args.reps,
        workload=workload,
        memory=args.memory,
        # On CPU each memory case is a whole extra run in a fresh process. The peak is set by the first forward (and
        # upstream's VAE encode); later steps add only allocator drift (+40 MiB, 5%, at N=4 over 4 steps), so one
        # step keeps the default run inside its time budget. CUDA measures in-process at the full step count.
        memory_steps=args.memory_steps or (steps if device.type == "cuda" else 1),
        memory_jobs=args.memory_jobs,
        threads=threads,
        out=args.out,
        work=args.work,
    )


def delegated_args(args: argparse.Namespace) -> argparse.Namespace:
    """The namespace a delegated mode gets: its own flags, plus only the shared knobs the user actually set.

    The main benchmark's unset knobs are ``None`` (device-dependent defaults) or tuples (``--ns``); passed through,
    they would override the delegated module's own ``getattr(args, name, default)`` fallbacks with values of the
    wrong type. So unset knobs are left out, and ``--ns`` travels as the comma-separated string it was typed as.
    """
    out = argparse.Namespace(scenes=args.scenes, scene_seed=args.scene_seed, json=args.json, quiet=args.quiet,
                             client_executor=args.client_executor, delays=args.delays,
                             context_guidance=args.context_guidance)
    if getattr(args, "methods", None):
        out.methods = args.methods
    for name in ("config", "model", "device", "dtype", "steps", "threads"):
        if getattr(args, name, None) is not None:
            setattr(out, name, getattr(args, name))
    if getattr(args, "model", None) is not None:
        out.pipeline = Path(args.model)  # the toy modules (--quality, --closed-loop) name their weights "pipeline"
    if tuple(args.ns) != DEFAULT_NS:
        out.ns = ",".join(str(n) for n in args.ns)
    return out


def _delegate(flag: str, args: argparse.Namespace) -> int:
    module_name = DELEGATED[flag]
    try:
        module: ModuleType = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only "the module itself is missing" is the not-there-yet case; a missing import inside it is a real error.
        if exc.name not in (module_name, module_name.rsplit(".", 1)[0]):
            raise
        print(f"error: `bench --{flag}` needs {module_name}, which is not in this checkout yet.", file=sys.stderr)
        return 2
    return int(module.run(delegated_args(args)) or 0)


def run(args: argparse.Namespace) -> int:
    """Run the mode ``args`` selects; returns the process exit code."""
    if args.closed_loop and args.quality:
        raise SystemExit("error: --closed-loop and --quality are separate runs; pass one of them")
    closed_loop_ros = args.closed_loop and args.ros
    if closed_loop_ros and not getattr(args, "scenes_given", False):
        args.scenes = CLOSED_LOOP_ROS_SCENES
    if closed_loop_ros:
        from ..tools.sim_report import run_bench

        return int(run_bench(delegated_args(args)) or 0)
    if args.quality:
        return _delegate("quality", args)
    if args.ros:
        return _delegate("ros", args)
    if args.closed_loop:
        return _delegate("closed-loop", args)
    if args.dry_shapes:
        if args.config != "nano":
            raise SystemExit(f"error: --dry-shapes needs --config nano, got {args.config!r}")
        from .nano import dry_shapes

        print("\n".join(dry_shapes()))
        return 0
    if args.replot and args.replot.is_file() and '"trajectory_ensemble.bench.serving/' in args.replot.read_text()[:200]:
        from .serving_report import replot

        print(replot(args.replot))
        return 0
    if args.step_capture or args.config == "nano":
        from . import serving

        return serving.run(args)

    from .report import (
        build_document,
        headline,
        load_average,
        load_document,
        print_summary,
        versions,
        write_outputs,
    )
    from .runner import Progress, run_all

    if args.replot:
        document, variants, settings = load_document(args.replot)
        document["headline"] = headline(variants, settings)
        print_summary(document, write_outputs(document, variants, settings, stem=args.replot.with_suffix("")))
        return 0

    settings = resolve_settings(args)
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = load_average()
    # At the start: the code may be committed or edited while a long run goes on.
    code_versions = versions()
    log = Progress(quiet=args.quiet)
    variants = run_all(settings, log)
    document = build_document(variants, settings, started=started, wall_s=log.elapsed_s, load_start=load_start,
                              code_versions=code_versions,
                              argv=["trajectory-ensemble", "bench", *sys.argv[2:]] if sys.argv[1:2] == ["bench"]
                              else sys.argv)
    paths = write_outputs(document, variants, settings)
    print_summary(document, paths)
    return 0
