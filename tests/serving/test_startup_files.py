"""Files read at start-up are checked for meaning, not only for shape (issue 45, row 3).

A novelty scorer holding NaN scored NaN on every frame, and ``nan > threshold`` is False: ``novel`` and ``uncertain``
stayed False on black, white and noise frames alike. Each file a node or ``serve-openpi`` reads for its alarm or its
limits is refused at start-up with its own code when a value in it is non-finite or makes a threshold that cannot
fire; and a novelty score that still turns out non-finite at run time reads as novel and uncertain (fails closed).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from trajectory_ensemble_node.errors import (
    ErrorCode,
    LimitsFileError,
    NoveltyScorerError,
    ParameterError,
    StatsFileError,
    describe_error,
)
from trajectory_ensemble_node.novelty import EmbeddingSpec, fit_scorer, load_scorer
from trajectory_ensemble_node.serving.startup_checks import load_action_stats, load_novelty, load_uncertainty_threshold
from trajectory_ensemble_node.safety import load_limits
from trajectory_ensemble_node.uncertainty import ALARM_RULES, AlarmRule, NoveltyCheck, group_uncertainty

SPEC = EmbeddingSpec("conditioning_latent", 2, 8)


def _cloud(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, SPEC.dim, generator=torch.Generator().manual_seed(seed))


def _tampered(tmp_path: Path, kind: str, key: str, value: float) -> Path:
    """A scorer file as ``calibrate`` writes it, then one value of tensor ``key`` set to ``value`` (``save`` refuses
    non-finite tensors, so the file is rewritten with safetensors directly, as a corrupted or hostile file would be)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    good = tmp_path / f"good-{kind}.safetensors"
    fit_scorer(kind, _cloud(20, 0), SPEC, **({"steps": 5} if kind == "rnd" else {})).save(good)
    with safe_open(str(good), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {k: handle.get_tensor(k).clone() for k in handle.keys()}
    tensors[key].view(-1)[0] = value
    bad = tmp_path / f"bad-{kind}-{key}.safetensors"
    save_file(tensors, str(bad), metadata=metadata)
    return bad


def _calibration(tmp_path: Path, scorer_file: Path, *, threshold: object = 0.04, novelty_threshold: object = 2.5,
                 alpha: object = 0.05, raw: str | None = None) -> Path:
    from trajectory_ensemble_node.novelty import file_sha256

    rules = {name: {"spread_threshold": threshold, "novelty_threshold": novelty_threshold} for name in ALARM_RULES}
    document = {"uncertainty": {"threshold": threshold, "alpha": alpha},
                "observation": {"threshold": novelty_threshold, "alpha": alpha,
                                "scorer_sha256": file_sha256(scorer_file)},
                "combined": {"rule": "novelty", "rules": rules}}
    path = tmp_path / "cal.json"
    path.write_text(raw if raw is not None else json.dumps(document))  # json.dumps writes NaN and Infinity as such
    return path


def _params(cal: Path | str, scorer: Path | str = "") -> SimpleNamespace:
    return SimpleNamespace(uncertainty_calibration_file=str(cal), novelty_scorer_file=str(scorer),
                           uncertainty_rule="", uncertainty_threshold=0.0)


# --- the scorer file (84) ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "key"), [("knn", "reference"), ("knn", "mean"), ("rnd", "predictor.0.weight"),
                                           ("rnd", "target.2.bias"), ("rnd", "scale")])
@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_a_scorer_with_a_non_finite_tensor_is_refused_with_84_naming_the_tensor(tmp_path, kind, key, value):
    bad = _tampered(tmp_path, kind, key, value)
    with pytest.raises(NoveltyScorerError) as info:
        load_scorer(bad)
    assert info.value.code == ErrorCode.NOVELTY_SCORER_INVALID == 84
    assert f"'{key}' (1 of " in str(info.value) and "non-finite" in str(info.value) and str(bad) in str(info.value)


def test_a_scorer_with_a_zero_scale_is_refused_and_save_refuses_nan(tmp_path):
    with pytest.raises(NoveltyScorerError, match="'scale' must be > 0"):
        load_scorer(_tampered(tmp_path, "knn", "scale", 0.0))
    scorer = fit_scorer("knn", _cloud(20, 0), SPEC)
    scorer.reference[0, 0] = math.nan
    with pytest.raises(NoveltyScorerError, match="'reference' \\(1 of 160 values"):
        scorer.save(tmp_path / "never.safetensors")
    assert not (tmp_path / "never.safetensors").exists()


def test_start_up_refuses_a_nan_scorer_through_load_novelty_with_84(tmp_path):
    bad = _tampered(tmp_path, "knn", "reference", math.nan)
    with pytest.raises(NoveltyScorerError) as info:
        load_novelty(_params(_calibration(tmp_path, bad), bad))
    assert describe_error(info.value).startswith("NOVELTY_SCORER_INVALID (84): ")


# --- the calibration file (52) ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "quoted"), [
    ({"threshold": math.nan}, "NaN"),
    ({"novelty_threshold": math.inf}, "Infinity"),
    ({"novelty_threshold": -math.inf}, "-Infinity"),
    ({"alpha": -0.1}, "alpha = -0.1"),
    ({"alpha": 1.5}, "alpha = 1.5"),
    ({"alpha": math.nan}, "NaN"),
    ({"novelty_threshold": -1.0}, "novelty_threshold = -1.0"),
])
def test_a_calibration_file_whose_alarm_cannot_fire_is_refused_with_52(tmp_path, fields, quoted):
    scorer = tmp_path / "ok.safetensors"
    fit_scorer("knn", _cloud(20, 0), SPEC).save(scorer)
    cal = _calibration(tmp_path, scorer, **fields)
    for load in (lambda: load_novelty(_params(cal, scorer)), lambda: load_uncertainty_threshold(_params(cal))):
        with pytest.raises(ParameterError) as info:
            load()
        assert info.value.code == ErrorCode.INVALID_PARAMETERS == 52
        assert quoted in str(info.value) and str(cal) in str(info.value)


def test_a_calibration_number_that_overflows_to_inf_is_refused(tmp_path):
    cal = tmp_path / "cal.json"
    cal.write_text('{"uncertainty": {"threshold": 1e999, "alpha": 0.05}}')
    with pytest.raises(ParameterError, match="1e999 overflows to inf"):
        load_uncertainty_threshold(_params(cal))


def test_a_finite_calibration_file_still_loads(tmp_path):
    scorer = tmp_path / "ok.safetensors"
    fit_scorer("knn", _cloud(20, 0), SPEC).save(scorer)
    cal = _calibration(tmp_path, scorer)
    assert load_uncertainty_threshold(_params(cal)) == 0.04
    check = load_novelty(_params(cal, scorer))
    assert check is not None and check.alarm == AlarmRule("novelty", 0.04, 2.5)


# --- the stats (50) and limits (83) files ----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999"])
def test_an_action_stats_file_with_a_non_finite_value_is_refused_with_50(tmp_path, value):
    stats = tmp_path / "stats.json"
    stats.write_text(f'{{"q01": [0, {value}], "q99": [1, 1]}}')
    params = SimpleNamespace(action_stats_file=str(stats), action_stats_method="quantile", action_dim=2,
                             domain_name="pusht")
    with pytest.raises(StatsFileError) as info:
        load_action_stats(params)
    assert info.value.code == ErrorCode.STATS_FILE_INVALID == 50 and "'q01'" in str(info.value)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_limits_file_with_a_non_finite_value_is_refused_with_83(tmp_path, value):
    limits = tmp_path / "limits.yaml"
    limits.write_text(f"version: 1\nchannels:\n  - {{name: x, min: -1, max: 1}}\n  - {{name: y, max_velocity: {value}}}\n")
    with pytest.raises(LimitsFileError) as info:
        load_limits(limits)
    assert info.value.code == ErrorCode.LIMITS_FILE_INVALID == 83 and "channels[1]" in str(info.value)


# --- run time: the alarm fails closed ---------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ALARM_RULES)
@pytest.mark.parametrize("score", [math.nan, math.inf], ids=["nan", "inf"])
def test_a_non_finite_novelty_score_is_novel_and_uncertain_under_every_rule(rule, score):
    alarm = AlarmRule(rule, spread_threshold=0.1, novelty_threshold=1.0)
    assert alarm.decide(0.0, score) == (True, True)  # no spread at all: only the novelty score could alarm
    assert alarm.decide(0.0, 0.5) == (False, False)


def test_a_scorer_that_scores_nan_at_run_time_reports_the_fault_and_alarms():
    scorer = fit_scorer("knn", _cloud(20, 0), SPEC)
    scorer.reference[:] = math.nan  # only a file could carry this, and the loader refuses it; here: in memory
    metrics = group_uncertainty(torch.zeros(4, 8, 2), None, NoveltyCheck(scorer, AlarmRule("both", 0.1, 1.0)),
                                _cloud(1, 1)[0]).as_metrics()
    assert math.isnan(metrics["novelty_score"])
    assert metrics["novel"] is True and metrics["uncertain"] is True
    assert "not finite" in metrics["novelty_fault"]


# --- the process: serve-openpi prints the code -------------------------------------------------------------------


@pytest.mark.slow
def test_serve_openpi_refuses_a_nan_scorer_at_start_up_with_its_code(tmp_path):
    bad = _tampered(tmp_path, "knn", "reference", math.nan)
    params = tmp_path / "params.yaml"
    params.write_text("/**/trajectory_ensemble:\n  ros__parameters:\n"
                      f"    uncertainty_calibration_file: '{_calibration(tmp_path, bad)}'\n"
                      f"    novelty_scorer_file: '{bad}'\n")
    proc = subprocess.run([sys.executable, "-m", "trajectory_ensemble_node.cli", "serve-openpi", "--params-file",
                           str(params), "--port", "0"], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "NOVELTY_SCORER_INVALID (84)" in proc.stderr and "'reference' (1 of 160" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
