"""The lab's one JSON writer (``records.write_json``) and ``python -m`` through the CLI's parser (``run_command``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trajectory_ensemble_lab.commands import COMMANDS, run_command
from trajectory_ensemble_lab.pusht import oracle_cli
from trajectory_ensemble_lab.records import write_json


def test_write_json_makes_the_folder_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "bench" / "results" / "run.json"
    document = {"date": "2026-12-06", "coverage": [0.5, 0.25], "nested": {"ok": True, "none": None}}
    assert write_json(path, document) == path
    text = path.read_text(encoding="utf-8")
    assert json.loads(text) == document
    assert text.endswith("}\n") and text.startswith('{\n "date"')  # one-space indent, final newline
    write_json(path, [1])  # replaces, does not append
    assert json.loads(path.read_text(encoding="utf-8")) == [1]


def test_write_json_refuses_what_json_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_json(tmp_path / "bad.json", {"path": tmp_path})


def test_module_main_is_the_cli_command(capsys: pytest.CaptureFixture[str]) -> None:
    # The module's own main and the CLI build one parser: same prog, same options.
    with pytest.raises(SystemExit) as done:
        oracle_cli.main(["--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: trajectory-ensemble pusht-oracle")
    assert "train" in text and "eval" in text
    assert "pusht-oracle" in COMMANDS


def test_run_command_names_an_unknown_command() -> None:
    with pytest.raises(ValueError, match="no lab command 'pusht-nope'"):
        run_command("pusht-nope", [])
