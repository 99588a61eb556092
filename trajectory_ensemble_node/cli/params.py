"""``trajectory-ensemble params list|get|set``: the node's parameters through its standard parameter services.

What ``ros2 param`` would do, on an install without the ``ros2`` CLI: ``rcl_interfaces`` ListParameters,
DescribeParameters, GetParameters and SetParameters on ``<node>/...``, so it works on any rclpy or rclcpp node.
``set`` types the value from the parameter's current type (``4`` is an integer for ``candidate_count`` and a double
for ``fps``); a node that refuses prints its reason.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import yaml

from ..errors import ErrorCode, TrajectoryEnsembleError
from .exits import fail, run_command
from .ros_client import (
    ClientSession,
    NodeUnreachableError,
    add_node_arguments,
    check_node_name,
    domain_text,
    wait_with_progress,
)


class ParameterValueError(TrajectoryEnsembleError, ValueError):
    """A value given on the command line cannot be converted to the parameter's type; the message quotes it."""

    code = ErrorCode.INVALID_PARAMETERS


class ParameterRefusedError(TrajectoryEnsembleError, RuntimeError):
    """The node refused a parameter request (unknown parameter, read-only, or its own check); the message is its
    reason."""

    code = ErrorCode.INVALID_PARAMETERS


EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
TYPES = ("bool", "integer", "double", "string", "bool_array", "integer_array", "double_array", "string_array")
"""``rcl_interfaces/ParameterType`` names a value can be typed as (byte arrays are not offered)."""
ANSWER_TIMEOUT_S = 30.0
"""How long one parameter service call may take."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``params`` flags and its ``list``/``get``/``set`` actions to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (f"exit status:\n  {EXIT_OK}  done\n  {EXIT_REFUSED}  the node refused (reason printed), or no "
                     f"such parameter\n  {EXIT_USAGE}  bad arguments, or a value that does not convert to the "
                     f"parameter's type\n  {EXIT_UNREACHABLE}  the node's parameter services did not appear within "
                     "--wait")
    where = add_node_arguments(parser, "parameter")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", parents=[where], help="every parameter: name = value (type, read-only or writable)")
    get = actions.add_parser("get", parents=[where], help="print one parameter's value")
    get.add_argument("name")
    put = actions.add_parser("set", parents=[where], help="set one parameter, typed from its current type")
    put.add_argument("name")
    put.add_argument("value", help="YAML-style value: 4, 0.5, true, text, [a, b]")
    put.add_argument("--type", choices=TYPES, default=None,
                     help="type to send instead of the current one (needed when the parameter is not set)")


def type_name(type_id: int) -> str:
    """``rcl_interfaces/ParameterType`` constant -> ``integer``, ``double_array``, ..., ``not set``."""
    from rcl_interfaces.msg import ParameterType

    for name, value in vars(ParameterType).items():
        if name.startswith("PARAMETER_") and value == type_id:
            return name[len("PARAMETER_"):].lower().replace("not_set", "not set")
    return str(type_id)


def python_value(value_msg: Any) -> Any:
    """The Python value of an ``rcl_interfaces/ParameterValue`` (``None`` when not set)."""
    from rclpy.parameter import parameter_value_to_python

    return parameter_value_to_python(value_msg)


def format_value(value: Any) -> str:
    """One-line YAML-style text of a parameter value (lists in flow style, strings quoted only when needed)."""
    if value is None:
        return "(not set)"
    if not isinstance(value, (list, tuple)) and hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        value = [v.item() if hasattr(v, "item") else v for v in value]
    return yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("\n...").strip()


def _scalar(text: Any, kind: str, name: str) -> Any:
    if kind == "string":
        return text if isinstance(text, str) else str(text)
    wanted = {"bool": "true or false", "integer": "an integer", "double": "a number"}[kind]
    try:
        value = yaml.safe_load(text) if isinstance(text, str) else text
    except yaml.YAMLError:
        value = text
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind == "double" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ParameterValueError(f"{name} is {'an' if kind == 'integer' else 'a'} {kind} parameter: expected {wanted}, "
                              f"got {text!r}")


def convert(text: str, kind: str, name: str) -> Any:
    """``text`` as a value of ``kind`` (a :data:`TYPES` name).

    Raises:
        ParameterValueError: ``text`` does not convert; the message names the parameter, its type and the text.
    """
    if kind not in TYPES:
        raise ParameterValueError(f"{name} has type {kind!r}, which this command cannot set; pass --type")
    if not kind.endswith("_array"):
        return _scalar(text, kind, name)
    try:
        items = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ParameterValueError(f"{name} is a {kind} parameter: expected a list such as [a, b], got {text!r}") \
            from error
    if not isinstance(items, list):
        raise ParameterValueError(f"{name} is a {kind} parameter: expected a list such as [a, b], got {text!r}")
    element = kind[: -len("_array")]
    # Strings inside a list keep YAML's reading of each item ("[a, 1]" -> "a", "1").
    return [_scalar(item if element != "string" else str(item), element, name) for item in items]


class ParamClient:
    """Calls the node's parameter services from a :class:`ClientSession`.

    Args:
        session (`ClientSession`): The command's session.
        node (`str`): The node's fully qualified name.
        wait_s (`float`): Seconds to wait for the services.
        log (`Callable[[str], None]`): Receives the waiting progress lines.

    Raises:
        NodeUnreachableError: The services do not appear within ``wait_s``.
    """

    def __init__(self, session: ClientSession, node: str, wait_s: float, log: Callable[[str], None]) -> None:
        from rclpy.parameter_client import AsyncParameterClient

        self.session, self.node_name = session, node
        self.client = AsyncParameterClient(session.node, node)
        if not wait_with_progress(self.client.services_are_ready, session.spin_for, wait_s,
                                  f"the parameter services of {node}", log):
            raise NodeUnreachableError(
                f"node not reachable: no parameter services {node}/get_parameters, ... after {wait_s:g} s on "
                f"{domain_text()} (nodes seen: {', '.join(session.node_names()) or 'none'})")

    def _call(self, future: Any, what: str) -> Any:
        if not self.session.wait_future(future, ANSWER_TIMEOUT_S):
            raise NodeUnreachableError(f"{self.node_name} did not answer {what} within {ANSWER_TIMEOUT_S:g} s")
        return future.result()

    def names(self) -> list[str]:
        """Every parameter name, sorted."""
        return sorted(self._call(self.client.list_parameters(), "list_parameters").result.names)

    def get(self, names: list[str]) -> list[Any]:
        """The ``ParameterValue`` messages of ``names``.

        Raises:
            ParameterRefusedError: One of ``names`` is not declared on the node.
        """
        known = set(self.names())
        missing = [n for n in names if n not in known]
        if missing:
            raise ParameterRefusedError(f"{self.node_name} has no parameter {missing[0]!r}")
        return list(self._call(self.client.get_parameters(names), "get_parameters").values)

    def describe(self, names: list[str]) -> list[Any]:
        """The ``ParameterDescriptor`` messages of ``names``."""
        return list(self._call(self.client.describe_parameters(names), "describe_parameters").descriptors)

    def set(self, name: str, kind: str, value: Any) -> None:
        """Set ``name`` to ``value`` sent as ``kind``.

        Raises:
            ParameterRefusedError: The node refused; the message is its reason.
        """
        from rclpy.parameter import Parameter

        parameter = Parameter(name, Parameter.Type[kind.upper()], value)
        result = self._call(self.client.set_parameters([parameter]), "set_parameters").results[0]
        if not result.successful:
            raise ParameterRefusedError(f"{self.node_name} refused {name} = {format_value(value)}: "
                                        f"{result.reason or '(no reason given)'}")


def params(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Run the ``list``, ``get`` or ``set`` action; returns the exit status.

    Raises:
        NodeUnreachableError: The node's parameter services did not appear or answer.
        ParameterRefusedError: No such parameter, or the node refused the new value.
        ParameterValueError: The value does not convert to the parameter's type.
    """
    with ClientSession("trajectory_ensemble_params") as session:
        client = ParamClient(session, args.node, args.wait, lambda line: print(line, file=sys.stderr))
        if args.action == "list":
            names = client.names()
            values, descriptors = client.get(names), client.describe(names)
            width = max((len(n) for n in names), default=0)
            for name, value, descriptor in zip(names, values, descriptors):
                access = "read-only" if descriptor.read_only else "writable"
                log(f"{name:<{width}} = {format_value(python_value(value))}  ({type_name(value.type)}, {access})")
        elif args.action == "get":
            log(format_value(python_value(client.get([args.name])[0])))
        else:
            current = client.get([args.name])[0]
            kind = args.type or type_name(current.type)
            if kind == "not set":
                raise ParameterValueError(f"{args.name} is declared but not set, so it has no type to follow; "
                                          "pass --type")
            value = convert(args.value, kind, args.name)
            client.set(args.name, kind, value)
            log(f"set {args.name} = {format_value(value)} ({kind})")
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Run ``trajectory-ensemble params``; the exit status is listed in ``--help``."""
    try:
        check_node_name(args.node)
    except ValueError as error:
        return fail(error, EXIT_USAGE)
    return run_command(lambda: params(args, log=lambda line: print(line, flush=True)),
                       ((ParameterValueError, EXIT_USAGE), (ParameterRefusedError, EXIT_REFUSED),
                        (NodeUnreachableError, EXIT_UNREACHABLE)))
