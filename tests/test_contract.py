"""The candidate contract: invalid specs are rejected up front and no result can represent a partial group."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from trajectory_ensemble_node.contract import (
    DEFAULT_MAX_CANDIDATES,
    PUBLIC_OUTPUTS,
    CandidateGroup,
    CandidateTrajectorySpec,
    EnsembleResult,
)
from trajectory_ensemble_node.errors import (
    CandidateCountError,
    ErrorCode,
    InvalidSpecError,
    NonFiniteCandidatesError,
    PartialGroupError,
    UnknownReducerError,
)
from trajectory_ensemble_node.seeding import candidate_seeds

# --- CandidateTrajectorySpec ----------------------------------------------------------------------------------------


def test_spec_defaults_are_the_plain_path():
    spec = CandidateTrajectorySpec()
    assert (spec.count, spec.reducer, spec.return_candidates, spec.seed_policy) == (1, "none", False, "per_candidate")
    assert spec.max_count == DEFAULT_MAX_CANDIDATES == 64
    assert "max_count" not in repr(spec)


def test_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        CandidateTrajectorySpec().count = 2  # type: ignore[misc]


@pytest.mark.parametrize("count", [0, -1, 65, True, 2.0, "3", None])
def test_spec_rejects_bad_count_quoting_it(count):
    with pytest.raises(CandidateCountError) as info:
        CandidateTrajectorySpec(count=count, reducer="mean")
    assert repr(count) in str(info.value)
    assert info.value.code == ErrorCode.CANDIDATE_COUNT_ABOVE_MAX


def test_spec_honours_configured_maximum():
    assert CandidateTrajectorySpec(count=8, reducer="mean", max_count=8).count == 8
    with pytest.raises(CandidateCountError, match=r"candidate_count 9 is outside \[1, max_candidates=8\]"):
        CandidateTrajectorySpec(count=9, reducer="mean", max_count=8)
    with pytest.raises(InvalidSpecError, match="max_count.*0"):
        CandidateTrajectorySpec(max_count=0)


def test_reducer_none_requires_count_one():
    with pytest.raises(InvalidSpecError, match="'none' is only valid with count=1, got count=4") as info:
        CandidateTrajectorySpec(count=4)
    assert not isinstance(info.value, UnknownReducerError)
    assert "mean" in str(info.value)


def test_unknown_reducer_lists_known_names():
    with pytest.raises(UnknownReducerError, match="'average'") as info:
        CandidateTrajectorySpec(count=2, reducer="average")
    assert "median" in str(info.value) and "pose_gripper" in str(info.value)


def test_a_reducer_is_allowed_with_count_one():
    assert CandidateTrajectorySpec(count=1, reducer="mean").reducer == "mean"


@pytest.mark.parametrize(
    ("kwargs", "quoted"),
    [
        (dict(seed_policy="random"), "'random'"),
        (dict(return_candidates="yes"), "'yes'"),
        (dict(return_candidates=1), "1"),
    ],
)
def test_spec_rejects_bad_fields_quoting_them(kwargs, quoted):
    with pytest.raises(InvalidSpecError) as info:
        CandidateTrajectorySpec(count=2, reducer="mean", **kwargs)
    assert quoted in str(info.value)


# --- CandidateGroup -------------------------------------------------------------------------------------------------


def test_group_for_spec():
    group = CandidateGroup.for_spec("goal-1", CandidateTrajectorySpec(count=4, reducer="median"))
    assert group.candidate_ids == (0, 1, 2, 3) and group.size == 4 and group.public_output == "action"


def test_group_accepts_a_list_and_stores_a_tuple():
    assert CandidateGroup("r", [2, 5, 9]).candidate_ids == (2, 5, 9)


@pytest.mark.parametrize(
    ("kwargs", "quoted"),
    [
        (dict(request_id="", candidate_ids=(0,)), "''"),
        (dict(request_id=7, candidate_ids=(0,)), "7"),
        (dict(request_id="r", candidate_ids=()), "()"),
        (dict(request_id="r", candidate_ids=(0, -1)), "(0, -1)"),
        (dict(request_id="r", candidate_ids=(0, 2, 2)), "(0, 2, 2)"),
        (dict(request_id="r", candidate_ids=(1, 0)), "(1, 0)"),
        (dict(request_id="r", candidate_ids=(0, True)), "(0, True)"),
        (dict(request_id="r", candidate_ids=(0, 1.0)), "(0, 1.0)"),
        (dict(request_id="r", candidate_ids="01"), "'01'"),
        (dict(request_id="r", candidate_ids=(0,), public_output="video"), "'video'"),
    ],
)
def test_group_rejects_bad_fields_quoting_them(kwargs, quoted):
    with pytest.raises(InvalidSpecError) as info:
        CandidateGroup(**kwargs)
    assert quoted in str(info.value)


def test_only_actions_are_public_outputs():
    assert PUBLIC_OUTPUTS == ("action",)


# --- EnsembleResult -------------------------------------------------------------------------------------------------


def make(count=3, return_candidates=True, reducer="mean", **overrides):
    spec = CandidateTrajectorySpec(count=count, reducer=reducer, return_candidates=return_candidates)
    group = CandidateGroup.for_spec("goal-7", spec)
    candidates = torch.randn(count, 16, 10, generator=torch.Generator().manual_seed(0))
    fields = dict(
        group=group,
        spec=spec,
        action=candidates.mean(dim=0) if reducer != "none" else candidates[0].clone(),
        candidate_ids=group.candidate_ids,
        seeds=candidate_seeds(42, spec.count, spec.seed_policy),
        candidates=candidates,
    )
    fields.update(overrides)
    return EnsembleResult(**fields)


def test_complete_result_is_accepted():
    result = make(metrics={"reduce_ms": 0.2})
    assert result.base_seed == 42 == result.seeds[0]
    assert result.size == 3 and result.request_id == "goal-7"
    assert result.rollout is None and result.metrics == {"reduce_ms": 0.2}
    plain = make(count=1, reducer="none", return_candidates=False, candidates=None)
    assert plain.candidates is None


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(candidate_ids=(0, 1)), r"\(0, 1\) do not match"),
        (dict(candidate_ids=(0, 1, 2, 3)), "do not match"),
        (dict(candidate_ids=(0, 2, 1)), "do not match"),
        (dict(seeds=(42, 1)), "2 seed"),
        (dict(candidates=None), "no candidates"),
        (dict(candidates=torch.zeros(2, 16, 10)), r"\(2, 16, 10\)"),
        (dict(candidates=torch.zeros(3, 16, 9)), r"\(3, 16, 9\)"),
        (dict(candidates=torch.zeros(3, 160)), "160"),
        (dict(action=torch.zeros(1, 16, 10)), "floating tensor"),
        (dict(action=torch.zeros(16, 10, dtype=torch.int64)), "floating tensor"),
        (dict(base_seed=41), "base_seed 41"),
    ],
)
def test_partial_or_mismatched_groups_are_refused(overrides, match):
    with pytest.raises(PartialGroupError, match=match):
        make(**overrides)


def test_spec_and_group_sizes_must_agree():
    spec = CandidateTrajectorySpec(count=2, reducer="mean")
    group = CandidateGroup("r", (0, 1, 2))
    with pytest.raises(PartialGroupError, match="spec.count=2"):
        EnsembleResult(group, spec, torch.zeros(4, 2), (0, 1, 2), (1, 2, 3))


def test_plain_result_must_publish_its_candidate_untouched():
    with pytest.raises(PartialGroupError, match="equal candidate 0"):
        make(count=1, reducer="none", action=torch.zeros(16, 10))


@pytest.mark.parametrize("field", ["action", "candidates"])
def test_non_finite_results_are_refused(field):
    result = make()
    tensor = getattr(result, field).clone()
    tensor.view(-1)[5] = math.nan
    with pytest.raises(NonFiniteCandidatesError, match=field):
        make(**{field: tensor})


def test_bad_seed_in_result_is_refused():
    with pytest.raises(InvalidSpecError, match=r"seeds\[1\]"):
        make(seeds=(42, -1, 3))
