"""``trajectory-ensemble bench``: every measurement of the lab behind one command, chosen from one table.

:data:`MODES` is that table: a mode's name, the flags that select it, the function that runs it and one line of help.
With no mode flag, ``bench`` runs the batched-vs-sequential latency benchmark (:func:`run_latency`): for each N, N
upstream ``Cosmos3OmniPipeline`` calls against one batched group per CFG topology, written to
``<out>/<model>_<device>.{json,md,png}``. :func:`mode_name` is the one place that turns flags into a mode.

A mode that needs flags of its own names an ``options`` function ``add_arguments(parser)`` in its module; it is called
when ``bench`` builds its parser, so that module must import cheaply (torch and the like inside functions).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .workload import DTYPES, PipelineSource, Workload

DEFAULT_NS = (1, 2, 4, 8, 10)
# Steps by device. 10 on CUDA. On CPU 4, the published guidance-3.0 pair (4 steps / CFG 3.0): with 10 steps one
# `bench` upstream call takes ~16 s on one core, and the whole default run (5 reps x (10 upstream calls + 2 x 25
# batched candidates), plus memory) would take ~50 min instead of fitting in 25 (docs/benchmarks.md).
CPU_STEPS = 4
CUDA_STEPS = 10
CFG_TOPOLOGIES = ("fused", "separate")


@dataclass(frozen=True)
class Mode:
    """One measurement ``bench`` can run.

    Args:
        flags (`tuple[str, ...]`): The mode flags that select it, all of them and no other (empty: the default).
        target (`str`): ``"module:function"``, the function ``(args) -> int`` that runs it.
        help (`str`): One line for ``--help``.
        delegated (`bool`): The function gets :func:`delegated_args` (its own flags plus the shared knobs the user
            set) rather than the whole namespace.
        options (`str`, *optional*): ``"module:function"`` adding the mode's own flags to the parser.
    """

    flags: tuple[str, ...]
    target: str
    help: str
    delegated: bool = True
    options: str | None = None


MODES: dict[str, Mode] = {
    "latency": Mode((), "trajectory_ensemble_lab.bench.cli:run_latency",
                    "batched candidates vs sequential upstream calls, per N and CFG topology (the default)",
                    delegated=False),
    "serving": Mode((), "trajectory_ensemble_lab.bench.serving:run",
                    "one shared pipeline, latency per N and step_capture mode, TFLOP/s vs peak (with --step-capture "
                    "or --config nano)", delegated=False, options="trajectory_ensemble_lab.bench.serving:add_arguments"),
    "quality": Mode(("--quality",), "trajectory_ensemble_lab.toy.quality:run", "reducer quality on the toy task"),
    "ros": Mode(("--ros",), "trajectory_ensemble_lab.bench.ros_overhead:run", "node overhead over engine time"),
    "closed-loop": Mode(("--closed-loop",), "trajectory_ensemble_lab.toy.closed_loop:run",
                        "chunks executed back to back on the toy task, per method and inference delay"),
    "closed-loop-ros": Mode(("--closed-loop", "--ros"), "trajectory_ensemble_lab.bench.closed_loop_ros:run",
                            "the closed loop through the real node and the simulated robot, on sim time"),
    "fleet": Mode(("--fleet",), "trajectory_ensemble_lab.bench.cli:run_fleet",
                  "K openpi-client processes against the OpenPI server, co-batched vs one request at a time",
                  delegated=False, options="trajectory_ensemble_lab.bench.fleet:add_arguments"),
    "pusht": Mode(("--pusht",), "trajectory_ensemble_lab.pusht.bench:run",
                  "reducers and continuity methods on PushT, closed loop, paired by seed", delegated=False,
                  options="trajectory_ensemble_lab.pusht.bench:add_arguments"),
    "clock-rate": Mode(("--clock-rate",), "trajectory_ensemble_lab.bench.clock_rate:run",
                       "engine time under a 1 kHz /clock vs the host clock, idle CPU at 0/100/1000 Hz"),
    "warmup": Mode(("--warmup",), "trajectory_ensemble_lab.bench.warmup:run",
                   "the first goal after start-up over the steady median, with and without warm-up"),
}
"""Every ``bench`` mode by name. A new mode is one entry here (and its flag, if it has one, in :data:`MODE_FLAGS`)."""

MODE_FLAGS: dict[str, str] = {
    "--quality": "reducer quality on the toy task (trajectory_ensemble_lab.toy.quality)",
    "--ros": "node overhead over engine time (trajectory_ensemble_lab.bench.ros_overhead); with --closed-loop: the "
             "closed loop through the real node and the simulated robot",
    "--closed-loop": "chunks executed back to back on the toy task, per method and inference delay "
                     "(trajectory_ensemble_lab.toy.closed_loop); with --ros: through the node on sim time",
    "--fleet": "K openpi-client processes against the OpenPI server, co-batched vs serial "
               "(trajectory_ensemble_lab.bench.fleet; --clients, --candidates, --rate, --duration, --json); "
               "--through ray --replicas R: serve-ray's replicas beside serve-openpi (bench.fleet_ray)",
    "--pusht": "reducers and continuity methods on PushT (gym-pusht) closed loop, paired by seed "
               "(trajectory_ensemble_lab.pusht.bench; --policy, --episodes, --seed, --count, --continuity, --through)",
    "--clock-rate": "the node under a 1 kHz /clock: engine time vs the host clock, idle CPU per /clock rate "
                    "(trajectory_ensemble_lab.bench.clock_rate)",
    "--warmup": "the first goal after start-up against the steady median, warm and cold "
                "(trajectory_ensemble_lab.bench.warmup)",
}
"""The flags that select modes, with their help; each is a boolean ``store_true`` flag."""


THROUGH = ("process", "openpi", "node", "ray")
"""``--through``'s faces, shared by the modes that serve through several (``--fleet``: openpi, ray; ``--pusht``:
process, openpi, node); each mode refuses the others."""

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
    for flag, help_text in MODE_FLAGS.items():
        modes.add_argument(flag, action="store_true", help=help_text)
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
    modes.add_argument("--through", choices=THROUGH, default=None,
                       help="--fleet: openpi (serve-openpi, the default) or ray (serve-ray with --replicas); --pusht: "
                            "process (the default), openpi (openpi-client against --url) or node (over DDS)")
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
                          "it (no measurement); a serving JSON with --step-capture or --config nano, as it was run")
    for mode in MODES.values():
        if mode.options:
            _resolve(mode.options)(parser)


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


def _resolve(target: str) -> Callable:
    """The function a ``"module:function"`` string names.

    Raises:
        SystemExit: the module itself is not installed (exit status 2, the message names it).
    """
    module_name, _, function = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # Only "the module itself is missing" is an install problem; a missing import inside it is a real error.
        if exc.name not in (module_name, module_name.rsplit(".", 1)[0]):
            raise
        print(f"error: this bench mode needs {module_name}, which is not installed (pip install -e lab)",
              file=sys.stderr)
        raise SystemExit(2) from exc
    return getattr(module, function)


def mode_name(args: argparse.Namespace) -> str:
    """The mode the parsed flags select: the one whose flags are exactly those given (see :data:`MODES`).

    Raises:
        SystemExit: a combination of mode flags that is no mode.
    """
    given = {flag for flag in MODE_FLAGS if getattr(args, flag.lstrip("-").replace("-", "_"), False)}
    for name, mode in MODES.items():
        if mode.flags and set(mode.flags) == given:
            return name
    if given:
        raise SystemExit(f"error: {' and '.join(sorted(given))} are separate runs; pass one of them")
    return "serving" if getattr(args, "step_capture", None) or args.config == "nano" else "latency"


def run(args: argparse.Namespace) -> int:
    """Run the mode ``args`` selects; returns the process exit code."""
    name = mode_name(args)
    if name == "closed-loop-ros" and not getattr(args, "scenes_given", False):
        args.scenes = CLOSED_LOOP_ROS_SCENES
    mode = MODES[name]
    try:
        function = _resolve(mode.target)
    except SystemExit as exit_:
        return int(exit_.code or 2)
    return int(function(delegated_args(args) if mode.delegated else args) or 0)


def run_fleet(args: argparse.Namespace) -> int:
    """``--fleet``: through serve-openpi (:mod:`.fleet`, the default) or serve-ray's replicas (:mod:`.fleet_ray`)."""
    through = getattr(args, "through", None) or "openpi"
    if through not in ("openpi", "ray"):
        print(f"error: --fleet runs --through openpi or ray, got {through!r}", file=sys.stderr)
        return 2
    args.through = through
    if through == "ray":
        from .fleet_ray import run
    else:
        from .fleet import run
    return run(args)


def run_latency(args: argparse.Namespace) -> int:
    """The default mode: batched vs sequential upstream, per N and CFG topology (``--replot JSON`` re-renders one)."""
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
