"""Moved to :mod:`trajectory_ensemble_node.serving.startup_checks`; this old path re-exports it."""

from __future__ import annotations

from ..serving.startup_checks import (  # noqa: F401 - the old public path
    alarm_in_force,
    bundled_settings_mismatch,
    count_same_name,
    load_action_stats,
    load_novelty,
    load_uncertainty_threshold,
    params_files_from_args,
    raw_reducer_without_stats,
    read_calibration_file,
    section_matches,
    toy_settings_mismatch,
    unmatched_params_files,
)

__all__ = [
    "alarm_in_force",
    "bundled_settings_mismatch",
    "count_same_name",
    "load_action_stats",
    "load_novelty",
    "load_uncertainty_threshold",
    "params_files_from_args",
    "raw_reducer_without_stats",
    "read_calibration_file",
    "section_matches",
    "toy_settings_mismatch",
    "unmatched_params_files",
]
