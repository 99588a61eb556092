"""The operator commands and replay without a node: waiting with progress, defaults, value typing, help, imports.

The same commands against a real node over DDS are in ``test_operator_cli.py``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys

import pytest

from trajectory_ensemble_node.cli.params import ParameterValueError, convert, format_value
from trajectory_ensemble_node.cli.ros_client import check_node_name, wait_with_progress


class _FakeClock:
    """Monotonic seconds that advance only when the wait pumps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def pump(self, seconds: float) -> None:
        self.now += max(seconds, 0.1)


def test_a_long_wait_says_what_it_waits_for_since_when_and_keeps_saying_it():
    clock, lines = _FakeClock(), []
    ready_at = 35.0
    assert wait_with_progress(lambda: clock.now >= ready_at, clock.pump, 300.0,
                              "the action server /robot/trajectory_ensemble/generate_trajectory", lines.append,
                              clock=clock)
    assert re.fullmatch(r"waiting for the action server /robot/trajectory_ensemble/generate_trajectory "
                        r"\(since \d\d:\d\d:\d\d, up to 300 s\)", lines[0]), lines
    # One reminder every 10 s until the server appears at 35 s.
    assert [re.search(r": (\d+) s of up to 300 s", line).group(1) for line in lines[1:]] == ["10", "20", "30"]


def test_a_node_that_is_already_up_or_appears_at_once_prints_nothing():
    clock, lines = _FakeClock(), []
    assert wait_with_progress(lambda: True, clock.pump, 300.0, "x", lines.append, clock=clock)
    assert wait_with_progress(lambda: clock.now >= 0.5, clock.pump, 300.0, "x", lines.append, clock=clock)
    assert lines == []


def test_a_wait_that_runs_out_returns_false_after_its_timeout():
    clock, lines = _FakeClock(), []
    assert not wait_with_progress(lambda: False, clock.pump, 25.0, "the action server /x/generate_trajectory",
                                  lines.append, clock=clock)
    assert 25.0 <= clock.now < 25.5
    assert len(lines) == 3 and lines[0].startswith("waiting for the action server /x/generate_trajectory")


def test_replay_waits_long_enough_for_a_real_checkpoint_by_default():
    from trajectory_ensemble_node.replay.playback import DEFAULT_WAIT_S, ReplayOptions
    from trajectory_ensemble_node.replay.replay import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["some_bag"])
    assert args.wait == DEFAULT_WAIT_S == ReplayOptions(bag="some_bag").wait_s == 300.0
    assert "300" in parser.format_help()


@pytest.mark.parametrize(("text", "kind", "value"), [
    ("4", "integer", 4), ("4", "double", 4.0), ("0.25", "double", 0.25), ("true", "bool", True),
    ("engine_exception", "string", "engine_exception"), ("8", "string", "8"), ("", "string", ""),
    ("[a, b]", "string_array", ["a", "b"]), ("[1, 2.5]", "double_array", [1.0, 2.5]),
])
def test_set_values_follow_the_parameter_type(text, kind, value):
    converted = convert(text, kind, "p")
    assert converted == value and type(converted) is type(value)


@pytest.mark.parametrize(("text", "kind"), [("abc", "integer"), ("2.5", "integer"), ("maybe", "bool"),
                                            ("true", "double"), ("x", "double_array")])
def test_a_value_of_the_wrong_type_is_refused_with_the_value_quoted(text, kind):
    with pytest.raises(ParameterValueError, match=re.escape(repr(text))):
        convert(text, kind, "p")


def test_values_print_as_yaml():
    assert [format_value(v) for v in ("", "mode", 8, 0.125, True, ["a", "b"], None)] == [
        "''", "mode", "8", "0.125", "true", "[a, b]", "(not set)"]


def test_node_names_must_be_fully_qualified():
    assert check_node_name("/robot1/trajectory_ensemble") == "/robot1/trajectory_ensemble"
    for bad in ("trajectory_ensemble", "/trajectory_ensemble/", "/a b"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            check_node_name(bad)


def test_help_lists_each_exit_status_and_the_tools_import_without_rclpy():
    # A finder that refuses rclpy: --help (and the module imports) must not need ROS.
    check = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'rclpy': raise ImportError('rclpy blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from trajectory_ensemble_node.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for command, codes in (("send-goal", ("0", "1", "2", "3", "4", "5", "6", "130")),
                           ("params", ("0", "1", "2", "3")), ("diagnostics", ("0", "2", "3"))):
        proc = subprocess.run([sys.executable, "-c", check, command, "--help"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr
        listed = re.findall(r"^  (\d+) ", proc.stdout.split("exit status:")[1], flags=re.M)
        assert listed == list(codes), proc.stdout


def test_a_reader_that_closes_early_ends_the_command_quietly_with_sigpipes_status():
    # `trajectory-ensemble params list | head -3`: once head exits, a write fails with EPIPE; a shell tool stops
    # there with status 141 and prints no traceback.
    from trajectory_ensemble_node.cli import BROKEN_PIPE_EXIT
    from trajectory_ensemble_node.replay.bags import BUNDLED_BAG

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "trajectory_ensemble_node.cli", "bags", "info", str(BUNDLED_BAG)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == BROKEN_PIPE_EXIT, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
