"""Camera frames as the model takes them: ``sensor_msgs/Image`` fields to RGB ``uint8``, and several views tiled.

The observation buffer (:mod:`.observations`) decodes every frame on arrival with :func:`image_to_rgb`; the OpenPI
schemas compose views with :func:`tile_views`; the bag tools decode recorded frames the same way. Nothing here
imports rclpy: messages are read field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import FrameDataLengthError, FrameDimensionsError, FrameStepError, UnsupportedEncodingError

# encoding -> (bytes per pixel, how to turn the [H, W, C] uint8 array into RGB)
_ENCODINGS: dict[str, tuple[int, Callable[[np.ndarray], np.ndarray]]] = {
    "rgb8": (3, lambda a: a),
    "bgr8": (3, lambda a: a[..., ::-1]),
    "rgba8": (4, lambda a: a[..., :3]),
    "bgra8": (4, lambda a: a[..., 2::-1]),
    "mono8": (1, lambda a: np.repeat(a, 3, axis=-1)),
}
SUPPORTED_ENCODINGS = tuple(_ENCODINGS)
"""Image encodings the buffer converts to RGB uint8; anything else is rejected (cause ``encoding``)."""
BYTES_PER_PIXEL: dict[str, int] = {encoding: size for encoding, (size, _) in _ENCODINGS.items()}
"""Bytes per pixel of each supported encoding (a row holds at least ``width * BYTES_PER_PIXEL[encoding]`` bytes)."""


def _as_bytes(data: Any) -> np.ndarray:
    # rclpy gives uint8[] as array.array('B') (a buffer: no copy); plain lists come from hand-built messages.
    try:
        return np.frombuffer(data, np.uint8)
    except TypeError:
        return np.asarray(data, dtype=np.uint8).reshape(-1)


def image_to_rgb(encoding: str, height: int, width: int, step: int, data: Any) -> np.ndarray:
    """Convert raw ``sensor_msgs/Image`` fields to an RGB ``uint8`` array ``[height, width, 3]`` (a copy).

    Args:
        encoding (`str`): One of :data:`SUPPORTED_ENCODINGS`.
        height (`int`), width (`int`): Image size in pixels, both > 0.
        step (`int`): Bytes per row; at least ``width * bytes_per_pixel`` (rows may be padded).
        data (`bytes`, `array.array` or `Sequence[int]`): Exactly ``step * height`` bytes.

    Raises:
        UnsupportedEncodingError, FrameDimensionsError, FrameStepError, FrameDataLengthError: the named check failed.
    """
    if encoding not in _ENCODINGS:
        raise UnsupportedEncodingError(
            f"image encoding {encoding!r} is not supported; expected one of {list(SUPPORTED_ENCODINGS)}"
        )
    if height <= 0 or width <= 0:
        raise FrameDimensionsError(f"image is {width}x{height}; both sides must be > 0")
    channels, to_rgb = _ENCODINGS[encoding]
    row_bytes = width * channels
    if step < row_bytes:
        raise FrameStepError(
            f"image step {step} is smaller than width*bytes_per_pixel = {width}*{channels} = {row_bytes} ({encoding})"
        )
    buffer = _as_bytes(data)
    if buffer.size != step * height:
        raise FrameDataLengthError(
            f"image data has {buffer.size} bytes; step*height = {step}*{height} = {step * height} expected"
        )
    rows = buffer.reshape(height, step)[:, :row_bytes].reshape(height, width, channels)
    # A copy: the frame must not alias the message's buffer, which the middleware owns.
    return np.array(to_rgb(rows), dtype=np.uint8, order="C", copy=True)


def tile_views(images: Sequence[np.ndarray]) -> np.ndarray:
    """Tile camera views left to right into one composite frame, as DROID's ``concat_view`` inputs are.

    Views of different heights are padded with black at the bottom to the tallest one (never resized, so no view's
    pixels are resampled).

    Args:
        images (`Sequence[np.ndarray]`): RGB ``uint8`` arrays ``[H_i, W_i, 3]``, in topic order.

    Returns:
        `np.ndarray` of shape `[max H_i, sum W_i, 3]`.
    """
    if len(images) == 1:
        return images[0]
    height = max(image.shape[0] for image in images)
    padded = [
        image if image.shape[0] == height
        else np.concatenate([image, np.zeros((height - image.shape[0], *image.shape[1:]), np.uint8)], axis=0)
        for image in images
    ]
    return np.concatenate(padded, axis=1)
