"""The node's side of the parameter table: declaring every parameter on an rclpy node.

The table and its checks are ROS-free and shared by every face (:mod:`trajectory_ensemble_node.serving.params`).
:func:`declare` declares them on a node with descriptors (``ros2 param describe`` shows the description and
constraints) and validates what it read.
"""

from __future__ import annotations

from typing import Any

from ..serving.params import PARAMETERS, NodeParams, validate

__all__ = ["declare"]

# ROS parameters that are not ours but may legitimately be overridden on any node.
_FOREIGN_PREFIXES = ("use_sim_time", "qos_overrides.", "start_type_description_service", "start_parameter_services")


def declare(node: Any) -> NodeParams:
    """Declare every parameter on ``node`` with a descriptor, then validate what it holds.

    Overrides for names this node does not declare are reported as errors (a typo in a YAML file would otherwise be
    ignored silently and the default used).

    Args:
        node (`rclpy.node.Node`): The node, created with its parameter overrides.

    Raises:
        ParameterError: listing every invalid or unknown parameter.
    """
    from rcl_interfaces.msg import ParameterDescriptor

    values: dict[str, Any] = {}
    for spec in PARAMETERS:
        descriptor = ParameterDescriptor(
            description=spec.description,
            additional_constraints=spec.constraints,
            read_only=spec.read_only,
            dynamic_typing=True,
        )
        values[spec.name] = node.declare_parameter(spec.name, spec.default, descriptor).value
    overrides = getattr(node, "_parameter_overrides", {}) or {}
    for name in overrides:
        if name not in values and not name.startswith(_FOREIGN_PREFIXES):
            values[name] = overrides[name].value
    return validate(values)
