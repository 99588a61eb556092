"""Every public path a module had before it moved still imports, and names the very same object as the new path.

Issue 46 moved the ROS-free serving layer out of ``ros/`` into ``serving/`` (and renamed a few things); tools, the
lab, docs and other teams' code name the old paths, so each old path is a thin re-export. One row per re-exported
name: ``(old module, new module, name)``.
"""

from __future__ import annotations

import importlib

import pytest

_PKG = "trajectory_ensemble_node"


def _rows(old: str, new: str, *names: str) -> list[tuple[str, str, str]]:
    return [(f"{_PKG}.{old}", f"{_PKG}.{new}", name) for name in names]


MOVED = [
    *_rows("ros.params", "serving.params", "DTYPE_NAMES", "FAULTS", "GOAL_POLICIES", "INT64_RANGE", "PARAMETER_NAMES",
           "PARAMETERS", "POSITION_LIMIT_POLICIES", "TESTING_ENV", "NodeParams", "ParamSpec", "check_fault_injection",
           "coerce", "parse_fault", "preview", "validate"),
    *_rows("ros.params", "errors", "ParameterError"),
    *_rows("ros.param_values", "serving.param_values", "INT64_RANGE", "coerce", "is_int64", "preview"),
    *_rows("ros.params_file", "serving.params_file", "MAX_NAMESPACE_DEPTH", "MAX_NAMESPACE_MAPS", "read_params_file"),
    *_rows("ros.continuity", "serving.continuity", "CLOCK_JUMPED_BACK", "CONTINUED", "ELAPSED", "FRESH_REASONS",
           "INSTRUCTION_CHANGED", "NOT_REQUESTED", "NO_PREVIOUS", "OLDER_OBSERVATION", "RESET_REQUESTED",
           "WEIGHTS_UPDATED", "ChunkMemory", "ContinuityDecision", "ServedChunk"),
    *_rows("ros.input_limits", "serving.input_limits", "MIN_IMAGE_SIDE", "InputLimits", "TokenCounter",
           "check_image_dimensions", "check_image_size", "check_instruction", "check_joint_state_shape", "check_state",
           "min_image_side", "state_values", "token_counter"),
    *_rows("ros.startup_checks", "serving.startup_checks", "alarm_in_force", "bundled_settings_mismatch",
           "count_same_name", "load_action_stats", "load_novelty", "load_uncertainty_threshold",
           "params_files_from_args", "raw_reducer_without_stats", "read_calibration_file", "section_matches",
           "toy_settings_mismatch", "unmatched_params_files"),
    *_rows("ros.frames", "serving.frames", "BYTES_PER_PIXEL", "SUPPORTED_ENCODINGS", "image_to_rgb", "tile_views"),
    *_rows("ros.faults", "serving.faults", "STEP_DELAY_ENV", "FaultInjector"),
    *_rows("ros.shutdown", "serving.shutdown", "FORCED_EXIT_CODE", "SHUTDOWN_DEADLINE_S", "arm_exit_deadline",
           "exit_now"),
    *_rows("ros.observations", "serving.observations", "FRAME_REJECT_CAUSES", "FUTURE_STAMP_TOLERANCE_S", "Frame",
           "JointStateSample", "Observation", "stamp_ns", "state_positions"),
    *_rows("ros.observations", "serving.observation_buffer", "ObservationBuffer"),
    *_rows("ros.observations", "serving.frames", "BYTES_PER_PIXEL", "SUPPORTED_ENCODINGS", "image_to_rgb",
           "tile_views"),
    *_rows("ros.observations", "serving.input_limits", "check_image_dimensions", "check_joint_state_shape",
           "check_state"),
    *_rows("ros.observations", "errors", "FrameDataLengthError", "FrameDimensionsError", "FrameError",
           "FrameStepError", "GoalRequestError", "NoObservationError", "NonFiniteStateError", "ObservationArrayError",
           "ObservationError", "ObservationNotReceivedError", "StaleObservationError", "UnsupportedEncodingError"),
    # ros/serving.py is ros/model_host.py: "serving" now names the ROS-free layer (needs rclpy to import).
    *_rows("ros.serving", "ros.model_host", "WARMUP_SEED", "WARMUP_TIMEOUT_S", "ModelHost", "Serving"),
]
"""Modules that moved whole: the old module is only a re-export, with an ``__all__``."""

PARTLY_MOVED = [
    # ros/goals.py keeps the goal state machine; its plan_goal turns a goal into the neutral PlanRequest first.
    *_rows("ros.goals", "serving.planning", "GoalPlan"),
]
"""Names that moved out of a module that stays."""


ALL = MOVED + PARTLY_MOVED


@pytest.mark.parametrize(("old", "new", "name"), ALL, ids=[f"{o[len(_PKG) + 1:]}.{n}" for o, _, n in ALL])
def test_the_old_path_names_the_same_object(old: str, new: str, name: str) -> None:
    if old.endswith(".ros.serving"):
        pytest.importorskip("rclpy")
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    assert getattr(old_module, name) is getattr(new_module, name)
    assert (old, new, name) in PARTLY_MOVED or name in old_module.__all__


def test_every_name_a_moved_module_exports_has_a_row() -> None:
    # A name added to a re-export later gets its row too (or the old path would export it untested).
    for old in sorted({old for old, _, _ in MOVED}):
        if old.endswith(".ros.serving"):
            pytest.importorskip("rclpy")
        rows = {name for o, _, name in MOVED if o == old}
        exported = set(importlib.import_module(old).__all__) - {"declare"}  # ros.params' own rclpy declaring
        assert exported == rows, old


RENAMED = [
    # The loader returns a diffusers pipeline, not the served model.
    ("catalog", "load_model", "catalog", "load_pipeline"),
    # The node's holder of its model; "serving" names the ROS-free layer every face shares.
    ("ros.model_host", "Serving", "ros.model_host", "ModelHost"),
]


@pytest.mark.parametrize(("old", "old_name", "new", "new_name"), RENAMED, ids=[r[1] for r in RENAMED])
def test_an_old_name_is_the_renamed_object(old: str, old_name: str, new: str, new_name: str) -> None:
    if old.startswith("ros."):
        pytest.importorskip("rclpy")
    old_object = getattr(importlib.import_module(f"{_PKG}.{old}"), old_name)
    assert old_object is getattr(importlib.import_module(f"{_PKG}.{new}"), new_name)
