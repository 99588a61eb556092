"""``trajectory-ensemble sim``: the toy task's point robot as a ROS node, a real client of the serving node.

This module is the command line (the robot: :mod:`.sim_model`, :class:`.sim_robot.SimRobot`, :mod:`.sim_report`).
``--env pusht`` plays PushT through the lab's world (:data:`PUSHT_MODULE`, imported by name; the product never imports
``gym_pusht``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli.dispatch import lab_module
from ..toy import task
from ..toy.episodes import EXECUTE, STEP_BUDGET
from .sim_model import DEFAULT_RTF, SimSettings

ENVS = ("toy", "pusht")
PUSHT_MODULE = "trajectory_ensemble_lab.pusht.ros_world"
"""The lab module that runs ``--env pusht`` (``run(args) -> int``)."""
EXIT_NO_LAB = 2
"""Exit status of ``--env pusht`` without the lab (a usage error: the toy still runs)."""


def _execute(text: str) -> int | None:
    if text == "sync":
        return None
    if text.isdigit() and 1 <= int(text) <= task.HORIZON:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected sync or an integer in [1, {task.HORIZON}], got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sim`` flags to ``parser``."""
    from ..cli.ros_client import DEFAULT_NODE

    parser.add_argument("--env", choices=ENVS, default="toy",
                        help="toy: the toy task's point robot (default); pusht: gym_pusht/PushT-v0 from the lab, "
                             "a node serving a PushT checkpoint (docs/pusht.md)")
    parser.add_argument("--episodes", type=int, default=3, help="episodes, one held-out scene each (3)")
    parser.add_argument("--scene-seed", type=int, default=0, help="first held-out scene offset (0)")
    parser.add_argument("--real-time-factor", type=float, default=DEFAULT_RTF, metavar="R",
                        help=f"sim seconds per wall second ({DEFAULT_RTF}); the node needs use_sim_time:=true")
    parser.add_argument("--execute", type=_execute, default=EXECUTE, metavar="s|sync",
                        help=f"actions executed before the next goal, or sync: after the whole chunk ({EXECUTE})")
    parser.add_argument("--no-continue", action="store_true",
                        help="goals do not continue the executing chunk (continue_previous false, reset_context)")
    parser.add_argument("--inference-delay", type=int, default=0, help="goal inference_delay (0 = node's estimate)")
    parser.add_argument("--fixed-delay", type=int, default=None, metavar="D",
                        help="every chunk takes over exactly D steps after its goal (the sim holds early chunks and "
                             "stops its clock for late ones): runs repeat exactly; default: when it arrives")
    parser.add_argument("--candidates", type=int, default=0, help="goal candidate_count (0 = node default)")
    parser.add_argument("--image-rate", type=float, default=None, help=f"camera frames per sim second ({task.FPS:g})")
    parser.add_argument("--step-budget", type=int, default=None, help=f"steps per episode ({STEP_BUDGET})")
    parser.add_argument("--base-seed", type=int, default=0, help="candidate seeds: base + 1000 scene + chunk (0)")
    parser.add_argument("--json", type=Path, default=Path("out/sim/episodes.json"), help="output (out/sim/episodes.json)")
    parser.add_argument("--node", "--node-name", dest="node", default=DEFAULT_NODE,
                        help=f"the serving node's fully qualified name ({DEFAULT_NODE})")
    parser.add_argument("--image-topic", default=None, help="camera topic (default <node>/observation/image)")
    parser.add_argument("--start-node", action="store_true",
                        help="start the node as a child process (toy model, use_sim_time) instead of using a running one")
    parser.add_argument("--device", default="cpu", help="--start-node: torch device of the node (cpu)")
    parser.add_argument("--wait", type=float, default=60.0, metavar="S", help="seconds to wait for the node (60)")


def settings_from(args: argparse.Namespace) -> SimSettings:
    """The toy's settings from the flags (``--image-rate`` and ``--step-budget`` unset: the toy's 8 fps and
    :data:`STEP_BUDGET`; ``--env pusht`` reads them with its own defaults)."""
    image_rate = task.FPS if args.image_rate is None else args.image_rate
    step_budget = STEP_BUDGET if args.step_budget is None else args.step_budget
    return SimSettings(execute=args.execute, real_time_factor=args.real_time_factor, image_rate=image_rate,
                       continue_previous=not args.no_continue, inference_delay=args.inference_delay,
                       candidates=args.candidates, step_budget=step_budget, base_seed=args.base_seed,
                       fixed_delay=args.fixed_delay)


def _run_lab_env(args: argparse.Namespace) -> int:
    # The PushT world needs gym_pusht, which only the lab installs.
    module = lab_module(PUSHT_MODULE)
    if module is None:
        print(f"error: sim --env {args.env} plays gym_pusht/PushT-v0 through the lab ({PUSHT_MODULE}), which is not "
              "installed; install the lab (pip install -e lab, as make test does) or use --env toy", file=sys.stderr)
        return EXIT_NO_LAB
    return int(module.run(args))


def run(args: argparse.Namespace) -> int:
    """Run ``trajectory-ensemble sim``; 0 when every episode ran to its end."""
    if getattr(args, "env", "toy") != "toy":
        return _run_lab_env(args)
    from ..cli.launcher import NodeStartError
    from ..cli.ros_client import NodeUnreachableError, check_node_name
    from .sim_report import report, simulate

    try:
        check_node_name(args.node)
        settings = settings_from(args)
        if args.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    scenes = task.heldout_scenes(args.episodes, seed=args.scene_seed)
    try:
        records = simulate(scenes, settings, node=args.node, image_topic=args.image_topic,
                           start_node=args.start_node, device=args.device, wait_s=args.wait,
                           log_dir=args.json.parent, log=lambda m: print(m, flush=True))
    except (NodeStartError, NodeUnreachableError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = report(records, settings)
    args.json.write_text(json.dumps(document, indent=1))
    summary = document["summary"]
    print(f"sim: success {summary['success_rate']:.2f}, collisions {summary['collision_rate']:.2f}, mean seam "
          f"{summary['seam_jump_mean']:.3f}, continued {summary['continued_fraction']}")
    print(f"wrote {args.json}")
    return 0

