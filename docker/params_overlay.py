"""Write a copy of a ROS 2 parameter file with ``name:=value`` overrides applied (used by docker/entrypoint.sh).

``serve.launch.py`` takes one ``params_file``; this lets ``docker run IMAGE model:=/models/cosmos3`` change any node
parameter without writing a file. Values are parsed as YAML, like ``ros2 run --ros-args -p``: ``4`` is an int,
``true`` a bool, ``[a, b]`` a list, anything else a string.

Usage: ``python3 params_overlay.py BASE.yaml OUT.yaml name:=value [name:=value ...]``
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

NODE_KEY = "/**/trajectory_ensemble"
"""Key used when the base file has no section with ``ros__parameters`` (matches the node in any namespace)."""


class OverlayError(ValueError):
    """An override is not ``name:=value``, or the base file is not a ROS 2 parameter file."""


def parse_override(text: str) -> tuple[str, Any]:
    """``"name:=value"`` -> ``(name, YAML-parsed value)``.

    Raises:
        OverlayError: No ``:=`` or an empty name.
    """
    name, sep, value = text.partition(":=")
    if not sep or not name.strip():
        raise OverlayError(f"expected name:=value, got {text!r}")
    try:
        parsed = yaml.safe_load(value) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return name.strip(), parsed


def overlay(base: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``base`` with every override set in its (first) ``ros__parameters`` section.

    Args:
        base (`dict`): A parsed parameter file (``{node: {"ros__parameters": {...}}}``), possibly empty.
        overrides (`Sequence[str]`): ``name:=value`` strings.

    Raises:
        OverlayError: A bad override, or ``base`` is not a mapping of node sections.
    """
    if not isinstance(base, dict):
        raise OverlayError("the parameter file must be a mapping of node names to sections")
    merged = {key: dict(section) if isinstance(section, dict) else section for key, section in base.items()}
    key = next((k for k, v in merged.items() if isinstance(v, dict) and "ros__parameters" in v), None)
    if key is None:
        key = NODE_KEY
        merged[key] = {"ros__parameters": {}}
    params = dict(merged[key]["ros__parameters"] or {})
    for text in overrides:
        name, value = parse_override(text)
        params[name] = value
    merged[key]["ros__parameters"] = params
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``BASE OUT name:=value ...``; prints one line per override."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    base_path, out_path, overrides = Path(args[0]), Path(args[1]), args[2:]
    try:
        base = yaml.safe_load(base_path.read_text(encoding="utf-8")) or {}
        merged = overlay(base, overrides)
    except (OSError, yaml.YAMLError, OverlayError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out_path.write_text(yaml.safe_dump(merged, sort_keys=False), encoding="utf-8")
    for text in overrides:
        name, value = parse_override(text)
        print(f"parameter override: {name} = {value!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
