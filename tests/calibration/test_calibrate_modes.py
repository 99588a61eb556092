"""``calibrate``'s toy-scene mode comes from the lab: without it the command says so and exits 2; ``--bag`` does not
need it (issue 46: toy-scene calibration and the shifted scenes left the product's wheel)."""

from __future__ import annotations

import sys

import pytest

from trajectory_ensemble_node.calibration import calibrate
from trajectory_ensemble_node.cli import main
from trajectory_ensemble_node.cli.dispatch import lab_module

LAB = "trajectory_ensemble_lab"


def _without_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import trajectory_ensemble_lab...`` fail here as it does where the lab is not installed."""
    for name in [m for m in sys.modules if m == LAB or m.startswith(LAB + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, LAB, None)


def test_toy_scene_mode_without_the_lab_exits_2_and_names_it(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _without_lab(monkeypatch)
    assert main(["calibrate", "--scenes", "1", "--heldout", "1", "--shifted", "1"]) == calibrate.EXIT_NO_LAB == 2
    err = capsys.readouterr().err
    assert calibrate.SCENE_CALIBRATION_MODULE in err and "not installed" in err and "--bag" in err


def test_help_works_without_the_lab(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _without_lab(monkeypatch)
    with pytest.raises(SystemExit) as done:
        main(["calibrate", "--help"])
    assert done.value.code == 0
    assert "--family FAMILY" in capsys.readouterr().out


def test_with_the_lab_the_families_are_its_shifted_families(capsys: pytest.CaptureFixture[str]) -> None:
    shifted = pytest.importorskip(calibrate.SHIFTED_MODULE)
    with pytest.raises(SystemExit):
        main(["calibrate", "--help"])
    assert "{" + ",".join(shifted.FAMILIES) + "}" in capsys.readouterr().out
    assert lab_module(calibrate.SCENE_CALIBRATION_MODULE) is not None
