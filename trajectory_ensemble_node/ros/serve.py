"""Run the node as a process: ``trajectory-ensemble serve`` and the ``trajectory_ensemble_node`` executable.

:func:`main` owns the process around the node: rclpy's context, our own SIGINT/SIGTERM handling (so running goals
still hear that they ended), the executor, and a bounded shutdown. ``trajectory-ensemble serve`` is the same with a
parameter file, for a shell::

    trajectory-ensemble serve --params-file config/serve.yaml --ros-args -p num_inference_steps:=4
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from ..errors import TrajectoryEnsembleError, describe_error
from ..serving.shutdown import arm_exit_deadline, exit_now
from .guards import check_params_files
from .node import NODE_NAME, TrajectoryEnsembleNode


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
    return main(build_argv(args.params_file, list(args.ros_args or [])))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the node until SIGINT/SIGTERM; every goal still running then ends ABORTED with code SHUTDOWN.

    Args:
        argv (`Sequence[str]`, *optional*): Command line including ROS arguments (``--ros-args -p k:=v``).

    Returns:
        `int`: 0 on a clean shutdown, 2 when parameters or the model are invalid (the error is printed as
        ``NAME (code): message``).
    """
    argv = list(sys.argv if argv is None else argv)
    # Our own signal handling: rclpy's would invalidate the context at once, and then the goals still running
    # could not be told that they ended.
    rclpy.init(args=argv, signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: (stop.set(), arm_exit_deadline()))
    try:
        node = TrajectoryEnsembleNode()
    except TrajectoryEnsembleError as error:
        # NAME (code): message, so an operator can look the refusal up in the error table.
        print(f"[{NODE_NAME}] error: {describe_error(error)}", file=sys.stderr, flush=True)
        rclpy.try_shutdown()
        return 2
    p = node.params
    check_params_files(node, argv)
    # Goal threads block on the engine; leave room for them plus cancels, feedback, subscriptions and the timer.
    threads = 4 + p.max_concurrent_goals + (8 if p.goal_policy == "queue" else 1)
    executor = MultiThreadedExecutor(num_threads=threads)
    executor.add_node(node)
    try:
        while not stop.is_set() and rclpy.ok():
            executor.spin_once(timeout_sec=0.2)
        node.get_logger().info("shutting down: ending every goal")
        node.shutdown()
        # Keep spinning so that the aborted goals' results (and their status) reach their clients; bounded well
        # inside SHUTDOWN_DEADLINE_S, after which the watchdog ends the process anyway.
        deadline = time.monotonic() + 1.5
        while node.tracker.num_active and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.05)
        linger = time.monotonic() + 0.5
        while time.monotonic() < linger:
            executor.spin_once(timeout_sec=0.05)
    finally:
        node.after_result.stop()
        executor.shutdown(timeout_sec=1.0)
        node.destroy_node()
        rclpy.try_shutdown()
    if stop.is_set():
        exit_now(0)  # interpreter teardown took seconds more, with the exit watchdog already frozen
    return 0
