"""``trajectory-ensemble demo`` (``make demo``): the node on its embedded model, the bundled bag, 8 candidates a goal.

Replays the toy-scene bag into a child node, then for the toy policy the open-loop figures (:func:`open_loop`), the
closed loop on sim time (:mod:`.sim`) and the PushT panel (:func:`pusht_panel`, the lab's
:data:`PUSHT_PANEL_MODULE`; without its dependencies the demo says why in one line and goes on). Outputs go under
``out/demo/``; the README's demo section and docs/closed-loop.md say what each shows.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import TrajectoryEnsembleError
from ..replay import bags
from ..cli.dispatch import lab_module
from ..cli.launcher import NodeProcess, NodeStartError, pick_domain_id, ros_env
from ..replay.playback import ReplayOptions
from ..replay.replay import EXIT_BAD_INPUT, EXIT_UNREACHABLE, NodeUnreachableError, finish, replay

DEMO_CANDIDATES = 8
OPEN_LOOP_RUNS: dict[str, dict[str, Any]] = {
    "mode@8": {"candidates": 8, "reducer": "mode", "return_candidates": True},
    "mean@8": {"candidates": 8, "reducer": "mean", "return_candidates": True},
    "single": {"candidates": 1, "reducer": "mode", "return_candidates": False},
}
"""The open-loop runs on the demonstration bag: the node's reducers at N=8 against one candidate (N=1 is the plain
path: no reduction)."""
DEMO_SEED = 0
"""Goal ``i`` uses base seed ``DEMO_SEED + i``: the demo draws the same candidates every run."""
EXIT_NODE_FAILED = 4
CLOSED_LOOP_EPISODES = 3
"""Scenes of the closed-loop part, each run with and without continuity (~50 s of wall time per episode at most)."""
CLOSED_LOOP_DELAY: int | None = 2
"""Steps from a goal to its chunk taking over in the closed-loop part: the in-process bench's ``d = 2``, and about
what a group of 8 takes on this CPU at the demo's real-time factor. Fixed, so the picture does not depend on load."""
PUSHT_PANEL_MODULE = "trajectory_ensemble_lab.pusht.demo_panel"
"""The lab module that draws the PushT panel (``run(out, model=, device=, log=) -> int``), imported by name as
``calibrate``'s toy-scene mode is: the product never imports the lab."""
# The random tiny model on a 10-wide arm layout, chunk 8 so the plot stays readable and the CPU time low.
TINY_SETTINGS: dict[str, Any] = {"domain_name": "droid_lerobot", "reducer": "mean", "chunk_size": 8,
                                 "num_inference_steps": 10}


def default_model() -> str:
    """The node's default ``model`` parameter (``toy``), read from its parameter table."""
    from ..serving.params import PARAMETERS

    return str(next(spec.default for spec in PARAMETERS if spec.name == "model"))


def toy_installed() -> bool:
    """Whether the toy policy's weights are in the package."""
    from ..toy import toy_pipeline_dir

    return (toy_pipeline_dir() / "model_index.json").is_file()


def node_params(model: str, device: str, candidates: int) -> dict[str, Any]:
    """The node's parameters for the demo: the model's action settings plus candidates published.

    Args:
        model (`str`): ``tiny``, ``toy`` or a directory.
        device (`str`): torch device (``auto``: CUDA when present).
        candidates (`int`): Default candidate count.
    """
    params: dict[str, Any] = {"model": model, "device": device, "candidate_count": candidates,
                              "publish_candidates": True}
    if model == "toy":
        from ..toy import ACTION_SETTINGS

        params.update(ACTION_SETTINGS)
    elif model == "tiny":
        params.update(TINY_SETTINGS)
    return params


def _delay(text: str) -> int | None:
    if text == "arrival":
        return None
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected a number of steps or 'arrival', got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``demo`` flags to ``parser``."""
    parser.add_argument("--model", default=None, help="tiny, toy or a Cosmos 3 directory (default: the node's default)")
    parser.add_argument("--device", default="auto", help="torch device of the node (default auto)")
    parser.add_argument("--bag", type=Path, default=bags.BUNDLED_BAG, help="bag to replay (default: the bundled one)")
    parser.add_argument("--out", type=Path, default=Path("out/demo"), help="output folder (default out/demo)")
    parser.add_argument("--candidates", type=int, default=DEMO_CANDIDATES, help="candidates per goal (8)")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor (1.0)")
    parser.add_argument("--storage", choices=sorted(bags.STORAGES), default="mcap", help="output bag storage (mcap)")
    parser.add_argument("--ready-timeout", type=float, default=600.0, metavar="S",
                        help="seconds to wait for the node to load its model (600)")
    parser.add_argument("--open-loop-bag", type=Path, default=bags.DEMONSTRATION_BAG, metavar="BAG",
                        help="toy policy: demonstration bag for the open-loop figures (default: the bundled one; "
                             "'' = skip)")
    parser.add_argument("--closed-loop-episodes", type=int, default=CLOSED_LOOP_EPISODES, metavar="K",
                        help=f"toy policy: closed-loop episodes with and without continuity ({CLOSED_LOOP_EPISODES}; "
                             "0 = skip)")
    parser.add_argument("--closed-loop-delay", type=_delay, default=CLOSED_LOOP_DELAY, metavar="D|arrival",
                        help=f"closed loop: every chunk takes over D steps after its goal, for a run that repeats "
                             f"exactly (sim --fixed-delay); 'arrival': when it arrives, which varies with the CPU's "
                             f"load ({CLOSED_LOOP_DELAY})")
    parser.add_argument("--pusht", action=argparse.BooleanOptionalAction, default=True,
                        help="the PushT panel: the bundled PushT policy through the node, mode against mean (default "
                             "on; skipped with a line saying why when the lab, gym-pusht or the weights are missing)")


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when every goal succeeded with the right stamp and the node stopped cleanly."""
    started = time.monotonic()
    model = args.model or default_model()
    if model == "toy" and not toy_installed():
        print("demo: the toy policy weights are not installed (trajectory_ensemble_node/assets/toy_policy); "
              "using model tiny (random weights) instead")
        model = "tiny"
    domain_id = pick_domain_id()
    # This process's rclpy reads the domain at init; the node gets the same one through its environment.
    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    args.out.mkdir(parents=True, exist_ok=True)
    params = node_params(model, args.device, args.candidates)
    print(f"demo: model {model}, ROS_DOMAIN_ID={domain_id}, bag {args.bag}, output {args.out}/")
    print(f"demo: starting the node ({', '.join(f'{k}={v}' for k, v in params.items())}); log {args.out}/node.log")
    opts = ReplayOptions(bag=args.bag, rate=args.rate, out=args.out, overwrite=True, storage=args.storage,
                         candidates=args.candidates, return_candidates=True, seed=DEMO_SEED, wait_s=30.0)
    node = NodeProcess(params, ros_env(domain_id), log_path=args.out / "node.log", echo=sys.stdout)
    status = 0
    try:
        node.start(ready_timeout_s=args.ready_timeout)
        print(f"demo: node ready after {time.monotonic() - started:.1f} s; replaying {args.bag.name} "
              f"({args.candidates} candidates per goal, return_candidates)")
        report = replay(opts)
        from ..catalog import model_notice  # catalog imports diffusers: only once a title is drawn

        report.model_title = f"model {model} ({model_notice(model)})"
        status = finish(report, opts)
        if status == 0 and model == "toy" and str(args.open_loop_bag) not in ("", "."):
            status = open_loop(args, report.model_title)
    except NodeStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_NODE_FAILED
    except NodeUnreachableError as error:
        print(f"error: {error}", file=sys.stderr)
        status = EXIT_UNREACHABLE
    except (bags.BagError, TrajectoryEnsembleError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        status = EXIT_BAD_INPUT
    finally:
        code = node.stop()
    print(f"demo: node stopped (exit status {code}); done in {time.monotonic() - started:.1f} s")
    if status == 0 and code != 0:
        print(f"error: the node exited with status {code}; see {args.out}/node.log", file=sys.stderr)
        status = EXIT_NODE_FAILED
    closed = status == 0 and model == "toy" and args.closed_loop_episodes > 0
    if closed:
        status = closed_loop(args)
    panel = status == 0 and pusht_skip_reason(args) is None
    if status == 0:
        status = pusht_panel(args)
    if closed or panel:
        print(f"demo: done in {time.monotonic() - started:.1f} s")
    return status


def open_loop(args: argparse.Namespace, model_title: str) -> int:
    """The open-loop part: :data:`OPEN_LOOP_RUNS` on the demonstration bag, into the node already running.

    Returns:
        `int`: 0, or the first run's non-zero ``replay`` exit status.
    """
    from ..provenance import git_commit, utc_now

    commit, folder = git_commit(), args.out / "open_loop"
    print(f"demo: open loop on {args.open_loop_bag.name}: each served chunk against the expert's demonstrated path "
          f"on {bags.DEMO_REFERENCE_TOPIC} (scene units, RMSE over the 8 rows of every goal)")
    runs: dict[str, Any] = {}
    for name, run in OPEN_LOOP_RUNS.items():
        opts = ReplayOptions(bag=args.open_loop_bag, rate=args.rate, out=folder / name.replace("@", "_"),
                             overwrite=True, storage=args.storage, seed=DEMO_SEED, wait_s=30.0,
                             reference_topic=bags.DEMO_REFERENCE_TOPIC, **run)
        report = replay(opts, log=lambda line: None)
        report.model_title = f"{name}, {model_title}"
        lines: list[str] = []
        status = finish(report, opts, log=lines.append)
        if status != 0 or report.reference is None:
            print("\n".join(lines), file=sys.stderr)
            return status or EXIT_BAD_INPUT
        section = runs[name] = report.reference
        best = (f"  best of {run['candidates']} {section['best_candidate_rmse']:.3f}  served rank "
                f"{section['served_rank_mean']:.1f}" if "best_candidate_rmse" in section else "")
        per_channel = ", ".join(f"{c} {v:.3f}" for c, v in section["rmse_per_channel"].items())
        print(f"demo: {name:>7}  rmse {section['rmse']:.3f} ({per_channel}){best}  by step "
              f"{' '.join(f'{v:.3f}' for v in section['error_by_step'])}")
    document = {"settings": {"date": utc_now(), "commit": commit, "bag": str(args.open_loop_bag),
                             "reference_topic": bags.DEMO_REFERENCE_TOPIC, "seed": DEMO_SEED, "model": model_title,
                             "runs": OPEN_LOOP_RUNS},
                "runs": runs}
    (args.out / "open_loop.json").write_text(json.dumps(document, indent=1))
    print(f"demo: wrote {args.out / 'open_loop.json'}; reference.png and error_by_step.png of each run under "
          f"{folder}/")
    return 0


def closed_loop(args: argparse.Namespace) -> int:
    """The closed-loop part: the same scenes with and without continuity through a node on sim time.

    Returns:
        `int`: 0, or :data:`EXIT_NODE_FAILED` when the node did not start or answer.
    """
    from dataclasses import replace

    from ..cli.ros_client import NodeUnreachableError
    from ..toy import task
    from .sim_model import SimSettings
    from .sim_report import BENCH_RTF, plot_closed_loop, report, serving_node, simulate

    scenes = task.heldout_scenes(args.closed_loop_episodes)
    on = SimSettings(real_time_factor=BENCH_RTF, fixed_delay=args.closed_loop_delay)
    off = replace(on, continue_previous=False)
    folder = args.out / "closed_loop"
    delay = "on arrival" if on.fixed_delay is None else f"{on.fixed_delay} steps after each goal"
    print(f"demo: closed loop, {len(scenes)} held-out scenes with and without continuity (s = {on.execute} of 8, "
          f"chunks take over {delay}, real-time factor {on.real_time_factor:g}; node log {folder}/node.log)")
    log = lambda line: print(f"demo: {line}", flush=True)  # noqa: E731
    device = "cpu" if args.device == "auto" else args.device
    try:
        with serving_node(on, folder, device=device, log=log):
            runs = [(on, simulate(scenes, on, log=log)), (off, simulate(scenes, off, log=log))]
    except (NodeStartError, NodeUnreachableError, TimeoutError) as error:
        print(f"error: closed loop: {error}", file=sys.stderr)
        return EXIT_NODE_FAILED
    documents = {("continue" if s.continue_previous else "naive"): report(r, s) for s, r in runs}
    (args.out / "closed_loop.json").write_text(json.dumps(documents, indent=1))
    labels = ("with continuity", "naive switching")
    picture = plot_closed_loop([(label, records) for label, (_, records) in zip(labels, runs)],
                               args.out / "closed_loop.png")
    for name, document in documents.items():
        m = document["summary"]
        print(f"demo: {name:>8}: mean seam {m['seam_jump_mean']:.3f} (max {m['seam_jump_max']:.3f}), jerk "
              f"{m['jerk']:.0f}, mode flips {m['mode_flips_per_episode']:.2f}, success {m['success_rate']:.2f}, "
              f"collisions {m['collision_rate']:.2f}")
    print(f"demo: wrote {picture} and {args.out / 'closed_loop.json'}")
    return 0


def pusht_skip_reason(args: argparse.Namespace) -> str | None:
    """Why the PushT panel cannot run here, in words (``None``: it can).

    Raises:
        ModuleNotFoundError: The lab is installed but one of its own imports is missing (a broken install, not an
            absent lab: hiding it would blame the wrong thing).
    """
    from ..bundled import bundled_policy

    if not args.pusht:
        return "--no-pusht"
    if lab_module(PUSHT_PANEL_MODULE) is None:
        return f"the lab ({PUSHT_PANEL_MODULE}) is not installed (pip install -e lab, as make test does)"
    try:
        importlib.import_module("gym_pusht")
    except ImportError as error:
        return f"gym_pusht does not import ({error}; make demo installs gym-pusht 0.1.8)"
    policy = bundled_policy("pusht")
    if policy is None or not policy.installed:
        where = "trajectory_ensemble_node/assets/pusht_policy" if policy is None else policy.directory
        rebuild = "" if policy is None else f"; {policy.rebuild}"
        return f"the bundled PushT policy is not installed ({where}{rebuild})"
    return None


def pusht_panel(args: argparse.Namespace) -> int:
    """The PushT panel: the lab's :data:`PUSHT_PANEL_MODULE` on the bundled PushT policy, or one line saying why not.

    Returns:
        `int`: 0 (also when skipped), or the panel's non-zero exit status.
    """
    reason = pusht_skip_reason(args)
    if reason is not None:
        print(f"demo: PushT panel skipped: {reason}")
        return 0
    device = "cpu" if args.device == "auto" else args.device
    panel = importlib.import_module(PUSHT_PANEL_MODULE)
    return int(panel.run(args.out, model="pusht", device=device, log=lambda line: print(f"demo: {line}", flush=True)))
