"""What the ROS tools (``send-goal``, ``diagnostics``, ``params``, ``replay``) share: node names, a client session
spun from the calling thread, and waiting for the node with a progress line that says what it waits for.

rclpy is imported inside the functions that need it, so this module (and the tools' ``--help``) imports without ROS.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import time
from collections.abc import Callable
from typing import Any

from ..errors import TrajectoryEnsembleError

DEFAULT_NODE = "/trajectory_ensemble"
"""The node's fully qualified name when it runs with its defaults (``trajectory-ensemble serve``)."""
PROGRESS_EVERY_S = 10.0
"""How often a wait for the node prints that it is still waiting."""
QUIET_S = 1.0
"""A wait says nothing for this long: discovering a running node takes a moment and is not worth a line."""
DISCOVERY_SETTLE_S = 0.5
"""How long a new publisher waits after it matches the node's subscription before its first sample: the node's
reader matches the publisher on its own discovery message, a moment later, and drops best-effort samples till then."""
_NAME = re.compile(r"^(/[A-Za-z_~][A-Za-z0-9_]*)+$")


class NodeUnreachableError(TrajectoryEnsembleError, ConnectionError):
    """The node's action server or services did not appear (not running, other ROS_DOMAIN_ID, or other name)."""


def check_node_name(name: str) -> str:
    """The node's fully qualified name, checked: absolute, ROS name characters, no trailing slash.

    Raises:
        ValueError: ``name`` is not a fully qualified node name; the message quotes it.
    """
    if not _NAME.match(name):
        raise ValueError(f"--node must be a fully qualified node name such as {DEFAULT_NODE} or /robot1/"
                         f"trajectory_ensemble (absolute, letters, digits and _), got {name!r}")
    return name


def add_node_arguments(parser: argparse.ArgumentParser, services: str) -> argparse.ArgumentParser:
    """Add ``--node`` and ``--wait`` to ``parser``; return a parent parser that repeats them after an action.

    Args:
        parser (`argparse.ArgumentParser`): A command that talks to one node's ``services`` (e.g. "parameter").
        services (`str`): Named in the ``--wait`` help.

    Returns:
        `argparse.ArgumentParser`: Pass it as ``parents=[...]`` to every action, so ``params list --node /x`` works;
        its defaults are SUPPRESS, so an unset flag after the action does not override one before it.
    """
    parser.add_argument("--node", default=DEFAULT_NODE, help=f"the node's fully qualified name ({DEFAULT_NODE})")
    parser.add_argument("--wait", type=float, default=30.0, metavar="S",
                        help=f"seconds to wait for the node's {services} services (30)")
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--node", default=argparse.SUPPRESS, help="as above")
    where.add_argument("--wait", type=float, default=argparse.SUPPRESS, metavar="S", help="as above")
    return where


def node_basename(name: str) -> str:
    """``/robot1/trajectory_ensemble`` -> ``trajectory_ensemble`` (the prefix of the node's diagnostics names)."""
    return name.rsplit("/", 1)[-1]


def domain_text() -> str:
    """``ROS_DOMAIN_ID=<id>`` as this process sees it (``0`` when unset), for error messages."""
    return f"ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '').strip() or '0'}"


def wait_with_progress(
    ready: Callable[[], bool],
    pump: Callable[[float], None],
    timeout_s: float,
    what: str,
    log: Callable[[str], None],
    every_s: float = PROGRESS_EVERY_S,
    clock: Callable[[], float] = time.monotonic,
    quiet_s: float = QUIET_S,
) -> bool:

    """Wait until ``ready()``, calling ``pump(seconds)`` in between; True when it became ready in time.

    A node can take minutes to appear (a real checkpoint loads before the action server exists), so silence would
    look like a hang: when ``ready()`` is still false after ``quiet_s``, one line says what is awaited, since when
    and for how long at most, and another follows every ``every_s`` seconds.

    Args:
        ready (`Callable[[], bool]`): The condition, e.g. ``ActionClient.server_is_ready``.
        pump (`Callable[[float], None]`): Spins the caller's executor (or sleeps) for about that many seconds.
        timeout_s (`float`): Give up after this long.
        what (`str`): What is awaited, e.g. ``"the action server /trajectory_ensemble/generate_trajectory"``.
        log (`Callable[[str], None]`): Receives the progress lines.
        every_s (`float`): Seconds between progress lines.
        clock (`Callable[[], float]`): Monotonic seconds (a test passes a fake one).
        quiet_s (`float`): Seconds before the first line.
    """
    if ready():
        return True
    started = clock()
    since = datetime.datetime.now().strftime("%H:%M:%S")
    announced = False
    next_line = started + every_s
    while True:
        now = clock()
        if now - started >= timeout_s:
            return ready()
        pump(max(0.0, min(0.1, timeout_s - (now - started))))
        if ready():
            return True
        if not announced and clock() - started >= min(quiet_s, timeout_s):
            log(f"waiting for {what} (since {since}, up to {timeout_s:g} s)")
            announced = True
        elif clock() >= next_line:
            log(f"still waiting for {what} (since {since}: {clock() - started:.0f} s of up to {timeout_s:g} s)")
            next_line += every_s


def subscribe_goal_feedback(node: Any, action_type: Any, action_name: str,
                            callback: Callable[[bytes, Any], None]) -> Any:
    """Subscribe to every goal's feedback on ``action_name``'s feedback topic; returns the subscription.

    Why not the ``ActionClient``'s feedback callback: rclpy drops a goal's callback once its result arrives, and
    DDS does not order the feedback topic against the result service, so a goal's last feedback (``done``) can land
    after its result and would be lost.

    Args:
        node (`rclpy.node.Node`): The client's node.
        action_type (`type`): The action (``GenerateTrajectory``).
        action_name (`str`): Fully qualified action name.
        callback (`Callable[[bytes, Any], None]`): Called with the goal's uuid (16 bytes) and its feedback.
    """
    from rclpy.qos import QoSProfile

    # The ActionClient's own feedback QoS (reliable, keep last 10), so it matches the server's writer as it does.
    return node.create_subscription(
        action_type.Impl.FeedbackMessage, f"{action_name}/_action/feedback",
        lambda msg: callback(bytes(msg.goal_id.uuid), msg.feedback), QoSProfile(depth=10))


class ClientSession:
    """An rclpy context, node and executor for one command, spun only from the calling thread.

    Why not a background spin thread: rclpy 9 registers the future of ``send_goal_async`` and ``call_async`` only
    after sending, so an executor thread that handles a fast response in between completes a future nobody holds and
    the one returned never completes (seen as a goal "timing out" while the node served it). rclpy's own SIGINT
    handler is not installed: a command decides itself what Ctrl-C does.

    Args:
        name (`str`): This client node's name.
    """

    def __init__(self, name: str) -> None:
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.signals import SignalHandlerOptions

        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        self.node = rclpy.create_node(name, context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)

    def spin_for(self, seconds: float) -> None:
        """Serve callbacks for ``seconds`` of wall time (at least one pass)."""
        deadline = time.monotonic() + max(seconds, 0.0)
        while True:
            self.executor.spin_once(timeout_sec=max(0.0, min(deadline - time.monotonic(), 0.05)))
            if time.monotonic() >= deadline:
                return

    def wait_until(self, predicate: Callable[[], Any], timeout_s: float,
                   interrupted: Callable[[], bool] | None = None) -> bool:
        """Spin until ``predicate()`` is true (True), ``timeout_s`` passes or ``interrupted()`` turns true (False)."""
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if time.monotonic() >= deadline or (interrupted is not None and interrupted()):
                return False
            self.executor.spin_once(timeout_sec=0.05)
        return True

    def wait_future(self, future: Any, timeout_s: float, interrupted: Callable[[], bool] | None = None) -> bool:
        """Spin until ``future`` is done (True), ``timeout_s`` passes or ``interrupted()`` turns true (False)."""
        return self.wait_until(future.done, timeout_s, interrupted)

    def action_servers(self, action_type: str = "trajectory_ensemble_msgs/action/GenerateTrajectory") -> list[str]:
        """Names of the action servers of ``action_type`` on the graph (for "did you mean" messages)."""
        from rclpy.action import get_action_names_and_types

        return sorted(name for name, types in get_action_names_and_types(self.node) if action_type in types)

    def node_names(self) -> list[str]:
        """Fully qualified names of the nodes on the graph, this one excepted."""
        mine = self.node.get_fully_qualified_name()
        names = (f"{ns.rstrip('/')}/{name}" for name, ns in self.node.get_node_names_and_namespaces())
        return sorted(n for n in names if n != mine)

    def close(self) -> None:
        """Shut the executor and the context down."""
        import rclpy

        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)

    def __enter__(self) -> ClientSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
