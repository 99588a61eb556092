"""``mode``'s relative rule (the majority mode's densest core): its answer follows the candidates' units, comes from
the majority mode at every scale, and the docstrings' test vectors hold; a fixed threshold is bound where a served
model asks for one (one scale: the largest cluster's mean)."""

from __future__ import annotations

import pytest
import torch

from trajectory_ensemble_node.errors import InvalidSpecError, UnknownReducerError
from trajectory_ensemble_node.normalization import ActionNormalizer
from trajectory_ensemble_node.reducers import (
    MODE_DISTANCE_THRESHOLD,
    configured_reducer,
    get_reducer,
    mode_clusters,
    mode_continuity_reduce,
    mode_core,
    mode_reduce,
    parse_variants,
    reduce_variants,
    relative_mode_threshold,
)

SCALES = (0.01, 0.1, 0.37, 1.0, 3.0, 25.0, 100.0)


def line(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).reshape(-1, 1, 1)


def two_modes(sizes: tuple[int, int], shape: tuple[int, int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two modes at +-0.6 with isotropic noise 0.01 inside each; returns the group and its majority mode."""
    g = torch.Generator().manual_seed(seed)
    a = 0.6 + 0.01 * torch.randn(sizes[0], *shape, generator=g, dtype=torch.float64)
    b = -0.6 + 0.01 * torch.randn(sizes[1], *shape, generator=g, dtype=torch.float64)
    return torch.cat((a, b)), (a if sizes[0] > sizes[1] else b)


# --- the docstrings' test vectors -------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "clusters", "answer"), [
    ((0, 1, 2, 3, 16), ((0, 1), (2, 3), (4,)), 0.0),
    ((0, 0.5, 1, 1.5, 8, 8.5, 9, 20), ((0, 1, 2, 3), (4, 5, 6), (7,)), 0.75),
    ((1, 5, 7, 11, 12, 13, 15, 18), ((0, 1, 2), (3, 4, 5, 6, 7)), 12.75),
    ((1, 1, 1), ((0, 1, 2),), 1.0),
    ((0, 1), ((0,), (1,)), 0.0),
    ((3, 5), ((0,), (1,)), 3.0),
    ((2, 2, 2), ((0, 1, 2),), 2.0),
    ((7,), ((0,),), 7.0),
])
def test_docstring_vectors(values, clusters, answer):
    group = line(*values)
    assert mode_clusters(group) == clusters
    assert mode_reduce(group).item() == answer
    assert get_reducer("mode")(group).item() == answer


def test_core_vectors():
    assert mode_core(line(1, 5, 7, 11, 12, 13, 15, 18), (3, 4, 5, 6, 7)) == (3, 4, 5, 6)
    assert mode_core(line(0, 1, 2, 3, 16), (0, 1)) == (0,)
    assert mode_core(line(2, 2, 2), (0, 1, 2)) == (0, 1, 2)
    assert mode_core(line(4, 9), (1,)) == (1,)


def test_a_fixed_threshold_is_one_scale_the_largest_clusters_mean():
    assert mode_reduce(line(0, 1, 2, 3, 16), 1.0).item() == 0.5
    assert mode_reduce(line(1, 5, 7, 11, 12, 13, 15, 18), 7.0).item() == pytest.approx(13.8)


def test_relative_threshold_vectors():
    assert relative_mode_threshold(line(0, 1, 2, 3, 16)) == 2.0  # k = 1: median nearest distance 1, times 2
    assert relative_mode_threshold(line(0, 0.5, 1, 1.5, 8, 8.5, 9, 20)) == 2.0  # k = 2: median second-nearest 1
    assert relative_mode_threshold(line(0, 5)) == 0.0  # two candidates carry no scale
    assert relative_mode_threshold(line(4, 4, 4, 4, 9)) == 0.0  # most have an identical twin


# --- units ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("n", [3, 5, 8, 10, 16])
def test_a_group_times_c_gives_its_answer_times_c(seed, n):
    g = torch.Generator().manual_seed(seed)
    # Mixed geometry: a few modes of different widths plus a uniform spread, smooth along the horizon like actions.
    centres = torch.randn(3, 8, 2, generator=g, dtype=torch.float64).cumsum(dim=1)
    members = torch.randint(0, 3, (n,), generator=g)
    widths = torch.rand(n, 1, 1, generator=g, dtype=torch.float64) * 0.5
    group = centres[members] + widths * torch.randn(n, 8, 2, generator=g, dtype=torch.float64)
    clusters, answer = mode_clusters(group), mode_reduce(group)
    for c in SCALES:
        assert mode_clusters(group * c) == clusters, f"scale {c}"
        torch.testing.assert_close(mode_reduce(group * c), answer * c, rtol=1e-9, atol=0)


def test_a_fixed_threshold_depends_on_the_units_and_the_relative_rule_does_not():
    group, majority = two_modes((5, 3), (8, 2), seed=0)
    answers = {c: mode_reduce(group * c, MODE_DISTANCE_THRESHOLD) / c for c in (0.01, 100.0)}
    # At 1/100 everything is within 0.2: the fixed cut averages the two modes; at 100 nothing is: candidate 0.
    torch.testing.assert_close(answers[0.01], group.mean(dim=0))
    torch.testing.assert_close(answers[100.0], group[0])
    for c in (0.01, 100.0):
        assert in_mode(mode_reduce(group * c) / c, majority)


# --- modes ------------------------------------------------------------------------------------------------------


def in_mode(out: torch.Tensor, mode: torch.Tensor) -> bool:
    """``out`` is the mean of some members of ``mode`` (tested against every subset's mean: modes are small)."""
    n = mode.shape[0]
    return any(torch.allclose(out, mode[[i for i in range(n) if bits >> i & 1]].mean(dim=0), rtol=1e-9, atol=0)
               for bits in range(1, 1 << n))


@pytest.mark.parametrize("shape", [(4, 3), (8, 2), (16, 7)])
@pytest.mark.parametrize("sizes", [(5, 3), (3, 5), (4, 5), (6, 2), (7, 1), (2, 6), (10, 6)])
def test_a_bimodal_group_gives_its_majority_mode_at_every_scale(shape, sizes):
    for seed in range(5):
        group, majority = two_modes(sizes, shape, seed)
        midpoint = (group[: sizes[0]].mean(dim=0) + group[sizes[0]:].mean(dim=0)) / 2
        answer = mode_reduce(group)
        assert in_mode(answer, majority)
        for c in SCALES:
            out = mode_reduce(group * c)
            torch.testing.assert_close(out, answer * c, rtol=1e-9, atol=0)
            assert (out - midpoint * c).abs().min() > 0.4 * c


def test_an_equal_split_goes_to_the_mode_holding_the_lowest_position():
    group, _ = two_modes((4, 4), (8, 2), seed=3)
    interleaved = group[[4, 0, 5, 1, 6, 2, 7, 3]]
    for c in SCALES:
        torch.testing.assert_close(mode_reduce(interleaved * c), interleaved[[0, 2, 4, 6]].mean(dim=0) * c)
    assert mode_clusters(interleaved) == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_one_two_and_identical_candidates():
    one = torch.randn(1, 4, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mode_reduce(one), one[0])
    two = torch.cat((one, one + 1e-6))
    assert torch.equal(mode_reduce(two), two[0])  # no scale to judge 1e-6 by: never their midpoint
    same = one.expand(6, 4, 3).clone()
    assert mode_clusters(same) == ((0, 1, 2, 3, 4, 5),)
    torch.testing.assert_close(mode_reduce(same), one[0])  # the mean of six equal values, up to rounding
    torch.testing.assert_close(mode_reduce(same[:2]), one[0])


@pytest.mark.parametrize("shape", [(8, 2), (16, 7)])
@pytest.mark.parametrize("n", [8, 16])
def test_a_featureless_cloud_gives_one_candidate_or_a_close_few_never_a_point_outside(shape, n):
    # Isotropic noise has no denser part: mode commits to a candidate (or a few that agree), as one sample does,
    # rather than averaging the cloud into a trajectory no candidate proposed.
    for seed in range(10):
        group = torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        majority = max(mode_clusters(group), key=len)
        assert len(majority) >= n // 2
        core = mode_core(group, majority)
        out = mode_reduce(group)
        torch.testing.assert_close(out, group[list(core)].mean(dim=0))
        totals = torch.cdist(group.flatten(1), group.flatten(1)).sum(dim=1)
        assert torch.cdist(out.flatten()[None], group.flatten(1)).sum() <= totals.max()


def test_a_wide_mode_gives_its_dense_core_not_the_mean_of_its_spread():
    # Trajectories along one path, at offsets spread like PushT's pushes: the mode 11..18 is wide, its core 11..15.
    path = torch.linspace(0.0, 1.0, 16, dtype=torch.float64).reshape(8, 2)
    offsets = torch.tensor([1, 5, 7, 11, 12, 13, 15, 18], dtype=torch.float64)
    group = offsets.reshape(-1, 1, 1) * 0.01 + path
    assert max(mode_clusters(group), key=len) == (3, 4, 5, 6, 7)
    assert mode_core(group, (3, 4, 5, 6, 7)) == (3, 4, 5, 6)
    torch.testing.assert_close(mode_reduce(group), group[3:7].mean(dim=0))
    assert not torch.allclose(mode_reduce(group), group[3:].mean(dim=0))


# --- a fixed threshold, served ----------------------------------------------------------------------------------


def test_configured_reducer_binds_a_fixed_threshold_into_mode_and_mode_continuity_only():
    group = torch.arange(4.0, dtype=torch.float64).reshape(4, 1, 1) * 0.4
    assert configured_reducer("mode") is get_reducer("mode")
    assert configured_reducer("mean", 0.3) is get_reducer("mean")
    fixed = configured_reducer("mode", MODE_DISTANCE_THRESHOLD)
    assert torch.equal(fixed(group), group[0])  # every pair 0.4 apart: singletons
    assert torch.equal(fixed(group), mode_reduce(group, MODE_DISTANCE_THRESHOLD))
    assert configured_reducer("mode", 0.5)(group).item() == pytest.approx(0.2)
    assert torch.equal(configured_reducer("mode_continuity", 0.2)(group), mode_continuity_reduce(group, None, 0.2))
    with pytest.raises(InvalidSpecError, match="-0.1"):
        configured_reducer("mode", -0.1)
    with pytest.raises(UnknownReducerError):
        configured_reducer("nope", 0.1)


def test_reduce_variants_applies_each_reducer_in_its_space():
    normalizer = ActionNormalizer.from_dict({"min": [0.0, -1.0], "max": [512.0, 1.0]}, "minmax", 2)
    group, majority = two_modes((5, 3), (8, 2), seed=1)
    variants = parse_variants("single,mean,mode,mode@0.2,medoid")
    assert [v.label for v in variants] == ["single", "mean", "mode", "mode@0.2", "medoid"]
    chunks = reduce_variants(group.float(), variants, normalizer)
    torch.testing.assert_close(chunks["single"], normalizer.denormalize(group.float())[0])
    torch.testing.assert_close(chunks["mode"], normalizer.denormalize(mode_reduce(group.float())))
    assert in_mode(mode_reduce(group), majority)
    torch.testing.assert_close(chunks["mean"], normalizer.denormalize(group.float().mean(dim=0)))
    assert set(reduce_variants(group.float(), variants)) == {v.label for v in variants}


@pytest.mark.parametrize(("text", "match"), [("mode@x", "'x'"), ("mean@0.1", "mean"), ("mode,mode", "repeat"),
                                             ("@0.1", "NAME")])
def test_parse_variants_refuses_bad_items(text, match):
    with pytest.raises(InvalidSpecError, match=match):
        parse_variants(text)
