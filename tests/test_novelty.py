"""Observation novelty scorers (RND and k-NN), their safetensors file, and the alarm rules that combine them with
candidate spread (issue 33)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from trajectory_ensemble_node.errors import ErrorCode, NoveltyScorerError
from trajectory_ensemble_node.novelty import EmbeddingSpec, KNNScorer, RNDScorer, fit_scorer, load_scorer
from trajectory_ensemble_node.calibration import novelty_calibration
from trajectory_ensemble_node.uncertainty import (
    ALARM_RULES,
    AlarmRule,
    NoveltyCheck,
    group_uncertainty,
    load_calibration,
)

SPEC = EmbeddingSpec("conditioning_latent", 2, 8)


def _cloud(n: int, seed: int, shift: float = 0.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, SPEC.dim, generator=generator) * torch.linspace(0.5, 2.0, SPEC.dim) + shift


@pytest.mark.parametrize("kind", ["rnd", "knn"])
def test_scorer_ranks_far_embeddings_above_familiar_ones(kind):
    scorer = fit_scorer(kind, _cloud(200, 0), SPEC, seed=0, **({"steps": 400} if kind == "rnd" else {}))
    familiar = scorer.scores(_cloud(100, 1))
    far = scorer.scores(_cloud(100, 2, shift=4.0))
    assert far.shape == (100,) and familiar.dtype == torch.float64
    assert float(far.median()) > 2 * float(familiar.median())
    assert scorer.score(_cloud(1, 3)[0]) == pytest.approx(float(scorer.scores(_cloud(1, 3))[0]))


@pytest.mark.parametrize("kind", ["rnd", "knn"])
def test_saved_scorer_loads_back_with_identical_scores_and_its_spec(tmp_path, kind):
    scorer = fit_scorer(kind, _cloud(50, 0), SPEC, seed=3, **({"steps": 50} if kind == "rnd" else {"k": 2}))
    path = tmp_path / "scorer.safetensors"
    digest = scorer.save(path)
    loaded = load_scorer(path)
    assert type(loaded) is type(scorer) and loaded.embedding == SPEC and len(digest) == 64
    probe = _cloud(20, 9, shift=1.0)
    assert torch.equal(loaded.scores(probe), scorer.scores(probe))


def test_rnd_fit_is_deterministic_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = RNDScorer.fit(_cloud(40, 0), SPEC, seed=5, steps=30)
    after = torch.rand(1)
    b = RNDScorer.fit(_cloud(40, 0), SPEC, seed=5, steps=30)
    assert torch.equal(before, after)
    assert torch.equal(a.scores(_cloud(5, 1)), b.scores(_cloud(5, 1)))


def test_knn_score_is_the_distance_to_the_kth_neighbour_in_standardized_space():
    spec = EmbeddingSpec("e", 1, 2)
    fit = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0]])
    scorer = KNNScorer.fit(fit, spec, k=1)  # mean (1, 1), scale (1, 1): standardized corners at (+-1, +-1)
    assert scorer.score(torch.tensor([1.0, 1.0])) == pytest.approx(math.sqrt(2))
    assert KNNScorer.fit(fit, spec, k=3).score(torch.tensor([0.0, 0.0])) == pytest.approx(2.0)


def test_bad_files_and_mismatched_embeddings_are_named_errors(tmp_path):
    scorer = fit_scorer("knn", _cloud(10, 0), SPEC)
    with pytest.raises(NoveltyScorerError, match=r"\.safetensors, got '.*scorer\.pt'"):
        scorer.save(tmp_path / "scorer.pt")
    pickle_like = tmp_path / "scorer.pkl"
    pickle_like.write_bytes(b"\x80\x04")
    with pytest.raises(NoveltyScorerError, match="pickle never is") as info:
        load_scorer(pickle_like)
    assert info.value.code == ErrorCode.NOVELTY_SCORER_INVALID
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a safetensors file")
    with pytest.raises(NoveltyScorerError, match="cannot be read"):
        load_scorer(garbage)
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": torch.zeros(2)}, str(foreign), metadata={"format": "something else"})
    with pytest.raises(NoveltyScorerError, match="'something else'"):
        load_scorer(foreign)
    with pytest.raises(NoveltyScorerError, match="does not fit this scorer, which reads 'conditioning_latent' of "
                                                 "length 8"):
        scorer.score(torch.zeros(9))
    with pytest.raises(NoveltyScorerError, match="NaN"):
        scorer.score(torch.full((8,), math.nan))
    with pytest.raises(NoveltyScorerError, match="'lof'"):
        fit_scorer("lof", _cloud(10, 0), SPEC)


# --- alarm rules ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "expected"), [
    ("spread", [False, True, False, True]),
    ("novelty", [False, False, True, True]),
    ("either", [False, True, True, True]),
    ("both", [False, False, False, True]),
])
def test_each_rule_alarms_on_its_scores(rule, expected):
    alarm = AlarmRule(rule, spread_threshold=0.1, novelty_threshold=1.0)
    cases = [(0.05, 0.5), (0.2, 0.5), (0.05, 2.0), (0.2, 2.0)]
    assert [alarm.decide(s, n)[0] for s, n in cases] == expected
    assert [alarm.decide(s, n)[1] for s, n in cases] == [False, False, True, True]  # novel, whatever the rule
    # The rule's score crosses 1 exactly where it alarms (calibrate ranks goals by it).
    assert [alarm.score(s, n) > 1 for s, n in cases] == expected


def test_rules_refuse_what_they_cannot_decide():
    assert ALARM_RULES == ("spread", "novelty", "either", "both")
    with pytest.raises(ValueError, match="'fiper'"):
        AlarmRule("fiper", 0.1, 1.0)
    with pytest.raises(ValueError, match="'both' needs a novelty threshold"):
        AlarmRule("both", 0.1)
    with pytest.raises(ValueError, match="'novelty' needs a spread|'spread' needs a spread"):
        AlarmRule("spread", None, 1.0)
    with pytest.raises(ValueError, match="finite number >= 0, got inf"):
        AlarmRule("spread", math.inf)
    assert AlarmRule("spread", 0.1).decide(0.2, None) == (True, None)
    with pytest.raises(ValueError, match="needs a novelty score"):
        AlarmRule("either", 0.1, 1.0).decide(0.2, None)


def test_group_metrics_without_a_scorer_are_exactly_the_spread_metrics():
    torch.manual_seed(0)
    candidates = 0.1 * torch.randn(8, 8, 2)
    from trajectory_ensemble_node.uncertainty import estimate_uncertainty

    for threshold in (0.05, None):
        spread = estimate_uncertainty(candidates).report(threshold)
        assert group_uncertainty(candidates, threshold).as_metrics() == spread.as_metrics()


def test_group_metrics_with_a_scorer_report_novelty_and_decide_by_the_rule():
    scorer = fit_scorer("knn", _cloud(30, 0), SPEC)
    candidates = torch.zeros(4, 8, 2)  # no spread at all
    far = _cloud(1, 1, shift=10.0)[0]
    check = NoveltyCheck(scorer, AlarmRule("novelty", 0.01, 3.0))
    metrics = group_uncertainty(candidates, 0.01, check, far).as_metrics()
    assert metrics["novelty_score"] == pytest.approx(scorer.score(far)) and metrics["novel"] is True
    assert metrics["uncertain"] is True and metrics["uncertainty_rule"] == "novelty"
    assert "uncertainty_threshold" not in metrics and metrics["novelty_threshold"] == 3.0
    both = group_uncertainty(candidates, 0.01, NoveltyCheck(scorer, AlarmRule("both", 0.01, 3.0)), far).as_metrics()
    assert both["uncertain"] is False and both["novel"] is True and both["uncertainty_threshold"] == 0.01
    with pytest.raises(NoveltyScorerError, match="no observation embedding"):
        group_uncertainty(candidates, 0.01, check, None)


def test_load_calibration_checks_the_scorer_is_the_calibrated_one(tmp_path):
    scorer = fit_scorer("knn", _cloud(30, 0), SPEC)
    path = tmp_path / "cal.novelty.safetensors"
    digest = scorer.save(path)
    rules = {name: {"spread_threshold": 0.04, "novelty_threshold": 2.5} for name in ALARM_RULES}
    document = {"uncertainty": {"threshold": 0.04}, "observation": {"threshold": 2.5, "scorer_sha256": digest},
                "combined": {"rule": "either", "rules": rules}}
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(document))
    check = load_calibration(cal, path)
    assert check.alarm == AlarmRule("either", 0.04, 2.5) and check.scorer.kind == "knn"
    assert load_calibration(cal, path, "both").alarm.rule == "both"
    other = tmp_path / "other.novelty.safetensors"
    fit_scorer("knn", _cloud(30, 7), SPEC).save(other)
    with pytest.raises(NoveltyScorerError, match="not the one"):
        load_calibration(cal, other)
    cal.write_text(json.dumps({"uncertainty": {"threshold": 0.04}}))
    with pytest.raises(ValueError, match="no.*novelty calibration|with a novelty calibration"):
        load_calibration(cal, path)


# --- calibration (the shared scoring/threshold part) --------------------------------------------------------------


def test_fit_thresholds_split_the_calibration_goals_and_set_every_rule():
    rng = np.random.default_rng(0)
    spread = list(rng.gamma(2.0, 0.01, size=200))
    fit = novelty_calibration.fit_thresholds(spread, _cloud(200, 0), SPEC, 0.1, kind="knn")
    assert fit.fit_count == 100 and fit.threshold_count == 100 and len(fit.calibration_novelty) == 100
    rules = fit.rules
    assert set(rules) == set(ALARM_RULES)
    # either: both thresholds at alpha / 2, i.e. higher than the alpha ones.
    assert rules["either"].spread_threshold > rules["spread"].spread_threshold
    assert rules["either"].novelty_threshold > rules["novelty"].novelty_threshold
    assert rules["both"] == AlarmRule("both", rules["spread"].spread_threshold, rules["novelty"].novelty_threshold)
    with pytest.raises(ValueError, match="no finite novelty threshold"):
        novelty_calibration.fit_thresholds(spread[:20], _cloud(20, 0), SPEC, 0.1, kind="knn")


def test_rules_are_evaluated_and_the_recommendation_follows_the_figures():
    rng = np.random.default_rng(1)
    rules = {name: AlarmRule(name, 1.0, 1.0) for name in ALARM_RULES}
    # Spread is noise; novelty is high on shifted goals, which fail more often.
    held = novelty_calibration.Goals(list(rng.uniform(0, 1.05, 200)), list(rng.uniform(0, 1.05, 200)),
                                     list(rng.random(200) < 0.1))
    shifted = novelty_calibration.Goals(list(rng.uniform(0, 1.05, 200)), list(rng.uniform(1.5, 3, 200)),
                                        list(rng.random(200) < 0.6))
    figures = novelty_calibration.evaluate_rules(rules, held, shifted, alpha=0.1)
    assert figures["novelty"]["detection_rate"] == 1.0 and figures["novelty"]["false_alarm_ok"]
    assert figures["spread"]["margin_over_spread"]["delta"] == 0.0
    assert figures["novelty"]["margin_over_spread"]["ci95"][0] > 0  # novelty ranks failures, spread does not
    rule, why = novelty_calibration.recommend(figures)
    assert rule in ("novelty", "either") and "highest failure AUROC" in why
