"""The statistics every calibration and results file shares (:mod:`trajectory_ensemble_node.stats`): the conformal
threshold, AUROC and the paired bootstrap of two scores' AUROCs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trajectory_ensemble_node.stats import auroc, conformal_threshold, paired_bootstrap_auroc


def test_threshold_is_the_conformal_rank():
    scores = list(range(1, 101))  # 1..100
    # ceil(0.95 * 101) = 96 -> the 96th smallest.
    assert conformal_threshold(scores, 0.05) == 96
    assert conformal_threshold(scores[:10], 0.05) == math.inf  # rank 11 > 10
    with pytest.raises(ValueError, match="alpha"):
        conformal_threshold(scores, 1.5)


def test_false_alarm_rate_is_near_alpha_on_exchangeable_scores():
    rng = np.random.default_rng(0)
    rates = []
    for _ in range(200):
        calibration, test = rng.normal(size=100), rng.normal(size=100)
        rates.append(float((test > conformal_threshold(calibration, 0.1)).mean()))
    assert abs(np.mean(rates) - 0.1) < 0.02  # marginal guarantee: <= alpha, and close to it


def test_auroc_counts_pairs_and_ties():
    assert auroc([0, 1], [2, 3]) == 1.0
    assert auroc([2, 3], [0, 1]) == 0.0
    assert auroc([1, 1], [1, 1]) == 0.5


def test_paired_bootstrap_of_a_score_against_itself_has_no_margin():
    rng = np.random.default_rng(2)
    labels = rng.random(100) < 0.4
    score = labels + rng.normal(size=100)
    out = paired_bootstrap_auroc(labels, score, score)
    assert out["difference"] == 0.0 and out["ci_difference"] == [0.0, 0.0]
    assert out["ci_a"][0] < out["a"] < out["ci_a"][1]
