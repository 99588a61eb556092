"""Moved to :mod:`trajectory_ensemble_node.serving.params_file`; this old path re-exports it."""

from __future__ import annotations

from ..serving.params_file import (  # noqa: F401 - the old public path
    MAX_NAMESPACE_DEPTH,
    MAX_NAMESPACE_MAPS,
    read_params_file,
)

__all__ = [
    "MAX_NAMESPACE_DEPTH",
    "MAX_NAMESPACE_MAPS",
    "read_params_file",
]
