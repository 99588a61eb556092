"""The uncertainty estimate: modes, shares, spreads and the score behave as their definitions say."""

from __future__ import annotations

import math

import torch

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
    tight = estimate_uncertainty(0.01 * torch.randn(8, 8, 2))
    scattered = estimate_uncertainty(0.5 * torch.randn(8, 8, 2))
    assert scattered.score > 10 * tight.score and scattered.modes > tight.modes == 1


def test_score_is_the_mean_nearest_neighbour_rms():
    candidates = torch.tensor([[[0.0, 0.0]], [[0.3, 0.4]], [[3.0, 4.0]]])
    u = estimate_uncertainty(candidates, threshold=1.0)
    # RMS over H * D = 2 elements; float32 inputs, so compare to 1e-6.
    nearest = [0.5 / math.sqrt(2), 0.5 / math.sqrt(2), math.hypot(2.7, 3.6) / math.sqrt(2)]
    assert math.isclose(u.score, sum(nearest) / 3, rel_tol=1e-6)
    assert u.modes == 2 and u.metrics(threshold=0.1)["uncertain"] is True


def test_one_candidate_has_no_spread():
    u = estimate_uncertainty(torch.ones(1, 4, 3))
    assert (u.modes, u.mode_share, u.spread, u.score) == (1, 1.0, 0.0, 0.0)
