"""``trajectory-ensemble``: serve, demo, sim, replay, send-goal, diagnostics, params, bench, train-toy, train-grpo, docs.

Each subcommand lives in the module that owns its concept and exposes ``add_arguments(parser)`` and
``run(args) -> int``; this file only dispatches, importing a module when its command runs, so that (for example)
``bench`` works on a machine without rclpy.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# command -> (module, help). Modules are imported lazily.
_COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("trajectory_ensemble_node.ros.serve", "run the ROS 2 node (same as the trajectory_ensemble_node executable)"),
    "demo": ("trajectory_ensemble_node.tools.demo", "the main job: node + bundled bag + goals, plots under out/"),
    "replay": ("trajectory_ensemble_node.tools.replay", "replay a rosbag2 into the node and record its trajectories"),
    "sim": ("trajectory_ensemble_node.tools.sim",
            "the toy task's robot as a ROS node: camera, /clock, goals to a use_sim_time node, chunks executed"),
    "send-goal": ("trajectory_ensemble_node.tools.send_goal",
                  "send one GenerateTrajectory goal to a running node; print feedback and result"),
    "diagnostics": ("trajectory_ensemble_node.tools.diagnostics_echo", "print a running node's /diagnostics statuses"),
    "params": ("trajectory_ensemble_node.tools.param_cli",
               "list, get or set a running node's parameters (its parameter services)"),
    "bench": ("trajectory_ensemble_node.bench.cli", "batched candidates vs sequential upstream (and --quality, --ros)"),
    "train-toy": ("trajectory_ensemble_node.toy.train", "train the toy bimodal obstacle policy on CPU"),
    "train-grpo": ("trajectory_ensemble_node.tools.train_grpo",
                   "Flow-GRPO fine-tuning of the toy policy from its own rollout groups (in process or --ros)"),
    "docs": ("trajectory_ensemble_node.tools.docs", "write docs/parameters.md, docs/errors.md and the README's error table from the code"),
    "calibrate": ("trajectory_ensemble_node.toy.calibrate",
                  "conformal threshold of the uncertainty score on the toy task, tested on shifted scenes"),
    "bench-steps": ("trajectory_ensemble_node.toy.steps",
                    "collision rate against denoising steps on the toy task, and half-time deadlines"),
}


def _load(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name or str(exc)
        print(f"error: {module_name} could not be imported ({missing} is missing): {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trajectory-ensemble`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="trajectory-ensemble", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in _COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen command's module is imported, so one missing optional dependency can't break the others.
        if name == chosen:
            module = _load(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_run=module.run)
    args = parser.parse_args(argv)
    return int(args._run(args) or 0)


def node_main() -> int:
    """Entry point of the ``trajectory_ensemble_node`` executable (what ``ros2 run``/``ros2 launch`` start).

    Accepts ROS arguments (``--ros-args -p key:=value ...``) exactly like any rclpy node.
    """
    module = _load("trajectory_ensemble_node.ros.serve")
    return int(module.main(sys.argv) or 0)


if __name__ == "__main__":
    sys.exit(main())
