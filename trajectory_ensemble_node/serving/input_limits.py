"""Input limits, checked before any work: instruction length (characters, then tokens), image size, frame
dimensions and state values. Both faces call these rules where an input arrives.

The character check is O(1), so it runs first and bounds the tokenizer's work. A goal over a limit is accepted and
aborted at once with its code (a rejected goal reaches the client with no code or message; docs/node.md). Why the
instruction limits: docs/security.md, "Other inputs". No rclpy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import (
    FrameDimensionsError,
    ImageTooLargeError,
    InstructionTooLongError,
    NonFiniteStateError,
    ObservationArrayError,
    TrajectoryEnsembleError,
)
from ..models.cosmos3 import MIN_IMAGE_SIDE
from ..quoting import quote_value

TokenCounter = Callable[[str], int]

MAX_NAME_CHARS = 64
"""Most characters of a name a request picks from a fixed set (a reducer, a guidance mode): the longest registered
name is a fraction of it. A longer one is refused before any lookup, quoting only its prefix."""


def check_name(value: str, what: str, error: type[TrajectoryEnsembleError]) -> None:
    """Refuse a name longer than any the set it picks from can hold, before it is looked up or echoed.

    Args:
        value (`str`): The name the request gave.
        what (`str`): The field (``reducer``, ``guidance``), named in the error.
        error (`type[TrajectoryEnsembleError]`): The error the lookup itself raises for an unknown name, so the
            code is the same whatever the length (``UnknownReducerError``: ``UNKNOWN_REDUCER``).

    Raises:
        error: ``value`` has more than :data:`MAX_NAME_CHARS` characters.
    """
    if len(value) > MAX_NAME_CHARS:
        raise error(f"unknown {what} {quote_value(value)}: no {what} name is longer than {MAX_NAME_CHARS} characters")


@dataclass(frozen=True)
class InputLimits:
    """The limits, from the node's parameters.

    Args:
        max_instruction_chars (`int`): Most characters in an instruction (goal or ``~/instruction``).
        max_instruction_tokens (`int`): Most tokens in it, by the pipeline's tokenizer (0 = not checked).
        max_image_bytes (`int`): Most bytes of ``data`` in one image message.
        max_image_pixels (`int`): Most ``width * height`` in one image message.
        min_image_side (`int`): Fewest pixels on each side of one image (each view, each camera's frame); the
            model's own bound (``ServedModel.min_image_side``), :data:`MIN_IMAGE_SIDE` for every Cosmos 3.
    """

    max_instruction_chars: int
    max_instruction_tokens: int
    max_image_bytes: int
    max_image_pixels: int
    min_image_side: int = MIN_IMAGE_SIDE


def check_instruction(text: str, limits: InputLimits, count_tokens: TokenCounter | None, *,
                      source: str = "instruction") -> None:
    """Refuse an instruction above the limits.

    Args:
        text (`str`): The instruction.
        limits (`InputLimits`): The limits.
        count_tokens (`TokenCounter`, *optional*): Token counter (``ServedModel.count_tokens``).
        source (`str`): How the message names the input (``instruction``, ``~/instruction``).

    Raises:
        InstructionTooLongError: too many characters (checked first, without tokenizing) or tokens.
    """
    if len(text) > limits.max_instruction_chars:
        raise InstructionTooLongError(
            f"{source} has {len(text)} characters, above max_instruction_chars={limits.max_instruction_chars} "
            f"({quote_value(text)}); nothing was run"
        )
    if count_tokens is not None and limits.max_instruction_tokens > 0:
        tokens = count_tokens(text)
        if tokens > limits.max_instruction_tokens:
            raise InstructionTooLongError(
                f"{source} has {tokens} tokens, above max_instruction_tokens={limits.max_instruction_tokens} "
                f"({quote_value(text)}); nothing was run"
            )


def check_image_fields(size: int, width: int, height: int, encoding: str, limits: InputLimits) -> None:
    """Refuse an image above the limits, from what any face knows of it (an image message's fields: nothing is
    converted or copied).

    Args:
        size (`int`): Its data bytes.
        width (`int`), height (`int`): Its size in pixels.
        encoding (`str`): Its pixel encoding (``rgb8``, ...), quoted in the error.
        limits (`InputLimits`): The limits.

    Raises:
        ImageTooLargeError: more bytes than ``max_image_bytes`` or more pixels than ``max_image_pixels``.
    """
    if size > limits.max_image_bytes:
        raise ImageTooLargeError(
            f"image has {size} bytes, above max_image_bytes={limits.max_image_bytes} ({width}x{height} "
            f"{quote_value(encoding)})"
        )
    pixels = int(width) * int(height)
    if pixels > limits.max_image_pixels:
        raise ImageTooLargeError(
            f"image is {width}x{height} = {pixels} pixels, above max_image_pixels={limits.max_image_pixels}"
        )


def check_image_dimensions(height: int, width: int, min_side: int, *, source: str = "image") -> None:
    """Refuse an image the model cannot encode: a side under ``min_side`` pixels (see :data:`MIN_IMAGE_SIDE`).

    Args:
        height (`int`), width (`int`): The image's size in pixels.
        min_side (`int`): :attr:`InputLimits.min_image_side`.
        source (`str`): How the message names the image (a topic, a request key).

    Raises:
        FrameDimensionsError: a side under ``min_side`` (code ``INVALID_FRAME``).
    """
    if height < min_side or width < min_side:
        raise FrameDimensionsError(
            f"{source} is {width}x{height} (width x height); the model needs at least {min_side} pixels on each "
            f"side (a side under its VAE's factor {min_side} becomes 0 when the pipeline resizes it)"
        )


def state_values(value: Any, *, what: str,
                 error: type[TrajectoryEnsembleError] = ObservationArrayError) -> np.ndarray:
    """A state value (a number, a list of numbers or a numeric array) as a finite ``float64`` array.

    Args:
        value (`Any`): What the client sent.
        what (`str`): Its name (a request key, a topic's field), quoted in the error.
        error (`type[TrajectoryEnsembleError]`): The named error of the face that calls this
            (``ObservationArrayError``, ``OBSERVATION_SCHEMA``, on the OpenPI wire).

    Returns:
        `np.ndarray` of dtype float64, the value's shape.

    Raises:
        error: a bool, a string or another non-numeric value, a ragged list, or a NaN/Inf in it.
    """
    if isinstance(value, (bool, np.bool_)):
        raise error(f"{what} must be numbers, got {quote_value(value, typed=True)}")
    try:
        array = np.asarray(value) if not isinstance(value, np.ndarray) else value
    except ValueError:
        # numpy >= 1.24 refuses an inhomogeneous list outright, e.g. [1.0, [2.0, 3.0]].
        raise error(f"{what} is a ragged list (its items differ in length or nesting): {quote_value(value)}") from None
    if array.dtype == object:
        raise error(f"{what} is a ragged or mixed list (its items differ in length or type): {quote_value(value)}")
    if array.dtype.kind not in "fiu":
        raise error(f"{what} must be numbers, got {quote_value(value, typed=True)}")
    state = array.astype(np.float64)
    if not np.isfinite(state).all():
        raise error(f"{what} holds NaN or Inf: {quote_value(state.tolist())}")
    return state


def check_joint_state_shape(names: Sequence[str], fields: dict[str, Sequence[float]], *, topic: str) -> None:
    """Refuse a ``sensor_msgs/JointState`` whose arrays disagree in length (the message says: equal, or empty).

    Args:
        names (`Sequence[str]`): ``name``.
        fields (`dict[str, Sequence[float]]`): ``position``, ``velocity``, ``effort`` by name.
        topic (`str`): Its topic, quoted in the error.

    Raises:
        ObservationArrayError: two non-empty arrays of different lengths, or no positions for its names.
    """
    lengths = {"name": len(names), **{key: len(values) for key, values in fields.items()}}
    given = {key: length for key, length in lengths.items() if length}
    if len(set(given.values())) > 1:
        raise ObservationArrayError(
            f"joint state on {topic} is ragged: its arrays must be equally long or empty, got "
            + ", ".join(f"{key} {length}" for key, length in given.items())
        )
    if lengths["name"] and not lengths.get("position"):
        raise ObservationArrayError(f"joint state on {topic} names {lengths['name']} joints but has no positions")


def check_state(state: Any, topic: str) -> None:
    """Refuse a joint state a goal cannot use: empty, or NaN/Inf in positions, velocities or efforts.

    Velocities and efforts may be absent (``JointState`` allows empty arrays), but when given they must be finite:
    an ``-inf`` velocity means the driver is broken, whatever the positions say. Checked when a goal uses the state,
    not on arrival: the state is a measurement of now, and a goal must not be served from an older one while the
    driver reports NaN (each goal ends ``NON_FINITE_STATE`` until a finite state arrives).

    Args:
        state (`JointStateSample`): The latest sample (``names``, ``positions``, ``velocities``, ``efforts``).
        topic (`str`): Its topic (quoted in the error).

    Raises:
        NonFiniteStateError: empty, or a non-finite value (the field and the joints are named).
    """
    if len(state.positions) == 0:
        raise NonFiniteStateError(f"joint state on {topic} is empty (no positions)")
    for field_name, values in (("positions", state.positions), ("velocities", state.velocities),
                               ("efforts", state.efforts)):
        names = list(state.names) + [""] * max(0, len(values) - len(state.names))
        bad = [names[i] or str(i) for i, value in enumerate(values) if not math.isfinite(float(value))]
        if bad:
            raise NonFiniteStateError(
                f"joint state on {topic} holds NaN/Inf {field_name} (joints {', '.join(bad[:8])})"
            )
