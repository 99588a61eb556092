"""The node's guards at startup, at parameter changes and at shutdown (issue 20: fail loud, exit in bounded time).

- :data:`ACTION_SERVICE_QOS`: deep goal, cancel and result queues, so a burst of goals all get an answer (rclpy's
  default of 10 dropped 16 of 200; docs/reliability.md).
- the exit deadline after SIGINT/SIGTERM is :mod:`.shutdown` (ROS-free: the OpenPI server arms the same one).
- :func:`report_duplicates`, :func:`check_params_files`, :func:`warn_raw_reducer`: the warnings of
  :mod:`.startup_checks`, logged on the node.
- :func:`check_parameter_types`: SetParameters with a value of the wrong type is refused by name (the parameters
  are declared with dynamic typing so YAML ints can fill float parameters, which lets rclpy accept any type);
  :func:`refuse_clock_change`: ``use_sim_time`` (rclpy's, not ours) is refused like our read-only parameters;
  :func:`set_parameters` is the node's callback applying both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from ..quoting import bound_text, quote_value
from ..serving import params as node_params
from ..serving.params_file import unmatched_params_files
from ..serving.startup_checks import count_same_name, params_files_from_args, raw_reducer_without_stats

ACTION_SERVICE_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000, reliability=ReliabilityPolicy.RELIABLE)
"""Goal/cancel/result service queues: deep enough for a burst of hundreds of goals (rclpy's default is 10)."""
DUPLICATE_CHECK_PERIOD_S = 5.0
"""How often the graph is checked for another node with this node's fully qualified name."""

def report_duplicates(node: Any, previous: int) -> int:
    """Log an ERROR when the number of nodes sharing this node's fully qualified name changed to more than one.

    Args:
        node (`rclpy.node.Node`): This node.
        previous (`int`): The count at the last check (1 at startup: only this node).

    Returns:
        `int`: The count now.
    """
    count = count_same_name(node.get_node_names_and_namespaces(), node.get_name(), node.get_namespace())
    if count > 1 and count != previous:
        node.get_logger().error(
            f"{count} nodes named {node.get_fully_qualified_name()} are on the graph: each serves every goal and "
            f"publishes on {node.resolve_topic_name('~/trajectory')}; stop the others or start this one under "
            f"another name or namespace (--ros-args -r __node:=NAME or -r __ns:=/NS)"
        )
    elif count <= 1 < previous:
        node.get_logger().info(f"{node.get_fully_qualified_name()} is the only node with its name again")
    return max(count, 1)


PATH_CHARS = 4096
"""Characters of a path quoted whole (Linux's PATH_MAX): an operator's own argument, not a client's value."""


def check_params_files(node: Any, argv: Sequence[str]) -> None:
    """Warn for each ``--params-file`` with no section that applies to this node (ROS ignores it silently).

    Args:
        node (`rclpy.node.Node`): This node.
        argv (`Sequence[str]`): The node's command line.
    """
    name = node.get_fully_qualified_name()
    for path, sections in unmatched_params_files(params_files_from_args(argv), name):
        node.get_logger().warning(
            # The operator's own path, quoted whole up to what a path can hold.
            f"params file {quote_value(path, PATH_CHARS)} has no section for this node ({name}); its sections "
            f"{sections} apply to other "
            f"nodes, so every parameter they set is ignored here and this node runs on defaults "
            f"(key the file by {quote_value(name, PATH_CHARS)} or '/**/{node.get_name()}')"
        )


_warned_reducers: set[str] = set()


def warn_raw_reducer(node: Any, reducer: str, action_stats_file: str) -> None:
    """Warn (once per reducer) that a raw-space reducer runs without action statistics.

    Args:
        node (`rclpy.node.Node`): This node.
        reducer (`str`): The reducer about to be used (the parameter at startup, a goal's choice later).
        action_stats_file (`str`): The ``action_stats_file`` parameter.
    """
    message = raw_reducer_without_stats(reducer, action_stats_file)
    if message is not None and reducer not in _warned_reducers:
        _warned_reducers.add(reducer)
        node.get_logger().warning(message)


def check_parameter_types(changes: Sequence[Any]) -> str | None:
    """The refusal for a SetParameters request holding a value of the wrong type, or ``None``.

    Args:
        changes (`Sequence[rclpy.parameter.Parameter]`): The requested changes.
    """
    specs = {spec.name: spec for spec in node_params.PARAMETERS}
    for change in changes:
        spec = specs.get(change.name)
        if spec is None:
            continue
        value = change.value
        expected = type(spec.default)
        ok = (isinstance(value, bool) if expected is bool
              else isinstance(value, int) and not isinstance(value, bool) if expected is int
              else isinstance(value, (int, float)) and not isinstance(value, bool) if expected is float
              else isinstance(value, (list, tuple)) if expected is list
              else isinstance(value, expected))
        if not ok:
            return (f"{change.name}: expected a {expected.__name__}, got {quote_value(value)} "
                    f"({type(value).__name__}); "
                    f"nothing was changed")
    return None


def set_parameters(changes: Sequence[Any], *, sim_time: bool, faults: Any, logger: Any) -> Any:
    """The node's SetParameters callback: refusals by type and of ``use_sim_time``, then ``fault_injection``.

    Args:
        changes (`Sequence[rclpy.parameter.Parameter]`): The requested changes.
        sim_time (`bool`): The node's ``use_sim_time`` at start-up.
        faults (`FaultInjector`, *optional*): The test-only fault hook (``None`` outside tests).
        logger (`RcutilsLogger`): The node's logger.

    Returns:
        `rcl_interfaces.msg.SetParametersResult`
    """
    from rcl_interfaces.msg import SetParametersResult

    from ..errors import ParameterError

    problem = check_parameter_types(changes) or refuse_clock_change(changes, sim_time)
    if problem is not None:
        return SetParametersResult(successful=False, reason=problem)
    for change in changes:
        if change.name != "fault_injection":
            continue  # read_only descriptors already refuse the others
        value = change.value
        try:
            node_params.check_fault_injection(value)
        except ParameterError as error:
            return SetParametersResult(successful=False, reason=bound_text(str(error)))
        if faults is not None:
            faults.arm(value)
            logger.warning(f"TEST ONLY: fault {quote_value(value)} armed for the next group")
    return SetParametersResult(successful=True)


def refuse_clock_change(changes: Sequence[Any], sim_time: bool) -> str | None:
    """The refusal for a SetParameters request that changes ``use_sim_time``, or ``None``.

    The node chooses its clock at start-up (the ``/clock`` feed, what staleness and latency are measured on); flipping
    it mid-goal measured a latency of 1.08e12 ms. rclpy declares the parameter writable, so it is refused here.

    Args:
        changes (`Sequence[rclpy.parameter.Parameter]`): The requested changes.
        sim_time (`bool`): The value the node started with.
    """
    for change in changes:
        if change.name == "use_sim_time" and bool(change.value) != sim_time:
            return (f"use_sim_time is read-only: this node started with use_sim_time={str(sim_time).lower()} and "
                    f"measures staleness and latency on that clock; restart it to change clocks (nothing was changed)")
    return None
