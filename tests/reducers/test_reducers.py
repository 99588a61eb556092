"""Reducers: declared properties hold, NaN is refused, multimodal sets are not averaged into a midpoint."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trajectory_ensemble_node._rotations import rotation_to_6d
from trajectory_ensemble_node.errors import (
    InvalidSpecError,
    NonFiniteCandidatesError,
    ReducerLayoutError,
    UnknownReducerError,
)
from trajectory_ensemble_node.reducers import (
    MODE_DISTANCE_THRESHOLD,
    Reducer,
    available_reducers,
    get_reducer,
    mode_clusters,
    mode_reduce,
    register_reducer,
)

BUILTINS = ("mean", "median", "medoid", "mode", "pose_gripper", "trimmed_mean")


def random_rotations(*shape: int, seed: int = 0) -> torch.Tensor:
    """Uniformly random rotation matrices [*shape, 3, 3] (QR of Gaussian matrices, sign- and det-fixed)."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(*shape, 3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    flip = torch.ones(*shape, 3, dtype=torch.float64)
    flip[..., 2] = torch.sign(torch.linalg.det(q))
    return q * flip.unsqueeze(-2)


def pose_candidates(n: int, horizon: int, arms: int, seed: int = 0) -> torch.Tensor:
    """Valid pose+gripper candidates [n, horizon, 10 * arms]: random translation, rotation and 0/1 gripper."""
    g = torch.Generator().manual_seed(seed)
    translation = torch.randn(n, horizon, arms, 3, generator=g, dtype=torch.float64)
    rotation = rotation_to_6d(random_rotations(n, horizon, arms, seed=seed))
    gripper = torch.randint(0, 2, (n, horizon, arms, 1), generator=g).to(torch.float64)
    return torch.cat((translation, rotation, gripper), dim=-1).reshape(n, horizon, 10 * arms)


def rotation_from_columns(r6: torch.Tensor) -> torch.Tensor:
    """Matrix whose first two columns are r6 (assumed orthonormal) and third their cross product."""
    c1, c2 = r6[..., 0:3], r6[..., 3:6]
    return torch.stack((c1, c2, torch.linalg.cross(c1, c2, dim=-1)), dim=-1)


# --- registry and declared properties -----------------------------------------------------------------------------


def test_builtins_are_registered_with_declared_properties():
    assert set(BUILTINS) <= set(available_reducers())
    assert "none" not in available_reducers()
    spaces = {name: get_reducer(name).space for name in BUILTINS}
    assert spaces == {
        "mean": "any",
        "median": "any",
        "trimmed_mean": "any",
        "medoid": "normalized",
        "mode": "normalized",
        "pose_gripper": "raw",
    }
    assert [name for name in BUILTINS if get_reducer(name).streaming] == ["mean"]
    assert get_reducer("pose_gripper").block_width == 10


def test_unknown_reducer_lists_known_names():
    with pytest.raises(UnknownReducerError, match="'maen'") as info:
        get_reducer("maen")
    assert all(name in str(info.value) for name in BUILTINS)


def test_register_refuses_duplicates_unless_replace():
    custom = Reducer("first_candidate_test", lambda c: c[0], streaming=False, space="any")
    try:
        assert register_reducer(custom) is custom
        assert get_reducer("first_candidate_test") is custom
        with pytest.raises(InvalidSpecError, match="already registered"):
            register_reducer(Reducer("first_candidate_test", lambda c: c[-1], streaming=False, space="any"))
        replacement = Reducer("first_candidate_test", lambda c: c[-1], streaming=False, space="any")
        register_reducer(replacement, replace=True)
        assert get_reducer("first_candidate_test") is replacement
    finally:
        from trajectory_ensemble_node.reducers import registry

        registry._REGISTRY.pop("first_candidate_test", None)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(name="none", space="any"),
        dict(name="", space="any"),
        dict(name="x", space="latent"),
        dict(name="x", space="any", block_width=0),
    ],
)
def test_reducer_declaration_is_validated(kwargs):
    with pytest.raises(InvalidSpecError):
        Reducer(fn=lambda c: c[0], streaming=False, **kwargs)


def test_check_layout_rejects_width_7_for_pose_gripper():
    reducer = get_reducer("pose_gripper")
    with pytest.raises(ReducerLayoutError, match=r"multiple of 10.*width 7"):
        reducer.check_layout(7)
    with pytest.raises(ReducerLayoutError, match="width 7"):
        reducer(torch.zeros(3, 2, 7))
    reducer.check_layout(10)
    reducer.check_layout(20)


def test_check_space():
    get_reducer("mean").check_space("raw")
    get_reducer("mean").check_space("normalized")
    get_reducer("pose_gripper").check_space("raw")
    with pytest.raises(ReducerLayoutError, match="'raw' space.*'normalized'"):
        get_reducer("pose_gripper").check_space("normalized")
    with pytest.raises(ReducerLayoutError):
        get_reducer("medoid").check_space("raw")


@pytest.mark.parametrize(
    "bad", [torch.zeros(4, 3), torch.zeros(0, 2, 10), torch.zeros(2, 3, 10, dtype=torch.int64), [[0.0]]]
)
def test_invalid_input_is_refused(bad):
    with pytest.raises(InvalidSpecError):
        get_reducer("mean")(bad)


@pytest.mark.parametrize("name", BUILTINS)
def test_output_shape_and_dtype(name):
    candidates = pose_candidates(5, 4, 2).to(torch.bfloat16)
    out = get_reducer(name)(candidates)
    assert out.shape == (4, 20) and out.dtype == torch.bfloat16


# --- non-finite candidates ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("name", BUILTINS)
def test_non_finite_candidates_are_refused(name, value):
    candidates = pose_candidates(5, 3, 1)
    candidates[1, 0, 2] = value
    candidates[3, 2, 9] = value
    with pytest.raises(NonFiniteCandidatesError, match=r"2 non-finite.*\[1, 3\]"):
        get_reducer(name)(candidates)


# --- affine equivariance --------------------------------------------------------------------------------------------

scales = st.floats(0.1, 10.0).flatmap(lambda m: st.sampled_from([m, -m]))


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["mean", "median", "trimmed_mean"]),
    n=st.integers(1, 12),
    horizon=st.integers(1, 4),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_any_space_reducers_commute_with_per_channel_affine_maps(name, n, horizon, seed, data):
    width = data.draw(st.integers(1, 5))
    a = torch.tensor(data.draw(st.lists(scales, min_size=width, max_size=width)), dtype=torch.float64)
    b = torch.tensor(data.draw(st.lists(st.floats(-10, 10), min_size=width, max_size=width)), dtype=torch.float64)
    x = torch.randn(n, horizon, width, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    # Duplicated values make ties in the sort, which must not matter either.
    x[-1] = x[0]
    reduce = get_reducer(name)
    torch.testing.assert_close(reduce(a * x + b), a * reduce(x) + b, rtol=1e-9, atol=1e-9)


def test_median_of_even_count_is_mean_of_middle_values():
    x = torch.tensor([3.0, 1.0, 10.0, 2.0]).reshape(4, 1, 1)
    assert get_reducer("median")(x).item() == 2.5


def test_trimmed_mean_drops_floor_fifth_from_each_end():
    five = torch.tensor([0.0, 1.0, 2.0, 3.0, 100.0]).reshape(5, 1, 1)
    assert get_reducer("trimmed_mean")(five).item() == 2.0
    four = torch.tensor([0.0, 1.0, 2.0, 100.0]).reshape(4, 1, 1)
    assert get_reducer("trimmed_mean")(four).item() == get_reducer("mean")(four).item()
    ten = torch.arange(10.0).reshape(10, 1, 1)
    ten[9] = 1000.0
    assert get_reducer("trimmed_mean")(ten).item() == pytest.approx(sum(range(2, 8)) / 6)


# --- medoid --------------------------------------------------------------------------------------------------------


def test_medoid_returns_an_input_candidate():
    candidates = torch.randn(7, 4, 3, generator=torch.Generator().manual_seed(3))
    out = get_reducer("medoid")(candidates)
    assert any(torch.equal(out, c) for c in candidates)


def test_medoid_picks_the_central_candidate_not_the_mean():
    candidates = torch.tensor([[0.0], [1.0], [1.5], [9.0]]).reshape(4, 1, 1)
    assert get_reducer("medoid")(candidates).item() == 1.0


def test_medoid_tie_goes_to_lowest_index():
    two = torch.tensor([[5.0, 1.0], [2.0, 3.0]]).reshape(2, 1, 2)
    assert torch.equal(get_reducer("medoid")(two), two[0])
    # Four corners of a square: every total is equal, in float arithmetic summed in different orders.
    square = torch.tensor([[0.1, 0.1], [0.1, 0.7], [0.7, 0.7], [0.7, 0.1]]).reshape(4, 1, 2)
    assert torch.equal(get_reducer("medoid")(square), square[0])


# --- mode ----------------------------------------------------------------------------------------------------------


def bimodal(sizes: tuple[int, int], first_mode_at: float, seed: int = 0) -> torch.Tensor:
    """Two tight clusters in [H=4, D=3]; the first `sizes[0]` candidates sit near `first_mode_at`, the rest near its
    negative."""
    g = torch.Generator().manual_seed(seed)
    a = first_mode_at + 0.01 * torch.randn(sizes[0], 4, 3, generator=g)
    b = -first_mode_at + 0.01 * torch.randn(sizes[1], 4, 3, generator=g)
    return torch.cat((a, b))


def test_mode_picks_the_larger_mode_not_the_midpoint():
    # Candidate 0 is in the smaller cluster, so size, not id, must decide.
    candidates = bimodal((4, 5), first_mode_at=-0.6)
    out = get_reducer("mode")(candidates)
    larger = candidates[4:].mean(dim=0)
    torch.testing.assert_close(out, larger)
    assert (out - candidates.mean(dim=0)).abs().min() > 0.4
    assert mode_clusters(candidates) == ((0, 1, 2, 3), (4, 5, 6, 7, 8))


def test_mode_tie_goes_to_the_cluster_with_the_lowest_id():
    candidates = bimodal((4, 4), first_mode_at=0.6)[[4, 0, 5, 1, 6, 2, 7, 3]]
    out = get_reducer("mode")(candidates)
    torch.testing.assert_close(out, candidates[[0, 2, 4, 6]].mean(dim=0))
    assert torch.equal(get_reducer("mode")(candidates), out)


def test_mode_single_and_identical_candidates():
    one = torch.randn(1, 4, 3)
    assert torch.equal(get_reducer("mode")(one), one[0])
    same = one.expand(6, 4, 3).clone()
    assert mode_clusters(same) == ((0, 1, 2, 3, 4, 5),)
    torch.testing.assert_close(get_reducer("mode")(same), one[0])


def test_mode_at_a_fixed_threshold_with_all_far_apart_returns_candidate_zero():
    candidates = torch.arange(4.0).reshape(4, 1, 1) * (2 * MODE_DISTANCE_THRESHOLD)
    assert mode_clusters(candidates, MODE_DISTANCE_THRESHOLD) == ((0,), (1,), (2,), (3,))
    assert torch.equal(mode_reduce(candidates, MODE_DISTANCE_THRESHOLD), candidates[0])


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, True, "0.2"])
def test_mode_threshold_is_validated(bad):
    with pytest.raises(InvalidSpecError, match=repr(bad).replace("(", r"\(")[:4]):
        mode_clusters(torch.zeros(2, 1, 1), threshold=bad)


# --- pose_gripper --------------------------------------------------------------------------------------------------


def assert_valid_rotations(out: torch.Tensor, arms: int) -> None:
    r6 = out.reshape(*out.shape[:-1], arms, 10)[..., 3:9].to(torch.float64)
    rotation = rotation_from_columns(r6)
    eye = torch.eye(3, dtype=torch.float64).expand_as(rotation)
    torch.testing.assert_close(rotation.transpose(-1, -2) @ rotation, eye, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.linalg.det(rotation), torch.ones(rotation.shape[:-2], dtype=torch.float64),
                               atol=1e-5, rtol=0)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), arms=st.sampled_from([1, 2]), seed=st.integers(0, 2**31), noisy=st.booleans())
def test_pose_gripper_returns_valid_rotations(n, arms, seed, noisy):
    candidates = pose_candidates(n, 3, arms, seed).to(torch.float32)
    if noisy:  # raw network output: 6D columns neither unit nor orthogonal
        candidates = candidates + torch.randn(candidates.shape, generator=torch.Generator().manual_seed(seed))
    assert_valid_rotations(get_reducer("pose_gripper")(candidates), arms)


@pytest.mark.parametrize("arms", [1, 2])
def test_pose_gripper_of_equal_candidates_is_that_candidate(arms):
    one = pose_candidates(1, 5, arms, seed=7).to(torch.float32)
    out = get_reducer("pose_gripper")(one.expand(4, -1, -1).clone())
    torch.testing.assert_close(out, one[0], atol=1e-5, rtol=0)


def test_pose_gripper_rotation_mean_of_symmetric_pair_is_between_them():
    angle = 0.4

    def about_z(theta: float) -> torch.Tensor:
        c, s = math.cos(theta), math.sin(theta)
        return torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)

    poses = torch.zeros(2, 1, 10, dtype=torch.float64)
    poses[:, 0, 3:9] = rotation_to_6d(torch.stack((about_z(angle), about_z(-angle))))
    out = get_reducer("pose_gripper")(poses)
    torch.testing.assert_close(out[0, 3:9], rotation_to_6d(torch.eye(3, dtype=torch.float64)))


def test_pose_gripper_majority_vote_for_odd_n():
    candidates = pose_candidates(5, 2, 1)
    candidates[:, 0, 9] = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])
    candidates[:, 1, 9] = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    out = get_reducer("pose_gripper")(candidates)
    assert out[0, 9].item() == 1.0 and out[1, 9].item() == 0.0


def test_pose_gripper_even_tie_is_midpoint_and_translation_is_mean():
    candidates = pose_candidates(4, 1, 1)
    candidates[:, 0, 9] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    out = get_reducer("pose_gripper")(candidates)
    assert out[0, 9].item() == 0.5
    torch.testing.assert_close(out[0, 0:3], candidates[:, 0, 0:3].mean(dim=0))


def test_pose_gripper_two_arms_reduce_independently():
    candidates = pose_candidates(5, 3, 2, seed=11)
    both = get_reducer("pose_gripper")(candidates)
    for arm in range(2):
        alone = get_reducer("pose_gripper")(candidates[..., 10 * arm : 10 * arm + 10])
        torch.testing.assert_close(both[..., 10 * arm : 10 * arm + 10], alone)
    assert_valid_rotations(both, 2)
