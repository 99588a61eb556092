"""Turning a parameter's raw value into its declared type, with bounded quotes of what is refused.

A params file read without rclpy may carry any YAML value: an integer of thousands of digits, ``.inf``, an alias bomb
that is a list of 2**40 items by reference. :func:`coerce` accepts only what a ROS parameter of the declared type can
hold, and :data:`preview` quotes anything else in bounded time and length.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

INT64_RANGE = (-(2**63), 2**63 - 1)
"""What a ROS integer parameter holds; a params file read without rclpy may carry any Python int."""


class _Preview(reprlib.Repr):
    """Bounded quotes of bad values: a YAML alias bomb is a list of 2**40 items by reference, and an integer of more
    than 4,300 digits has no ``repr()``."""

    def __init__(self) -> None:
        super().__init__()  # keyword arguments only from Python 3.12
        self.maxlevel, self.maxstring, self.maxlong, self.maxother = 3, 80, 40, 80

    def repr_int(self, x: int, level: int) -> str:
        return f"<an integer of {x.bit_length()} bits>" if x.bit_length() > 256 else super().repr_int(x, level)


preview = _Preview().repr
"""A bounded ``repr`` for quoting a bad value in a message."""


def is_int64(value: Any) -> bool:
    """Whether ``value`` is an int (not a bool) that a ROS integer parameter can hold."""
    return isinstance(value, int) and not isinstance(value, bool) and INT64_RANGE[0] <= value <= INT64_RANGE[1]


def coerce(name: str, value: Any, default: Any, problems: list[str]) -> Any:
    """``value`` as the type of ``default``, or ``default`` with a problem appended that names ``name``.

    Args:
        name (`str`): The parameter, for the message.
        value (`Any`): What the params file or rclpy gave.
        default (`Any`): The parameter's default; its type is the parameter's type.
        problems (`list[str]`): Collects one line per refused value.
    """
    # bool before int: bool is an int subclass, and True must not pass as 1 (nor 1 as True).
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
    elif isinstance(default, int):
        if is_int64(value):
            return value
    elif isinstance(default, float):
        # Finite only: NaN fails every bound silently, and Inf passes them (observation_wait_s: .inf overflows the
        # wait, fps: .inf makes dt 0). An integer past the float range has no float.
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                isinstance(value, float) or abs(value) <= 2**1023) and math.isfinite(value):
            return float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            problems.append(f"{name}: expected a finite number, got {preview(value)}")
            return default
    elif isinstance(default, str):
        if isinstance(value, str):
            return value
    elif isinstance(default, list) and default and isinstance(default[0], int):
        # An integer list: rclpy hands over an array.array('q') or a list; never bools.
        if hasattr(value, "tolist"):
            value = value.tolist()
        if isinstance(value, (list, tuple)) and value and all(is_int64(v) for v in value):
            return tuple(value)
    elif isinstance(default, list):
        if value is None:  # an empty YAML list has no type; rclpy leaves it unset
            return ()
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(v for v in value if v != "")
    if isinstance(default, list) and default and isinstance(default[0], int):
        problems.append(f"{name}: expected a non-empty list of 64-bit integers, got {preview(value)}")
        return tuple(default)
    kind = {bool: "bool", int: "64-bit integer", float: "number", str: "string", list: "list of strings"}[type(default)]
    problems.append(f"{name}: expected a {kind}, got {preview(value)} ({type(value).__name__})")
    return default if not isinstance(default, list) else tuple(v for v in default if v)
