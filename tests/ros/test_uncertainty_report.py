"""Novelty in a goal's report (issue 33), without DDS: the window over an episode's goals, the typed
``Uncertainty`` of the result, the ``/diagnostics`` WARN, and the parameters."""

from __future__ import annotations

import pytest

from trajectory_ensemble_node.serving import params as node_params
from trajectory_ensemble_node.ros.diagnostics import WARN, DiagnosticsInputs, engine_status, uncertain_reason
from trajectory_ensemble_node.ros.results import uncertainty_msg
from trajectory_ensemble_node.ros.uncertainty_window import UncertaintyWindow
from trajectory_ensemble_node.errors import ParameterError
from trajectory_ensemble_node.uncertainty import AlarmRule


def _goal(spread: float, novelty: float | None = None, **extra):
    metrics = {"uncertainty_score": spread, **extra}
    if novelty is not None:
        metrics["novelty_score"] = novelty
    return metrics


def test_window_of_one_changes_nothing():
    window = UncertaintyWindow(1, AlarmRule("both", 0.1, 1.0))
    metrics = _goal(0.2, 2.0, uncertain=True, novel=True)
    before = dict(metrics)
    window.observe(metrics, continued=True)
    window.observe(metrics, continued=False)
    assert metrics == before


def test_window_decides_on_the_means_of_the_continued_chain_and_restarts_on_a_fresh_goal():
    window = UncertaintyWindow(3, AlarmRule("novelty", 0.1, 1.0))
    first = _goal(0.0, 2.5, uncertain=True, novel=True)
    window.observe(first, continued=False)
    assert first["uncertainty_window"] == 1 and first["uncertain"] is True
    second = _goal(0.0, 0.1, uncertain=False, novel=False)
    window.observe(second, continued=True)  # mean novelty 1.3 > 1: still novel
    assert second["uncertainty_window"] == 2 and second["novelty_score_window"] == pytest.approx(1.3)
    assert second["uncertain"] is True and second["novel"] is True
    third, fourth = _goal(0.0, 0.1), _goal(0.0, 0.1)
    window.observe(third, continued=True)
    window.observe(fourth, continued=True)  # the 2.5 has left the window of 3
    assert fourth["uncertainty_window"] == 3 and fourth["novelty_score_window"] == pytest.approx(0.1)
    assert fourth["uncertain"] is False
    fresh = _goal(0.0, 2.0)
    window.observe(fresh, continued=False)  # a reset: a new window, this goal alone
    assert fresh["uncertainty_window"] == 1 and fresh["uncertain"] is True
    with pytest.raises(ValueError, match="got 0"):
        UncertaintyWindow(0, None)


def test_window_without_a_threshold_reports_means_only_and_skips_unscored_goals():
    window = UncertaintyWindow(2, None)
    a, b = _goal(0.2), _goal(0.4)
    window.observe(a, continued=False)
    window.observe({}, continued=True)  # a goal whose candidates were not scored
    window.observe(b, continued=True)
    assert b["uncertainty_score_window"] == pytest.approx(0.3) and "uncertain" not in b


def test_uncertainty_message_carries_novelty_rule_and_window():
    metrics = {"uncertainty_score": 0.02, "uncertainty_threshold": 0.04, "novelty_score": 1.7,
               "novelty_threshold": 0.9, "novel": True, "uncertainty_rule": "either", "uncertainty_window": 3,
               "uncertainty_score_window": 0.03, "novelty_score_window": 1.2, "uncertainty_modes": 1}
    msg = uncertainty_msg(metrics)
    assert msg.novelty_score == pytest.approx(1.7) and msg.novelty_threshold == pytest.approx(0.9)
    assert msg.novel and msg.rule == "either" and msg.window == 3
    assert msg.window_score == pytest.approx(0.03) and msg.window_novelty_score == pytest.approx(1.2)
    plain = uncertainty_msg({"uncertainty_score": 0.02, "uncertainty_modes": 1})
    assert (plain.novelty_score, plain.novel, plain.rule, plain.window) == (0.0, False, "", 1)
    assert plain.window_score == pytest.approx(0.02)
    assert uncertainty_msg({}).window == 0  # a failed goal scored nothing


def test_diagnostics_warn_names_the_rule_and_the_scores():
    metrics = {"uncertain": True, "uncertainty_score": 0.01, "uncertainty_threshold": 0.04, "novelty_score": 2.0,
               "novelty_threshold": 0.9, "uncertainty_rule": "novelty"}
    status = engine_status(DiagnosticsInputs(node_name="n", hardware_id="cpu", model="toy", notice="toy",
                                             weights_version=0, engine_alive=True, last_metrics=metrics))
    assert status.level == WARN
    assert "rule novelty: novelty 2 vs threshold 0.9" in status.message
    # Without a scorer the message is the one it always was.
    assert uncertain_reason({"uncertainty_score": 0.05, "uncertainty_threshold": 0.04}) == \
        "score 0.05 > threshold 0.04"


def _params(**overrides):
    values = {spec.name: spec.default for spec in node_params.PARAMETERS}
    values.update(overrides)
    return values


def test_novelty_parameters_are_checked_at_startup(tmp_path):
    assert node_params.validate(_params()).uncertainty_window == 1
    scorer = tmp_path / "s.novelty.safetensors"
    scorer.write_bytes(b"x")
    calibration = tmp_path / "c.json"
    calibration.write_text("{}")
    ok = node_params.validate(_params(novelty_scorer_file=str(scorer), uncertainty_calibration_file=str(calibration),
                                      uncertainty_rule="both", uncertainty_window=4))
    assert ok.uncertainty_rule == "both" and ok.uncertainty_window == 4
    for overrides, words in [
        ({"uncertainty_rule": "fiper"}, "'fiper' is not one of"),
        ({"uncertainty_rule": "both"}, "'both' needs novelty_scorer_file"),
        ({"uncertainty_window": 0}, "uncertainty_window: must be >= 1"),
        ({"novelty_scorer_file": str(scorer)}, "needs uncertainty_calibration_file"),
        ({"novelty_scorer_file": str(calibration), "uncertainty_calibration_file": str(calibration)},
         "not an existing .safetensors file"),
    ]:
        with pytest.raises(ParameterError, match=words):
            node_params.validate(_params(**overrides))
