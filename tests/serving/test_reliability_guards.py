"""Unit tests of the issue-20 guards that need no node: input limits, params-file sections, parameter types, the
deferred logger with a real rclpy logger."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trajectory_ensemble_node.errors import ErrorCode, ImageTooLargeError, InstructionTooLongError, NonFiniteStateError
from trajectory_ensemble_node.serving.input_limits import (
    InputLimits,
    check_image_fields,
    check_instruction,
    check_state,
)
from trajectory_ensemble_node.serving.observations import JointStateSample
from trajectory_ensemble_node.serving.params_file import section_matches, unmatched_params_files
from trajectory_ensemble_node.serving.startup_checks import params_files_from_args, raw_reducer_without_stats

LIMITS = InputLimits(max_instruction_chars=100, max_instruction_tokens=10, max_image_bytes=1000,
                     max_image_pixels=300)


def test_instruction_limits_check_characters_before_tokens():
    calls = []

    def count(text: str) -> int:
        calls.append(text)
        return len(text.split())

    with pytest.raises(InstructionTooLongError, match="1000000 characters, above max_instruction_chars=100") as info:
        check_instruction("x" * 1_000_000, LIMITS, count)
    assert info.value.code == ErrorCode.INSTRUCTION_TOO_LONG == 60
    assert calls == []  # the tokenizer never saw the hostile text
    with pytest.raises(InstructionTooLongError, match="11 tokens, above max_instruction_tokens=10"):
        check_instruction("a " * 11, LIMITS, count)
    check_instruction("reach the target", LIMITS, count)


def test_image_limits_read_only_the_header_fields():
    with pytest.raises(ImageTooLargeError, match="2000 bytes, above max_image_bytes=1000") as info:
        check_image_fields(2000, 10, 10, "rgb8", LIMITS)
    assert info.value.code == ErrorCode.IMAGE_TOO_LARGE == 61 and info.value.cause == "size"
    with pytest.raises(ImageTooLargeError, match="max_image_pixels=300"):
        check_image_fields(0, 100, 100, "rgb8", LIMITS)


def _state(positions, velocities=(), efforts=()) -> JointStateSample:
    return JointStateSample("/s", ("a", "b"), np.asarray(positions, float), None, 0.0,
                            np.asarray(velocities, float), np.asarray(efforts, float))


def test_state_checks_cover_empty_velocities_and_efforts():
    check_state(_state([0.0, 1.0], [0.1, 0.2]), "/s")
    for state, fragment in ((_state([]), "empty"), (_state([0.0, 1.0], [0.0, -math.inf]), "velocities (joints b)"),
                            (_state([0.0, 1.0], (), [math.nan, 0.0]), "efforts (joints a)")):
        with pytest.raises(NonFiniteStateError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            check_state(state, "/s")


@pytest.mark.parametrize("section, name, matches", [
    ("/**/trajectory_ensemble", "/trajectory_ensemble", True),
    ("trajectory_ensemble", "/trajectory_ensemble", True),
    ("/**", "/robot/trajectory_ensemble", True),
    ("/robot/*", "/robot/trajectory_ensemble", True),
    ("/robot/trajectory_ensemble", "/trajectory_ensemble", False),
    ("some_other_node", "/trajectory_ensemble", False),
])
def test_params_file_sections_match_like_ros(section, name, matches):
    assert section_matches(section, name) is matches


def test_params_files_are_read_from_the_ros_args_and_unmatched_ones_found(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("robot:\n  trajectory_ensemble:\n    ros__parameters: {chunk_size: 4}\n")
    bad.write_text("other:\n  ros__parameters: {chunk_size: 4}\n")
    argv = ["prog", "--params-file", "ignored", "--ros-args", "--params-file", str(good), "-p", "a:=1",
            "--params-file", str(bad)]
    assert params_files_from_args(argv) == [str(good), str(bad)]
    assert unmatched_params_files([str(good), str(bad)], "/robot/trajectory_ensemble") == [(str(bad), ["other"])]


def test_raw_reducers_without_stats_are_named():
    assert "action_stats_file" in raw_reducer_without_stats("pose_gripper", "")
    assert raw_reducer_without_stats("pose_gripper", "/stats.json") is None
    assert raw_reducer_without_stats("mean", "") is None


def test_parameter_types_are_checked_by_name():
    pytest.importorskip("rclpy")
    from rclpy.parameter import Parameter

    from trajectory_ensemble_node.ros.guards import check_parameter_types

    assert "fault_injection: expected a str, got 5" in check_parameter_types([Parameter("fault_injection", value=5)])
    assert check_parameter_types([Parameter("fault_injection", value="")]) is None


def test_deferred_logs_mixed_severities_on_a_real_rclpy_logger(capfd):
    pytest.importorskip("rclpy")
    import rclpy.logging

    from trajectory_ensemble_node.ros.deferred import Deferred

    logger = rclpy.logging.get_logger("deferred_unit_test")
    deferred = Deferred(0.0, "test")
    try:
        for i, severity in enumerate(("info", "warning", "error", "info", "warning")):
            deferred.log(logger, severity, f"line {i}")
        with pytest.raises(TypeError, match="Deferred.log"):
            deferred.call(logger.info, "no")
    finally:
        deferred.stop(timeout_s=5.0)
    err = capfd.readouterr().err
    assert all(f"line {i}" in err for i in range(5)), err
    assert deferred.failures == 0
