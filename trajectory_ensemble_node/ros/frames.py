"""Moved to :mod:`trajectory_ensemble_node.serving.frames`; this old path re-exports it."""

from __future__ import annotations

from ..serving.frames import (  # noqa: F401 - the old public path
    BYTES_PER_PIXEL,
    SUPPORTED_ENCODINGS,
    image_to_rgb,
    tile_views,
)

__all__ = [
    "BYTES_PER_PIXEL",
    "SUPPORTED_ENCODINGS",
    "image_to_rgb",
    "tile_views",
]
