"""The OpenPI wire: msgpack frames in openpi-client's numpy encoding, and the error frame.

Arrays and numpy scalars travel as openpi-client's ``__ndarray__`` / ``__npgeneric__`` maps (text-key markers
accepted too); only boolean, integer and float dtypes, non-negative shapes and exact data lengths pass. Decoding is
bounded (:class:`DecodeLimits`; why: docs/security.md, "Bounded decoding"), and a refused request gets one text frame
naming the error and its code; anything unnamed is ``ENGINE_FAILURE`` with a fixed message. No pickle, no traceback.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from ..errors import ErrorCode, InvalidMessageError, TrajectoryEnsembleError
from ..quoting import QUOTE_CHARS, bound_json_text, bound_text, quote_value

_ARRAY = "__ndarray__"
_SCALAR = "__npgeneric__"
_KINDS = "biuf"
"""Array dtype kinds a peer may send: bool, signed and unsigned integers, floats."""
INTERNAL_ERROR_MESSAGE = "internal error while serving the request; the server log has the details"


def _encode(obj: Any) -> Any:
    # Exactly openpi-client's layout (bytes keys), so its unpack_array reads our replies unchanged.
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in _KINDS:
            raise TypeError(f"cannot send an array of dtype {obj.dtype}")
        obj = np.ascontiguousarray(obj)
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send a {type(obj).__name__}")


def pack(obj: Any) -> bytes:
    """One msgpack frame; numpy arrays and scalars in openpi-client's encoding.

    Args:
        obj (`Any`): Plain msgpack types, ``np.ndarray`` (bool, int or float) and numpy scalars.
    """
    return msgpack.packb(obj, default=_encode)


def _field(obj: dict, name: str) -> Any:
    return obj[name.encode()] if name.encode() in obj else obj.get(name)


def _dtype(value: Any) -> np.dtype:
    try:
        dtype = np.dtype(value.decode() if isinstance(value, bytes) else value)
    except (TypeError, ValueError):
        raise InvalidMessageError(f"array dtype {quote_value(value)} is not a numpy dtype string such as '<f4' or "
                                  "'|u1'") from None
    if dtype.kind not in _KINDS or dtype.hasobject:
        raise InvalidMessageError(f"array dtype {quote_value(value)} is refused; only bool, integer and float arrays "
                                  "are accepted")
    return dtype


def _decode(obj: dict) -> Any:
    if _ARRAY.encode() in obj or _ARRAY in obj:
        dtype = _dtype(_field(obj, "dtype"))
        shape, data = _field(obj, "shape"), _field(obj, "data")
        if (not isinstance(shape, (list, tuple))
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
            raise InvalidMessageError(f"array shape {quote_value(shape)} is not a list of non-negative integers")
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidMessageError(f"array data must be bytes, got {type(data).__name__}")
        expected = math.prod(shape) * dtype.itemsize
        if len(data) != expected:
            raise InvalidMessageError(f"array of shape {list(shape)} and dtype {quote_value(dtype.str)} needs "
                                      f"{expected} bytes, "
                                      f"got {len(data)}")
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    if _SCALAR.encode() in obj or _SCALAR in obj:
        dtype = _dtype(_field(obj, "dtype"))
        value = _field(obj, "data")
        if isinstance(value, (bytes, str, list, dict)) or value is None:
            raise InvalidMessageError(f"numpy scalar data must be a number, got {type(value).__name__}")
        try:
            return dtype.type(value)
        except (TypeError, ValueError, OverflowError):
            raise InvalidMessageError(f"numpy scalar {quote_value(value)} does not fit dtype "
                                      f"{quote_value(dtype.str)}") from None
    return obj


MAX_NDIM = 32
"""Most dimensions an array's ``shape`` may list (numpy allows 64; an image has 3)."""
MAX_STATE_ITEMS = 64
"""Longest plain list a request may hold (a state vector sent as a list; hand_pose has 57 values)."""
ARRAY_MAP_ENTRIES = 4
"""Entries of openpi-client's array map: ``__ndarray__``, ``data``, ``dtype``, ``shape``."""


@dataclass(frozen=True)
class DecodeLimits:
    """Bounds on what one request frame may make the decoder build (see :meth:`for_request`).

    Args:
        max_map_len (`int`): Entries in one map (the request's keys; an array map has 4).
        max_array_len (`int`): Items in one array (a ``shape``, a state list).
        max_str_len (`int`): Bytes of one string (a prompt; its own limit is checked later, with its own code).
        max_bin_len (`int`): Bytes of one binary (an array's data: an image).
        max_entries (`int`): Map entries and array items in the whole frame.
        max_depth (`int`): Nesting of maps and arrays (request map > array map > shape list = 3).
    """

    max_map_len: int = 64
    max_array_len: int = max(MAX_NDIM, MAX_STATE_ITEMS)
    max_str_len: int = 16 * 1024 * 1024
    max_bin_len: int = 16 * 1024 * 1024
    max_entries: int = 64 * (1 + ARRAY_MAP_ENTRIES + MAX_NDIM)
    max_depth: int = 4

    @classmethod
    def for_request(cls, *, keys: int, max_message_bytes: int, max_image_bytes: int) -> DecodeLimits:
        """The bounds for a server: what a valid request of its schema can hold, with room for typos.

        A valid request has at most ``keys`` entries (the schema's keys and the extras), each a scalar, a string, a
        state list or an array map with its shape. Twice that many keys are let through, so a request with a few
        unknown keys still gets the schema's error that lists the keys it expects.

        Args:
            keys (`int`): Keys a request may carry (schema and extras).
            max_message_bytes (`int`): ``openpi_max_message_bytes``: bounds every string.
            max_image_bytes (`int`): ``max_image_bytes``: bounds every binary (array data).
        """
        max_map_len = max(2 * keys, ARRAY_MAP_ENTRIES)
        return cls(max_map_len=max_map_len, max_array_len=max(MAX_NDIM, MAX_STATE_ITEMS),
                   max_str_len=max_message_bytes, max_bin_len=min(max_message_bytes, max_image_bytes),
                   max_entries=max_map_len * (1 + ARRAY_MAP_ENTRIES + max(MAX_NDIM, MAX_STATE_ITEMS)), max_depth=4)


_BOUND_NAMES = {"max_map_len": "entries in one map", "max_array_len": "items in one array",
                "max_str_len": "bytes in one string", "max_bin_len": "bytes in one binary",
                "max_ext_len": "bytes of msgpack ext data (ext types are not part of the wire)"}


class _Counter:
    """Counts map entries and array items as msgpack completes each container; stops the decode past the budget."""

    def __init__(self, limits: DecodeLimits) -> None:
        self.limit = limits.max_entries
        self.entries = 0

    def _count(self, size: int) -> None:
        self.entries += size
        if self.entries > self.limit:
            raise InvalidMessageError(f"the frame holds more than {self.limit} map entries and array items in all "
                                      "(a request holds its keys and a few small arrays); refused while decoding")

    def on_map(self, obj: dict) -> Any:
        self._count(len(obj))
        return _decode(obj)

    def on_list(self, obj: list) -> list:
        self._count(len(obj))
        return obj


def _depth(obj: Any) -> int:
    # Iterative: a frame nested up to msgpack's own stack limit (1024) would break Python's recursion limit.
    deepest, stack = 0, [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in value)
    return deepest


def _bound_message(error: ValueError, limits: DecodeLimits) -> str | None:
    # msgpack says "N exceeds max_map_len(M)"; say which bound in words.
    match = re.fullmatch(r"(\d+) exceeds (max_\w+_len)\((\d+)\)", str(error))
    if match is None:
        return None
    size, bound, limit = match.groups()
    return f"the frame holds {size} {_BOUND_NAMES.get(bound, bound)}, above the limit of {limit}; refused while decoding"


DEFAULT_LIMITS = DecodeLimits()
"""The bounds :func:`unpack` applies when the caller gives none (the server derives its own)."""


def unpack(frame: bytes | str, limits: DecodeLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Decode one request frame into a dict, within ``limits``.

    Args:
        frame (`bytes` or `str`): The websocket message (binary for a request; a text frame is refused).
        limits (`DecodeLimits`, *optional*): The bounds; a frame that breaks one is refused, whatever it holds.

    Raises:
        InvalidMessageError: a text frame, bytes that are not msgpack, a bound broken, a malformed array, or a value
            that is not a map.
    """
    if isinstance(frame, str):
        raise InvalidMessageError(f"requests are binary msgpack frames; got a text frame starting {quote_value(frame)}")
    counter = _Counter(limits)
    try:
        obj = msgpack.unpackb(frame, object_hook=counter.on_map, list_hook=counter.on_list, raw=False,
                              max_map_len=limits.max_map_len, max_array_len=limits.max_array_len,
                              max_str_len=limits.max_str_len, max_bin_len=limits.max_bin_len, max_ext_len=0)
    except InvalidMessageError:
        raise
    except msgpack.StackError:
        raise InvalidMessageError(f"the frame nests maps or arrays deeper than msgpack's own limit; a request nests "
                                  f"at most {limits.max_depth} deep") from None
    except Exception as error:  # noqa: BLE001 - msgpack raises several unrelated types for garbage
        bound = _bound_message(error, limits) if isinstance(error, ValueError) else None
        if bound is not None:
            raise InvalidMessageError(bound) from None
        raise InvalidMessageError(f"the frame is not msgpack ({type(error).__name__}: "
                                  f"{bound_text(str(error), QUOTE_CHARS)}); it is {quote_value(frame, 16)}") from None
    depth = _depth(obj)
    if depth > limits.max_depth:
        raise InvalidMessageError(f"the frame nests maps and arrays {depth} deep, above the limit of "
                                  f"{limits.max_depth} (a request map > an array map > its shape is 3)")
    if not isinstance(obj, dict):
        raise InvalidMessageError(f"a request must be a msgpack map of observation keys, got a {type(obj).__name__}")
    if not all(isinstance(key, str) for key in obj):
        bad = next(key for key in obj if not isinstance(key, str))
        raise InvalidMessageError(f"request keys must be strings, got {quote_value(bad)}")
    return obj


def error_frame(error: BaseException) -> str:
    """The text frame a refused or failed request gets: ``{"error", "code", "type", "message"}`` as JSON.

    Args:
        error (`BaseException`): What ended the request; anything but a named error is reported without detail.
    """
    if isinstance(error, TrajectoryEnsembleError):
        code, kind, message = ErrorCode(error.code), type(error).__name__, bound_json_text(str(error))
    else:
        code, kind, message = ErrorCode.ENGINE_FAILURE, "InternalError", INTERNAL_ERROR_MESSAGE
    return json.dumps({"error": code.name, "code": int(code), "type": kind, "message": message})


def parse_error_frame(text: str) -> dict[str, Any]:
    """Read an error frame back (clients and tests): ``{"error": name, "code": int, "type": str, "message": str}``.

    Raises:
        ValueError: the text is not an error frame of this server.
    """
    payload = json.loads(text)
    if not isinstance(payload, dict) or not {"error", "code", "type", "message"} <= set(payload):
        raise ValueError(f"not an error frame: {quote_value(text, 80)}")
    return payload
