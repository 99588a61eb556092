"""Continuity-aware selection: BID's backward coherence and the mode that continues the committed prefix."""

from __future__ import annotations

import pytest
import torch

from trajectory_ensemble_node.reducers import coherence_scores
from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine import reduce_candidates
from trajectory_ensemble_node.engine.context import ExecutionContext
from trajectory_ensemble_node.errors import InvalidSpecError
from trajectory_ensemble_node.reducers import ContinuityReference, get_reducer

H = 8


def two_modes(minority_up: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Five candidates going down, three going up; and a previous chunk that was going up."""
    t = torch.linspace(0, 1, H)
    up = torch.stack([t, 0.5 * torch.sin(torch.pi * t)], dim=-1)
    down = up * torch.tensor([1.0, -1.0])
    noise = torch.Generator().manual_seed(0)
    cands = [down + 0.01 * torch.randn(H, 2, generator=noise) for _ in range(5)]
    cands += [up + 0.01 * torch.randn(H, 2, generator=noise) for _ in range(3)]
    return torch.stack(cands), up if minority_up else down


def reference_for(prev: torch.Tensor, frozen: int = 2) -> ContinuityReference:
    context = ExecutionContext(prev, 0.0, 0.1, frozen, 0.0)
    return ContinuityReference(context.target(H), context.weights(H))


def test_backward_coherence_picks_the_candidate_nearest_the_previous_chunk():
    candidates, prev = two_modes()
    reference = reference_for(prev)
    chosen = get_reducer("backward_coherence")(candidates, reference)
    distances = [float((reference.weights[:, None] * (c - prev) ** 2).sum()) for c in candidates]
    best = min(range(len(candidates)), key=distances.__getitem__)
    assert torch.equal(chosen, candidates[best])
    assert best >= 5, "the nearest candidate is one of the upward ones"


def test_mode_continuity_keeps_the_committed_mode_even_when_it_is_the_minority():
    candidates, prev = two_modes()
    reference = reference_for(prev)
    continued = get_reducer("mode_continuity")(candidates, reference)
    distances = [float((reference.weights[:, None] * (c - prev) ** 2).sum()) for c in candidates]
    assert torch.equal(continued, candidates[min(range(5, 8), key=distances.__getitem__)])
    # The plain mode takes the majority, i.e. flips sides.
    assert torch.allclose(get_reducer("mode")(candidates), candidates[:5].mean(0))


def test_without_a_reference_they_fall_back_to_medoid_and_mode():
    candidates, _ = two_modes()
    assert torch.equal(get_reducer("backward_coherence")(candidates), get_reducer("medoid")(candidates))
    assert torch.equal(get_reducer("mode_continuity")(candidates), get_reducer("mode")(candidates))


def test_they_declare_normalized_space_and_context_use():
    for name in ("backward_coherence", "mode_continuity"):
        reducer = get_reducer(name)
        assert reducer.space == "normalized" and reducer.uses_context and not reducer.streaming
    assert not get_reducer("mean").uses_context


def test_a_reference_of_the_wrong_shape_is_refused():
    candidates, prev = two_modes()
    bad = ContinuityReference(prev[:4], torch.ones(4))
    with pytest.raises(InvalidSpecError, match=r"\(4, 2\)"):
        get_reducer("mode_continuity")(candidates, bad)
    with pytest.raises(InvalidSpecError, match=r"\[0, 1\]"):
        ContinuityReference(prev, torch.full((H,), 2.0))


def test_the_engine_hands_the_context_to_continuity_reducers_only():
    candidates, prev = two_modes()
    context = ExecutionContext(prev, 0.0, 0.1, 2, 0.0)
    spec = CandidateTrajectorySpec(count=8, reducer="mode_continuity")
    action, _ = reduce_candidates(candidates, spec, get_reducer("mode_continuity"), None,
                                  reduce_before_denormalize=True, context=context)
    assert any(torch.equal(action, c) for c in candidates[5:])
    mean_spec = CandidateTrajectorySpec(count=8, reducer="mean")
    mean, _ = reduce_candidates(candidates, mean_spec, get_reducer("mean"), None, reduce_before_denormalize=True,
                                context=context)
    assert torch.equal(mean, candidates.mean(0))


def test_the_score_is_the_weighted_mean_of_squared_distances_so_one_seam_outweighs_a_small_offset():
    # docs/closed-loop.md ("The BID score"): squared, unlike the reference BID's unsquared L2 norm per action.
    previous = torch.zeros(H, 2)
    reference = ContinuityReference(previous.clone(), torch.tensor([1.0, 1.0, 1.0, 1.0, 0, 0, 0, 0]))
    offset = torch.zeros(H, 2)
    offset[:4] = 0.1 / 2**0.5  # 0.1 away on every overlapping action: a smooth, slightly shifted plan
    seam = torch.zeros(H, 2)
    seam[2] = 0.3 / 2**0.5  # exact, but for one action 0.3 away: a jump there and back
    candidates = torch.stack([seam, offset])
    scores = coherence_scores(candidates, reference)
    assert scores.tolist() == pytest.approx([0.3**2 / 4, 0.1**2])
    assert torch.equal(get_reducer("backward_coherence")(candidates, reference), offset)
    # The reference BID's unsquared mean would have kept the jump (0.075 < 0.1).
    unsquared = [float(c[:4].norm(dim=-1).mean()) for c in candidates]
    assert unsquared == pytest.approx([0.075, 0.1])
