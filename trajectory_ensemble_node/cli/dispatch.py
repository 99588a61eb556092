"""``trajectory-ensemble``: serve, demo, sim, replay, send-goal, diagnostics, params, calibrate, docs (and the lab's).

Each subcommand lives in the module that owns it (``add_arguments(parser)``, ``run(args) -> int``) and is imported only
when its command runs, so ``docs`` works without rclpy. The product's commands are :data:`_COMMANDS`; other packages
(the lab) add theirs through the ``trajectory_ensemble.commands`` entry points (docs/development.md).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Mapping, Sequence
from types import ModuleType

BROKEN_PIPE_EXIT = 141
"""Exit status when stdout's reader closed early (128 + SIGPIPE, what a shell reports for a piped tool)."""
COMMAND_GROUP = "trajectory_ensemble.commands"
"""Entry-point group whose entries are ``{command: (module, help)}`` tables, merged after :data:`_COMMANDS`."""

# command -> (module, help). Modules are imported lazily.
_COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("trajectory_ensemble_node.ros.serve", "run the ROS 2 node (same as the trajectory_ensemble_node executable)"),
    "serve-openpi": ("trajectory_ensemble_node.openpi.cli",
                     "serve the engine on the OpenPI websocket wire (openpi-client, vLLM-Omni, RoboLab), no ROS"),
    "serve-ray": ("trajectory_ensemble_node.fleet.cli",
                  "the OpenPI wire in front of engine replicas on Ray Serve (--replicas R); needs .[fleet]"),
    "demo": ("trajectory_ensemble_node.demo.demo", "the main job: node + bundled bag + goals, plots under out/"),
    "replay": ("trajectory_ensemble_node.replay.replay", "replay a rosbag2 into the node and record its trajectories"),
    "bags": ("trajectory_ensemble_node.replay.bags",
             "make the toy demo bags (make-demo-bag [--reference]) or show what a bag holds (info)"),
    "sim": ("trajectory_ensemble_node.demo.sim",
            "the toy task's robot as a ROS node: camera, /clock, goals to a use_sim_time node, chunks executed"),
    "send-goal": ("trajectory_ensemble_node.cli.send_goal",
                  "send one GenerateTrajectory goal to a running node; print feedback and result"),
    "diagnostics": ("trajectory_ensemble_node.cli.diagnostics", "print a running node's /diagnostics statuses"),
    "params": ("trajectory_ensemble_node.cli.params",
               "list, get or set a running node's parameters (its parameter services)"),
    "lifecycle": ("trajectory_ensemble_node.cli.lifecycle",
                  "get or change a managed node's lifecycle state (configure, activate, deactivate, cleanup, ...)"),
    "docs": ("trajectory_ensemble_node.cli.docs", "write docs/parameters.md, docs/errors.md and the README's error table from the code"),
    "calibrate": ("trajectory_ensemble_node.calibration.calibrate",
                  "conformal threshold of the uncertainty score: on the toy task (tested on shifted scenes) or "
                  "from recorded successful episodes (--bag)"),
}


def _load(module_name: str):
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        missing = exc.name or str(exc)
        print(f"error: {module_name} could not be imported ({missing} is missing): {exc}", file=sys.stderr)
        raise SystemExit(2) from exc


def lab_module(name: str) -> ModuleType | None:
    """The lab module ``name`` (the product never imports the lab: by name only), or ``None`` when the lab (or that
    module) is not installed.

    Args:
        name (`str`): Dotted module name under ``trajectory_ensemble_lab``.

    Raises:
        ModuleNotFoundError: The lab is installed but one of its own imports is missing (a broken install, not an
            absent lab: hiding it would blame the wrong thing).
    """
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and (name == error.name or name.startswith(error.name + ".")):
            return None
        raise


def commands() -> dict[str, tuple[str, str]]:
    """Every command: the product's, then each installed plugin table's (a name clash is an error).

    Raises:
        SystemExit: two tables define the same command, or an entry is not a table of ``(module, help)`` pairs.
    """
    table = dict(_COMMANDS)
    for entry in sorted(importlib.metadata.entry_points(group=COMMAND_GROUP), key=lambda e: e.name):
        try:
            extra = entry.load()
        except ImportError as exc:
            # A package uninstalled without its metadata: its commands are gone, the product's still work.
            print(f"warning: commands of {entry.value} are not available ({exc})", file=sys.stderr)
            continue
        if not isinstance(extra, Mapping):
            print(f"error: entry point {entry.name!r} ({entry.value}) is not a command table", file=sys.stderr)
            raise SystemExit(2)
        for name, (module_name, help_text) in extra.items():
            if name in table:
                print(f"error: command {name!r} of {entry.value} is already defined by {table[name][0]}",
                      file=sys.stderr)
                raise SystemExit(2)
            table[name] = (module_name, help_text)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trajectory-ensemble`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="trajectory-ensemble", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in commands().items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen command's module is imported, so one missing optional dependency can't break the others.
        if name == chosen:
            module = _load(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_run=module.run)
    args = parser.parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:
        # The reader went away (``params list | head``): stop quietly, as a shell tool does, with SIGPIPE's status.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE_EXIT


def node_main() -> int:
    """Entry point of the ``trajectory_ensemble_node`` executable (what ``ros2 run``/``ros2 launch`` start).

    Accepts ROS arguments (``--ros-args -p key:=value ...``) exactly like any rclpy node.
    """
    module = _load("trajectory_ensemble_node.ros.serve")
    return int(module.main(sys.argv) or 0)
