"""``trajectory-ensemble serve``: run the node from a shell, with a parameter file and any ROS arguments.

Equivalent to the ``trajectory_ensemble_node`` executable (what ``ros2 run`` / ``ros2 launch`` start)::

    trajectory-ensemble serve --params-file config/serve.yaml --ros-args -p num_inference_steps:=4
"""

from __future__ import annotations

import argparse
import os

from . import node


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--params-file`` and the pass-through ``--ros-args ...`` to the ``serve`` parser.

    Args:
        parser (`argparse.ArgumentParser`): The ``serve`` subcommand's parser.
    """
    parser.add_argument(
        "--params-file",
        default=None,
        help="YAML file with the node's ros__parameters (e.g. config/serve.yaml), under '/**/trajectory_ensemble:'",
    )
    parser.add_argument(
        "--ros-args",
        dest="ros_args",
        nargs=argparse.REMAINDER,
        default=[],
        help="everything after it is passed to ROS unchanged (e.g. --ros-args -p device:=cpu -r __ns:=/robot)",
    )


def build_argv(params_file: str | None, ros_args: list[str]) -> list[str]:
    """The node's argv: ``--ros-args [--params-file FILE] [ROS args...]``.

    Args:
        params_file (`str`, *optional*): Parameter file; checked to exist so a typo fails here, not silently.
        ros_args (`list[str]`): Arguments that followed ``--ros-args``.

    Raises:
        SystemExit: the parameter file does not exist.
    """
    argv = ["trajectory_ensemble_node"]
    if params_file is None and not ros_args:
        return argv
    argv.append("--ros-args")
    if params_file is not None:
        if not os.path.isfile(params_file):
            raise SystemExit(f"error: --params-file {params_file!r} does not exist")
        argv += ["--params-file", params_file]
    return argv + list(ros_args)


def run(args: argparse.Namespace) -> int:
    """Run the node until SIGINT/SIGTERM.

    Args:
        args (`argparse.Namespace`): ``params_file`` and ``ros_args``.

    Returns:
        `int`: the node's exit status (2 on invalid parameters).
    """
    return node.main(build_argv(args.params_file, list(args.ros_args or [])))
