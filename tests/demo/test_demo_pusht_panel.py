"""``make demo``'s PushT panel is the lab's: without the lab, gym-pusht or the PushT weights, the demo says why in one
line, starts nothing and goes on (exit 0); ``--no-pusht`` skips it the same way."""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest

from trajectory_ensemble_node import bundled
from trajectory_ensemble_node.cli import launcher
from trajectory_ensemble_node.demo import demo


def _args(out: Path, *flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    return parser.parse_args(["--out", str(out), *flags])


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a skipped PushT panel must start no node")

    monkeypatch.setattr(launcher, "NodeProcess", refuse)
    monkeypatch.setattr(demo, "NodeProcess", refuse)


def test_without_the_lab_the_panel_is_skipped_in_one_line(monkeypatch, tmp_path, capsys, nothing_starts):
    monkeypatch.setitem(sys.modules, demo.PUSHT_PANEL_MODULE, None)  # the import fails as it does without the lab
    assert demo.pusht_panel(_args(tmp_path)) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"demo: PushT panel skipped: the lab ({demo.PUSHT_PANEL_MODULE}) is not installed (pip install -e lab, as "
        "make test does)"]
    assert list(tmp_path.iterdir()) == []


def test_without_the_pusht_weights_the_panel_is_skipped_and_says_how_to_build_them(monkeypatch, tmp_path, capsys,
                                                                                  nothing_starts):
    # A lab and a gym_pusht that import (stand-ins: this test needs neither), and no weights where the policy lies.
    monkeypatch.setitem(sys.modules, demo.PUSHT_PANEL_MODULE, types.ModuleType(demo.PUSHT_PANEL_MODULE))
    monkeypatch.setitem(sys.modules, "gym_pusht", types.ModuleType("gym_pusht"))
    absent = bundled.BundledPolicy("pusht", tmp_path / "absent", "PushT", rebuild="train-pusht")
    monkeypatch.setattr(bundled, "bundled_policy", lambda name: absent if name == "pusht" else None)
    assert demo.pusht_panel(_args(tmp_path / "out")) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line == f"demo: PushT panel skipped: the bundled PushT policy is not installed ({tmp_path / 'absent'}; " \
                   "train-pusht)"


def test_no_pusht_skips_the_panel_and_it_is_on_by_default(tmp_path, capsys, nothing_starts):
    assert _args(tmp_path).pusht is True
    assert demo.pusht_panel(_args(tmp_path, "--no-pusht")) == 0
    assert capsys.readouterr().out.splitlines() == ["demo: PushT panel skipped: --no-pusht"]
