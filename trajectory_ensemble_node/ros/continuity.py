"""Moved to :mod:`trajectory_ensemble_node.serving.continuity`; this old path re-exports it."""

from __future__ import annotations

from ..serving.continuity import (  # noqa: F401 - the old public path
    CLOCK_JUMPED_BACK,
    CONTINUED,
    ChunkMemory,
    ContinuityDecision,
    ELAPSED,
    FRESH_REASONS,
    INSTRUCTION_CHANGED,
    NOT_REQUESTED,
    NO_PREVIOUS,
    OLDER_OBSERVATION,
    RESET_REQUESTED,
    ServedChunk,
    WEIGHTS_UPDATED,
)

__all__ = [
    "CLOCK_JUMPED_BACK",
    "CONTINUED",
    "ChunkMemory",
    "ContinuityDecision",
    "ELAPSED",
    "FRESH_REASONS",
    "INSTRUCTION_CHANGED",
    "NOT_REQUESTED",
    "NO_PREVIOUS",
    "OLDER_OBSERVATION",
    "RESET_REQUESTED",
    "ServedChunk",
    "WEIGHTS_UPDATED",
]
