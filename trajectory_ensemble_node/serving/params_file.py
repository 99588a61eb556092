"""Reading the node's params file without rclpy, for the faces of the service that are not the node.

``serve-openpi`` and ``calibrate --bag`` take the same YAML the node does (``--params-file``), so one file
configures every face; :func:`read_params_file` gives the raw values that :func:`.params.validate` then checks. The
node itself finds the files given to it that apply to nothing here (:func:`unmatched_params_files`): ROS ignores them
without a word.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import ParameterError

MAX_NAMESPACE_DEPTH = 32
"""Most namespace levels above a ``ros__parameters`` block (real files have one to three)."""
MAX_NAMESPACE_MAPS = 4096
"""Most namespace mappings walked in one file: YAML aliases let a few lines name 2**40 paths (a billion laughs), or
a mapping that holds itself."""


def _parameter_sections(tree: Any, where: str) -> Iterator[tuple[str, Any]]:
    """``(section key, its ros__parameters)`` in file order; nested namespace keys are joined by ``/`` (both YAML
    forms ROS accepts).

    Raises:
        ParameterError: namespaces nested deeper than :data:`MAX_NAMESPACE_DEPTH`, or more than
            :data:`MAX_NAMESPACE_MAPS` of them (aliases that fan out, or refer to themselves).
    """
    if not isinstance(tree, dict):
        return
    walked = 0

    def children(prefix: str, mapping: dict[Any, Any], depth: int) -> list[tuple[str, dict[Any, Any], int]]:
        return [(f"{prefix}/{str(key).strip('/')}" if prefix else str(key), value, depth + 1)
                for key, value in mapping.items()
                if isinstance(value, dict) and not (prefix and key == "ros__parameters")]

    # An explicit stack, not recursion: a hostile file must end in a named refusal, never a RecursionError. Popped
    # in file order, depth first, as rcl reads the file (later sections override earlier ones).
    stack = children("", tree, 0)[::-1]
    while stack:
        path, mapping, depth = stack.pop()
        walked += 1
        if walked > MAX_NAMESPACE_MAPS or depth > MAX_NAMESPACE_DEPTH:
            raise ParameterError(f"invalid parameters:\n  {where}: namespaces nested more than {MAX_NAMESPACE_DEPTH} "
                                 f"deep or more than {MAX_NAMESPACE_MAPS} of them (YAML aliases that fan out or refer "
                                 "to themselves?)")
        if "ros__parameters" in mapping:
            yield path, mapping["ros__parameters"]
        stack.extend(children(path, mapping, depth)[::-1])


def section_matches(section: str, fully_qualified_name: str) -> bool:
    """Whether a params-file section key applies to a node, with ROS's wildcards.

    ``*`` matches within one name segment, ``**`` any number of segments; a key without a leading ``/`` is
    relative to the root namespace.

    Args:
        section (`str`): The YAML key (e.g. ``/**/trajectory_ensemble``, ``trajectory_ensemble``, ``/robot/*``).
        fully_qualified_name (`str`): The node's (e.g. ``/robot/trajectory_ensemble``).
    """
    pattern = [p for p in section.strip("/").split("/") if p]
    target = [p for p in fully_qualified_name.strip("/").split("/") if p]

    def match(i: int, j: int) -> bool:
        if i == len(pattern):
            return j == len(target)
        if pattern[i] == "**":
            return any(match(i + 1, k) for k in range(j, len(target) + 1))
        return j < len(target) and fnmatch.fnmatchcase(target[j], pattern[i]) and match(i + 1, j + 1)

    return match(0, 0)


def unmatched_params_files(paths: Sequence[str], fully_qualified_name: str) -> list[tuple[str, list[str]]]:
    """Params files none of whose sections applies to this node.

    Args:
        paths (`Sequence[str]`): ``--params-file`` paths.
        fully_qualified_name (`str`): The node's fully qualified name.

    Returns:
        `list[tuple[str, list[str]]]`: (path, the sections it has) for each file that applies to nothing here.
            Unreadable files are left to rcl, which already fails on them.
    """
    import yaml

    unmatched = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                sections = [key for key, _ in _parameter_sections(yaml.safe_load(handle), path)]
        except (OSError, yaml.YAMLError, ParameterError):
            continue  # rcl refused the file before the node existed; nothing to add
        if not any(section_matches(s, fully_qualified_name) for s in sections):
            unmatched.append((path, sections))
    return unmatched


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

    where = f"params file {path!r}"
    try:
        with open(path, encoding="utf-8") as handle:
            tree = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as error:
        raise ParameterError(f"invalid parameters:\n  {where}: {type(error).__name__}: {error}") from None
    except RecursionError:
        raise ParameterError(f"invalid parameters:\n  {where}: nested too deeply to read") from None
    except ValueError as error:
        # PyYAML builds integers with int(): one of more than 4,300 digits is refused by Python itself.
        raise ParameterError(f"invalid parameters:\n  {where}: {type(error).__name__}: {error}") from None
    sections = list(_parameter_sections(tree, where))
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
