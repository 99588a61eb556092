"""``trajectory-ensemble lifecycle``: read or change a managed node's lifecycle state (``ros2 lifecycle`` on PyPI).

``lifecycle get`` prints the node's state (``unconfigured``, ``inactive``, ``active``, ``finalized``);
``lifecycle set TRANSITION`` asks for ``configure``, ``activate``, ``deactivate``, ``cleanup`` or ``shutdown``
through the standard ``~/change_state`` service and prints the state it reached; ``lifecycle list`` prints the
transitions available from the current state. A transition's id is looked up by its label among those
``~/get_available_transitions`` offers now, as ``ros2 lifecycle set`` does, so ``shutdown`` works from any state.
"""

from __future__ import annotations

import argparse
from typing import Any

from .exits import fail, run_command
from .ros_client import ClientSession, NodeUnreachableError, add_node_arguments, check_node_name, domain_text

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
TRANSITIONS = ("configure", "activate", "deactivate", "cleanup", "shutdown")
ANSWER_TIMEOUT_S = 600.0
"""How long one transition may take: ``configure`` loads the model and warms it up (minutes for a real checkpoint)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``lifecycle`` flags and its ``get``/``set``/``list`` actions to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (f"exit status:\n  {EXIT_OK}  done\n  {EXIT_REFUSED}  the node refused or failed the transition "
                     f"(not available from its state, or its callback failed)\n  {EXIT_USAGE}  bad arguments\n  "
                     f"{EXIT_UNREACHABLE}  the node's lifecycle services did not appear within --wait")
    where = add_node_arguments(parser, "lifecycle")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("get", parents=[where], help="print the node's lifecycle state")
    actions.add_parser("list", parents=[where], help="print the transitions available from the current state")
    put = actions.add_parser("set", parents=[where], help="ask for a transition; print the state reached")
    put.add_argument("transition", choices=TRANSITIONS)


class LifecycleClient:
    """The three standard lifecycle services of one node.

    Args:
        session (`ClientSession`): The command's rclpy session.
        node_name (`str`): The managed node's fully qualified name.
        wait_s (`float`): How long to wait for the services to appear.

    Raises:
        NodeUnreachableError: The services do not appear within ``wait_s``.
    """

    def __init__(self, session: ClientSession, node_name: str, wait_s: float) -> None:
        from lifecycle_msgs.srv import ChangeState, GetAvailableTransitions, GetState

        self.session, self.node_name = session, node_name
        self._get = session.node.create_client(GetState, f"{node_name}/get_state")
        self._change = session.node.create_client(ChangeState, f"{node_name}/change_state")
        self._available = session.node.create_client(GetAvailableTransitions,
                                                     f"{node_name}/get_available_transitions")
        clients = (self._get, self._change, self._available)
        if not session.wait_until(lambda: all(c.service_is_ready() for c in clients), wait_s):
            raise NodeUnreachableError(f"no lifecycle services of {node_name} within {wait_s:g} s ({domain_text()});"
                                       f" is it running with this name, and is it a managed node?")

    def _call(self, client: Any, request: Any, what: str) -> Any:
        future = client.call_async(request)
        if not self.session.wait_future(future, ANSWER_TIMEOUT_S):
            raise NodeUnreachableError(f"{self.node_name} did not answer {what} within {ANSWER_TIMEOUT_S:g} s")
        return future.result()

    def state(self) -> str:
        """The node's current state label (``unconfigured``, ``inactive``, ``active``, ``finalized``, ...)."""
        from lifecycle_msgs.srv import GetState

        return self._call(self._get, GetState.Request(), "get_state").current_state.label

    def available(self) -> list[tuple[str, int]]:
        """``(label, id)`` of each transition available from the current state."""
        from lifecycle_msgs.srv import GetAvailableTransitions

        response = self._call(self._available, GetAvailableTransitions.Request(), "get_available_transitions")
        return [(t.transition.label, t.transition.id) for t in response.available_transitions]

    def change(self, label: str) -> tuple[bool, str]:
        """Ask for the transition named ``label``; ``(success, state label afterwards)``.

        Raises:
            ValueError: ``label`` is not available from the current state (the message lists what is).
        """
        from lifecycle_msgs.srv import ChangeState

        offered = self.available()
        ids = [tid for name, tid in offered if name == label]
        if not ids:
            raise ValueError(f"transition {label!r} is not available from state {self.state()!r}; available: "
                             f"{sorted({name for name, _ in offered})}")
        request = ChangeState.Request()
        request.transition.id = ids[0]
        success = bool(self._call(self._change, request, f"change_state {label}").success)
        return success, self.state()


def run(args: argparse.Namespace) -> int:
    """Run ``trajectory-ensemble lifecycle``; the exit status of ``add_arguments``' epilog."""
    try:
        check_node_name(args.node)
    except ValueError as error:
        return fail(error, EXIT_USAGE)
    session = ClientSession("trajectory_ensemble_lifecycle")
    try:
        return run_command(lambda: _lifecycle(session, args), ((NodeUnreachableError, EXIT_UNREACHABLE),))
    finally:
        session.close()


def _lifecycle(session: ClientSession, args: argparse.Namespace) -> int:
    client = LifecycleClient(session, args.node, args.wait)
    if args.action == "get":
        print(client.state())
        return EXIT_OK
    if args.action == "list":
        for label, tid in client.available():
            print(f"{label} [{tid}]")
        return EXIT_OK
    try:
        success, state = client.change(args.transition)
    except ValueError as error:
        return fail(error, EXIT_REFUSED)
    if not success:
        return fail(f"{args.transition} failed; {args.node} is {state}", EXIT_REFUSED)
    print(f"{args.transition}: {args.node} is {state}")
    return EXIT_OK
