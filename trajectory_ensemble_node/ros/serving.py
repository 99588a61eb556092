"""Moved to :mod:`trajectory_ensemble_node.ros.model_host` (class :class:`ModelHost`); this old path re-exports it."""

from __future__ import annotations

from .model_host import WARMUP_SEED, WARMUP_TIMEOUT_S, ModelHost, Serving  # noqa: F401 - the old public path

__all__ = ["WARMUP_SEED", "WARMUP_TIMEOUT_S", "ModelHost", "Serving"]
