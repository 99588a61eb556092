"""One rule for naming a refused value: its type, its full length and at most a short prefix of it.

A refusal quotes what it refuses, so a client can see what it sent; but the value comes from the client and may be
15 MB. Echoed whole, a 15 MB ``reducer`` became a 75 MB error frame (``repr`` of bytes quadruples them) and a 60 MB
log line. So every refusal, on every face, quotes a client value through :func:`quote_value`, which never reads more
of the value than it prints; and every error reply and log line is cut by :func:`bound_text` whatever it holds.
``tests/test_quoting.py`` scans the faces for refusals that format a value without it.
"""

from __future__ import annotations

import itertools
import json
import logging
from typing import Any

QUOTE_CHARS = 40
"""Most characters (or bytes) of a value quoted; longer values are named by type and length, then this prefix."""
QUOTE_ITEMS = 8
"""Most items of a list, tuple, set or map quoted."""
MAX_MESSAGE_CHARS = 2048
"""Most characters of an error message on the wire or in a goal's result, and of a log line (a few KiB in UTF-8)."""
MAX_MESSAGE_BYTES = 3072
"""Most bytes of an error message once escaped as JSON (non-ASCII takes up to 12 bytes a character there)."""
MAX_LOG_CHARS = 8192
"""Most characters of one formatted log record, traceback included: the backstop of :class:`BoundedFormatter`."""

_TEXT = (str, bytes, bytearray, memoryview)


def quote_value(value: Any, limit: int = QUOTE_CHARS, *, typed: bool = False) -> str:
    """``value`` as a refusal quotes it: ``repr`` when short, else its type, length and a prefix.

    Reads at most ``limit`` characters of a string or bytes and :data:`QUOTE_ITEMS` items of a container, so quoting
    costs the same whatever the client sent.

    Args:
        value (`Any`): What the client sent (any type).
        limit (`int`): Characters or bytes of a prefix quoted.
        typed (`bool`): Name the type of a short value too (``"str 'abc'"``); a long one always is.

    Returns:
        `str`: for example ``"'mode'"``, or ``"bytes of 15000000, starting b'\\x00\\x00...'"``.
    """
    if isinstance(value, _TEXT):
        data = bytes(value[:limit]) if isinstance(value, (bytearray, memoryview)) else value[:limit]
        if len(value) <= limit:
            return f"{type(value).__name__} {data!r}" if typed else repr(data)
        unit = " characters" if isinstance(value, str) else ""
        return f"{type(value).__name__} of {len(value)}{unit}, starting {data!r}..."
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:  # an array: never its data
        return f"{type(value).__name__} of dtype {dtype} and shape {list(shape)}"
    if typed and isinstance(value, (dict, list, tuple, set, frozenset)):
        return f"{type(value).__name__} {quote_value(value, limit)}"
    if isinstance(value, dict):
        pairs = itertools.islice(value.items(), QUOTE_ITEMS)
        inner = ", ".join(f"{quote_value(k, limit)}: {quote_value(v, limit)}" for k, v in pairs)
        return "{" + inner + ("" if len(value) <= QUOTE_ITEMS else f", ... ({len(value)} entries)") + "}"
    if isinstance(value, (list, tuple, set, frozenset)):
        inner = ", ".join(quote_value(v, limit) for v in itertools.islice(value, QUOTE_ITEMS))
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")") if isinstance(value, tuple) else "{}"
        return open_ + inner + ("" if len(value) <= QUOTE_ITEMS else f", ... ({len(value)} items)") + close
    name = type(value).__name__
    try:
        text = repr(value)
    except ValueError:  # an int past sys.get_int_max_str_digits refuses repr; name its type instead
        return f"{name} too long to show"
    if len(text) > limit:
        return f"{name} starting {text[:limit]}..."
    return f"{name} {text}" if typed else text


def bound_text(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was: the last bound on an error reply or log line.

    Args:
        text (`str`): A message already composed (its values quoted with :func:`quote_value`).
        limit (`int`): Most characters kept.
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... (cut: {len(text)} characters in all)"


class BoundedFormatter(logging.Formatter):
    """A log formatter whose every record, traceback included, is at most :data:`MAX_LOG_CHARS` characters.

    The lines themselves quote values with :func:`quote_value`; this is the backstop for what a line did not write
    itself (an exception's message in a traceback).
    """

    def format(self, record: logging.LogRecord) -> str:
        return bound_text(super().format(record), MAX_LOG_CHARS)


def bound_json_text(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """``text`` cut (as :func:`bound_text` does) until its JSON string takes at most ``limit`` bytes.

    Args:
        text (`str`): A message already composed.
        limit (`int`): Most bytes of ``json.dumps`` of the result.
    """
    chars = MAX_MESSAGE_CHARS
    message = bound_text(text, chars)
    while len(json.dumps(message)) > limit and chars > 16:
        chars //= 2
        message = bound_text(text, chars)
    return message
