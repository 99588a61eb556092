"""Moved to :mod:`trajectory_ensemble_node.serving.param_values`; this old path re-exports it."""

from __future__ import annotations

from ..serving.param_values import (  # noqa: F401 - the old public path
    INT64_RANGE,
    coerce,
    is_int64,
    preview,
)

__all__ = [
    "INT64_RANGE",
    "coerce",
    "is_int64",
    "preview",
]
