"""The uncertainty estimate: modes, shares, spreads and the score behave as their definitions say."""

from __future__ import annotations

import math

import torch

from trajectory_ensemble_node.reducers import MODE_DISTANCE_THRESHOLD
from trajectory_ensemble_node.uncertainty import estimate_uncertainty


def test_two_tight_modes_score_low_and_count_two():
    torch.manual_seed(0)
    up, down = torch.full((8, 2), 0.5), torch.full((8, 2), -0.5)
    candidates = torch.stack([up] * 5 + [down] * 3) + 0.01 * torch.randn(8, 8, 2)
    u = estimate_uncertainty(candidates)
    assert u.modes == 2 and u.mode_share == 5 / 8
    assert u.spread > 0.4 and u.score < 0.05
    assert len(u.step_std) == 8


def test_scattered_candidates_score_high():
    torch.manual_seed(1)
    tight, wide = 0.01 * torch.randn(8, 8, 2), 0.5 * torch.randn(8, 8, 2)
    tight_u, scattered = estimate_uncertainty(tight), estimate_uncertainty(wide)
    assert scattered.score > 10 * tight_u.score
    # The score carries the spread; the mode count follows the group's own scale, so a wide unimodal cloud is one
    # mode, as a tight one is. A fixed cut in action units (the former 0.2) splits only the wide one.
    assert scattered.modes == tight_u.modes == 1
    assert estimate_uncertainty(wide, threshold=MODE_DISTANCE_THRESHOLD).modes > 1
    assert estimate_uncertainty(tight, threshold=MODE_DISTANCE_THRESHOLD).modes == 1


def test_score_is_the_mean_nearest_neighbour_rms():
    candidates = torch.tensor([[[0.0, 0.0]], [[0.3, 0.4]], [[3.0, 4.0]]])
    u = estimate_uncertainty(candidates, threshold=1.0)
    # RMS over H * D = 2 elements; float32 inputs, so compare to 1e-6.
    nearest = [0.5 / math.sqrt(2), 0.5 / math.sqrt(2), math.hypot(2.7, 3.6) / math.sqrt(2)]
    assert math.isclose(u.score, sum(nearest) / 3, rel_tol=1e-6)
    assert u.modes == 2 and u.report(0.1).as_metrics()["uncertain"] is True


def test_one_candidate_has_no_spread():
    u = estimate_uncertainty(torch.ones(1, 4, 3))
    assert (u.modes, u.mode_share, u.spread, u.score) == (1, 1.0, 0.0, 0.0)
