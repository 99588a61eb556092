"""The one rule for quoting a refused value (``trajectory_ensemble_node.quoting``), and a scan for refusals that
bypass it.

Every face module (the modules that read what a client sent, or what a remote server replied) composes its refusals
and log lines with :func:`~trajectory_ensemble_node.quoting.quote_value`, never with ``!r``, ``repr()`` or ``%r``,
which echo a value whole: a 15 MB ``reducer`` came back as a 75 MB error frame. The scan is checked against planted
violations, as ``tests/test_architecture.py`` checks its own rules.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from trajectory_ensemble_node.quoting import MAX_MESSAGE_CHARS, QUOTE_CHARS, bound_text, quote_value

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "trajectory_ensemble_node"
FACE_MODULES = ("openpi/*.py", "remote/*.py", "serving/planning.py", "serving/input_limits.py", "ros/goals.py",
                "ros/guards.py", "ros/node.py", "contract.py", "reducers/registry.py")
"""Modules whose refusals and log lines name what a client (or a remote server) sent: the faces, and the spec and
reducer checks that every face and the Python API reach with a client's values."""
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "fatal"}


def face_sources() -> dict[str, str]:
    return {str(path.relative_to(REPO_ROOT)): path.read_text()
            for pattern in FACE_MODULES for path in sorted(PACKAGE.glob(pattern))}


def _echoes(node: ast.AST) -> list[int]:
    """Lines where ``node`` formats a value whole: ``{x!r}``, ``repr(x)``, or ``%r`` in a format string."""
    lines = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.FormattedValue) and inner.conversion == ord("r"):
            lines.append(inner.lineno)
        elif isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "repr":
            lines.append(inner.lineno)
        elif isinstance(inner, ast.Constant) and isinstance(inner.value, str) and "%r" in inner.value:
            lines.append(inner.lineno)
    return lines


def unquoted_refusals(sources: Mapping[str, str]) -> list[str]:
    """Every refusal (a ``raise``) and log call of the face modules that echoes a value instead of quoting it."""
    found = []
    for module, source in sorted(sources.items()):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Raise) and node.exc is not None:
                what = "refusal"
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in LOG_METHODS):
                what = "log line"
            else:
                continue
            found += [f"{module}:{line} {what} echoes a value; quote it with quote_value"
                      for line in sorted(set(_echoes(node.exc if isinstance(node, ast.Raise) else node)))]
    return found


def test_no_face_refusal_or_log_line_echoes_a_value():
    assert unquoted_refusals(face_sources()) == []


def test_the_scan_finds_planted_echoes():
    fake = {
        "openpi/extras.py": 'def f(v):\n    raise ValueError(f"reducer {v!r} unknown")\n',
        "openpi/server.py": 'def g(v, logger):\n    logger.info("refused %r", v)\n    logger.warning(f"{repr(v)}")\n',
        "remote/client.py": 'def h(v):\n    raise KeyError("bad " + repr(v))\n',
        "ros/goals.py": 'def ok(v):\n    raise ValueError(f"reducer {quote_value(v)} unknown")\n',
    }
    assert unquoted_refusals(fake) == [
        "openpi/extras.py:2 refusal echoes a value; quote it with quote_value",
        "openpi/server.py:2 log line echoes a value; quote it with quote_value",
        "openpi/server.py:3 log line echoes a value; quote it with quote_value",
        "remote/client.py:2 refusal echoes a value; quote it with quote_value",
    ]


def test_the_face_modules_are_found():
    modules = face_sources()
    assert "trajectory_ensemble_node/openpi/extras.py" in modules and "trajectory_ensemble_node/ros/goals.py" in modules
    assert len(modules) >= 15


def test_a_long_value_is_named_by_type_and_length_with_a_short_prefix():
    assert quote_value(b"\x00" * 15_000_000) == "bytes of 15000000, starting " + repr(b"\x00" * QUOTE_CHARS) + "..."
    assert quote_value("x" * 15_000_000).startswith("str of 15000000 characters, starting 'xxxx")
    assert len(quote_value(["y" * 10_000_000] * 1000)) < 1000
    assert len(quote_value({("k" * 10_000): "v" * 10_000 for _ in range(3)})) < 300
    assert quote_value(np.zeros((4000, 4000))) == "ndarray of dtype float64 and shape [4000, 4000]"
    assert quote_value(10 ** 5000) == "int too long to show"


def test_a_short_value_is_its_repr():
    assert quote_value("mode") == "'mode'"
    assert quote_value("mode", typed=True) == "str 'mode'"
    assert quote_value(3, typed=True) == "int 3"
    assert quote_value(["a", 1]) == "['a', 1]"
    assert quote_value(b"ab") == "b'ab'"


def test_bound_text_says_how_long_the_text_was():
    assert bound_text("short") == "short"
    cut = bound_text("z" * 10_000_000)
    assert len(cut) < MAX_MESSAGE_CHARS + 60 and cut.endswith("(cut: 10000000 characters in all)")
