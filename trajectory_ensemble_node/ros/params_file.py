"""Reading the node's params file without rclpy, for the faces of the service that are not the node.

``serve-openpi`` and ``calibrate --bag`` take the same YAML the node does (``--params-file``), so one file
configures every face; :func:`read_params_file` gives the raw values that :func:`.params.validate` then checks.
"""

from __future__ import annotations

from typing import Any

from ..errors import ParameterError


def _parameter_sections(tree: Any, prefix: str = "") -> Any:
    # (section key, its ros__parameters) in file order; nested namespace keys are joined by "/" as in
    # startup_checks (both YAML forms ROS accepts).
    if not isinstance(tree, dict):
        return
    for key, value in tree.items():
        path = f"{prefix}/{str(key).strip('/')}" if prefix else str(key)
        if isinstance(value, dict):
            if "ros__parameters" in value:
                yield path, value["ros__parameters"]
            yield from _parameter_sections({k: v for k, v in value.items() if k != "ros__parameters"}, path)


def read_params_file(path: str, fully_qualified_name: str = "/trajectory_ensemble") -> dict[str, Any]:
    """The parameter values a params file gives the node, read without rclpy (for ``serve-openpi``).

    Every section whose key matches the node's name with ROS's wildcards (``/**/trajectory_ensemble``,
    ``trajectory_ensemble``, ...) contributes its ``ros__parameters``, later sections overriding earlier ones, as
    rcl applies them.

    Args:
        path (`str`): The YAML file (e.g. ``config/serve.yaml``).
        fully_qualified_name (`str`): The node's name with its namespace.

    Returns:
        `dict[str, Any]`: raw values by name, for :func:`validate`.

    Raises:
        ParameterError: the file is unreadable, not YAML, or has no section for this node.
    """
    import yaml

    from .startup_checks import section_matches

    try:
        with open(path, encoding="utf-8") as handle:
            tree = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as error:
        raise ParameterError(f"invalid parameters:\n  params file {path!r}: {type(error).__name__}: {error}") from None
    sections = list(_parameter_sections(tree))
    matched = [values for key, values in sections if section_matches(key, fully_qualified_name)]
    if not matched:
        raise ParameterError(f"invalid parameters:\n  params file {path!r} has no section for "
                             f"{fully_qualified_name} (its sections: {[key for key, _ in sections]}); expected "
                             "'/**/trajectory_ensemble:' with 'ros__parameters:'")
    values: dict[str, Any] = {}
    for section in matched:
        if section is None:
            continue  # an empty ros__parameters: block
        if not isinstance(section, dict):
            raise ParameterError(f"invalid parameters:\n  params file {path!r}: ros__parameters is not a mapping")
        values.update(section)
    return values
