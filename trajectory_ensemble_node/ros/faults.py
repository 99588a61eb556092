"""Moved to :mod:`trajectory_ensemble_node.serving.faults`; this old path re-exports it."""

from __future__ import annotations

from ..serving.faults import (  # noqa: F401 - the old public path
    FaultInjector,
    STEP_DELAY_ENV,
)

__all__ = [
    "FaultInjector",
    "STEP_DELAY_ENV",
]
