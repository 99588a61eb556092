"""Every command of ``trajectory-ensemble``, and every subcommand of those that have them, answers ``--help``.

The commands come from the dispatcher's own table (:func:`trajectory_ensemble_node.cli.commands`: the product's and
each installed plugin's, the lab's included), and the subcommands from each command's own parser, so a new command
or subcommand is covered without editing this file. Each case calls the dispatcher's ``main`` in this process and
catches argparse's ``SystemExit``, so the whole table costs one import per command instead of one interpreter each.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from trajectory_ensemble_node.cli import commands, main

COMMANDS = commands()


def _subcommands(command: str) -> list[str]:
    """The subcommand names of ``command``, read from the parser its module builds (empty when it has none)."""
    parser = argparse.ArgumentParser(prog=f"trajectory-ensemble {command}")
    importlib.import_module(COMMANDS[command][0]).add_arguments(parser)
    return [name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices]


CASES = [(command,) for command in COMMANDS] + [(command, sub) for command in COMMANDS for sub in _subcommands(command)]


def test_the_table_holds_the_commands_earlier_issues_name() -> None:
    named = {"serve", "serve-openpi", "demo", "replay", "bags", "sim", "send-goal", "diagnostics", "params",
             "lifecycle", "docs", "calibrate"}
    assert named <= set(COMMANDS)
    subs = {case for case in CASES if len(case) == 2}
    assert {("params", "get"), ("params", "set"), ("params", "list"), ("bags", "make-demo-bag"), ("bags", "info"),
            ("lifecycle", "set")} <= subs


@pytest.mark.parametrize("words", CASES, ids=[" ".join(case) for case in CASES])
def test_help_exits_0_with_usage(words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*words, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: trajectory-ensemble {' '.join(words)}"), out[:200]
    assert "-h, --help" in out


def test_the_package_runs_as_a_module() -> None:
    """``python -m trajectory_ensemble_node.cli`` (what the launcher and the tests start) lists every command."""
    done = subprocess.run([sys.executable, "-m", "trajectory_ensemble_node.cli", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: trajectory-ensemble")
    assert all(command in done.stdout for command in COMMANDS)
