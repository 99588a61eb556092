"""The OpenPI wire: msgpack frames in openpi-client's numpy encoding, and the error frame.

openpi-client (``openpi_client/msgpack_numpy.py``) sends a numpy array as the map ``{b"__ndarray__": True, b"data":
<raw bytes>, b"dtype": "<f4", b"shape": [H, W]}`` and a numpy scalar as ``{b"__npgeneric__": True, b"data": <value>,
b"dtype": "<f4"}``; everything else is plain msgpack. No pickle is ever involved. This module speaks exactly that, with
the checks an untrusted peer needs: only boolean, integer and float dtypes (object, void, string and complex arrays
are refused), a shape of non-negative integers, and data whose length is ``prod(shape) * itemsize``. Markers spelled
as text keys (``"__ndarray__"``) are accepted too.

A refused request gets one **text** frame (openpi-client raises a text reply as an error): a JSON object with the
error's name, numeric code (:class:`~trajectory_ensemble_node.errors.ErrorCode`), class and message. Anything that is
not a named error is reported as ``ENGINE_FAILURE`` with a fixed message; the details stay in the server log.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import numpy as np

from ..errors import ErrorCode, InvalidMessageError, TrajectoryEnsembleError

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
        raise InvalidMessageError(f"array dtype {value!r} is not a numpy dtype string such as '<f4' or '|u1'") from None
    if dtype.kind not in _KINDS or dtype.hasobject:
        raise InvalidMessageError(f"array dtype {value!r} is refused; only bool, integer and float arrays are accepted")
    return dtype


def _decode(obj: dict) -> Any:
    if _ARRAY.encode() in obj or _ARRAY in obj:
        dtype = _dtype(_field(obj, "dtype"))
        shape, data = _field(obj, "shape"), _field(obj, "data")
        if (not isinstance(shape, (list, tuple))
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
            raise InvalidMessageError(f"array shape {shape!r} is not a list of non-negative integers")
        if not isinstance(data, (bytes, bytearray)):
            raise InvalidMessageError(f"array data must be bytes, got {type(data).__name__}")
        expected = math.prod(shape) * dtype.itemsize
        if len(data) != expected:
            raise InvalidMessageError(f"array of shape {list(shape)} and dtype {dtype.str!r} needs {expected} bytes, "
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
            raise InvalidMessageError(f"numpy scalar {value!r} does not fit dtype {dtype.str!r}") from None
    return obj


def unpack(frame: bytes | str) -> dict[str, Any]:
    """Decode one request frame into a dict.

    Args:
        frame (`bytes` or `str`): The websocket message (binary for a request; a text frame is refused).

    Raises:
        InvalidMessageError: a text frame, bytes that are not msgpack, a malformed array, or a value that is not a map.
    """
    if isinstance(frame, str):
        raise InvalidMessageError(f"requests are binary msgpack frames; got a text frame starting {frame[:40]!r}")
    try:
        obj = msgpack.unpackb(frame, object_hook=_decode, raw=False)
    except InvalidMessageError:
        raise
    except Exception as error:  # noqa: BLE001 - msgpack raises several unrelated types for garbage
        raise InvalidMessageError(f"the frame is not msgpack ({type(error).__name__}: {error}); it starts "
                                  f"{bytes(frame[:16])!r}") from None
    if not isinstance(obj, dict):
        raise InvalidMessageError(f"a request must be a msgpack map of observation keys, got a {type(obj).__name__}")
    if not all(isinstance(key, str) for key in obj):
        bad = next(key for key in obj if not isinstance(key, str))
        raise InvalidMessageError(f"request keys must be strings, got {bad!r}")
    return obj


def error_frame(error: BaseException) -> str:
    """The text frame a refused or failed request gets: ``{"error", "code", "type", "message"}`` as JSON.

    Args:
        error (`BaseException`): What ended the request; anything but a named error is reported without detail.
    """
    if isinstance(error, TrajectoryEnsembleError):
        code, kind, message = ErrorCode(error.code), type(error).__name__, str(error)
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
        raise ValueError(f"not an error frame: {text[:80]!r}")
    return payload
