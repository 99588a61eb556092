"""Conformal threshold and AUROC (:mod:`trajectory_ensemble_node.stats`) and the shifted scene family that ``trajectory-ensemble calibrate`` uses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trajectory_ensemble_node.toy import task
from trajectory_ensemble_node.stats import auroc, conformal_threshold
from trajectory_ensemble_lab.toy.shifted import FAMILIES, make_shifted_scene, render_shifted, shifted_scenes


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


def test_shifted_scenes_are_deterministic_and_differ_from_training_images():
    for family in FAMILIES:
        a, b = make_shifted_scene(2_000_007, family), make_shifted_scene(2_000_007, family)
        assert np.array_equal(render_shifted(a), render_shifted(b))
        plain = task.render(task.make_scene(2_000_007))
        assert not np.array_equal(render_shifted(a), plain)
    two = shifted_scenes(5, family="two_obstacles")
    assert all(len(s.extra_obstacles) == 1 for s in two)
    with pytest.raises(ValueError, match="'three'"):
        make_shifted_scene(1, "three")
