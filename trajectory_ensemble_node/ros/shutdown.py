"""Moved to :mod:`trajectory_ensemble_node.serving.shutdown`; this old path re-exports it."""

from __future__ import annotations

from ..serving.shutdown import (  # noqa: F401 - the old public path
    FORCED_EXIT_CODE,
    SHUTDOWN_DEADLINE_S,
    arm_exit_deadline,
    exit_now,
)

__all__ = [
    "FORCED_EXIT_CODE",
    "SHUTDOWN_DEADLINE_S",
    "arm_exit_deadline",
    "exit_now",
]
