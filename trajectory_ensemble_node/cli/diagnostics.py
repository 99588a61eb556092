"""``trajectory-ensemble diagnostics``: print the node's ``/diagnostics`` statuses as they arrive.

What ``ros2 topic echo /diagnostics`` would show, filtered to one node: its statuses are named
``"<node name>: <task>"`` (``engine``, ``goals``, ``observations``), the ``diagnostic_updater`` convention.
``--once`` prints the next update and exits, for scripts and health checks.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from .exits import fail
from .ros_client import DEFAULT_NODE, ClientSession, check_node_name, domain_text, node_basename

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NOTHING = 3
LEVELS = {0: "OK", 1: "WARN", 2: "ERROR", 3: "STALE"}
"""``diagnostic_msgs/DiagnosticStatus`` levels (bytes on the wire)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``diagnostics`` flags to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (f"exit status:\n  {EXIT_OK}  printed (or stopped with Ctrl-C)\n  {EXIT_USAGE}  bad arguments\n"
                     f"  {EXIT_NOTHING}  --once: no status of the node within --timeout")
    parser.add_argument("--node", default=DEFAULT_NODE,
                        help=f"the node's fully qualified name; its statuses are named '<name>: ...' "
                             f"(default {DEFAULT_NODE})")
    parser.add_argument("--once", action="store_true", help="print the next update of the node's statuses and exit")
    parser.add_argument("--timeout", type=float, default=30.0, metavar="S",
                        help="--once: seconds to wait for an update (30; the node publishes at 1 Hz)")
    parser.add_argument("--all", action="store_true", help="every status on /diagnostics, not only this node's")


def _level(level: Any) -> str:
    value = level[0] if isinstance(level, (bytes, bytearray)) else int(level)
    return LEVELS.get(value, str(value))


def status_lines(array: Any, prefix: str | None) -> list[str]:
    """The printed form of one ``DiagnosticArray``: a line per status, then its values indented.

    Args:
        array (`diagnostic_msgs/DiagnosticArray`): One message.
        prefix (`str`, *optional*): Keep only statuses whose name starts with it (``"trajectory_ensemble: "``).
    """
    statuses = [s for s in array.status if prefix is None or s.name.startswith(prefix)]
    if not statuses:
        return []
    stamp = array.header.stamp
    when = time.strftime("%H:%M:%S", time.localtime(int(stamp.sec))) + f".{int(stamp.nanosec) // 1_000_000:03d}"
    lines = []
    for status in statuses:
        hardware = f" [{status.hardware_id}]" if status.hardware_id else ""
        lines.append(f"{when} {_level(status.level):<5} {status.name}{hardware}: {status.message}")
        lines += [f"    {kv.key}: {kv.value}" for kv in status.values]
    return lines


def echo(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Subscribe to ``/diagnostics`` and print (see the module docstring); returns the exit status."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import QoSProfile

    prefix = None if args.all else f"{node_basename(args.node)}: "
    printed: list[int] = [0]
    stop = [False]

    def on_message(array: Any) -> None:
        lines = status_lines(array, prefix)
        if lines:
            for line in lines:
                log(line)
            printed[0] += 1

    previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.__setitem__(0, True))
    try:
        with ClientSession("trajectory_ensemble_diagnostics") as session:
            session.node.create_subscription(DiagnosticArray, "/diagnostics", on_message, QoSProfile(depth=50))
            deadline = time.monotonic() + args.timeout
            while not stop[0]:
                session.executor.spin_once(timeout_sec=0.1)
                if args.once and printed[0]:
                    return EXIT_OK
                if args.once and time.monotonic() >= deadline:
                    what = "status" if prefix is None else f"status named '{prefix}...'"
                    print(f"error: no {what} on /diagnostics within {args.timeout:g} s on {domain_text()} "
                          f"(nodes seen: {', '.join(session.node_names()) or 'none'})", file=sys.stderr)
                    return EXIT_NOTHING
    finally:
        signal.signal(signal.SIGINT, previous)
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Run ``trajectory-ensemble diagnostics``; the exit status is listed in ``--help``."""
    try:
        check_node_name(args.node)
        if args.timeout <= 0:
            raise ValueError(f"--timeout must be > 0, got {args.timeout:g}")
    except ValueError as error:
        return fail(error, EXIT_USAGE)
    try:
        return echo(args, log=lambda line: print(line, flush=True))
    except BrokenPipeError:
        # The reader went away (``| head``): that ends the echo, it is not an error. Point stdout at devnull so the
        # interpreter's own flush at exit does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
