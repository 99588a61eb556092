"""Issue 17 in the engine, on the tiny real model: candidate screening, limits, uncertainty metrics, deadlines."""

from __future__ import annotations

import pytest
import torch
from _cosmos3 import FPS, PROMPT, policy

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine import StepCosts
from trajectory_ensemble_node.errors import (
    DeadlineUnmeetableError,
    ErrorCode,
    LimitsFileError,
    TooFewValidCandidatesError,
)
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, build_pipeline
from trajectory_ensemble_node.reducers import get_reducer
from trajectory_ensemble_node.safety import ActionLimits, ChannelLimits

WIDTH = 10  # droid_lerobot raw action width


def kwargs(count: int = 4, *, steps: int = 3, seed: int = 7, reducer: str = "mean", **extra):
    spec = CandidateTrajectorySpec(count=count, reducer=reducer if count > 1 else "none", return_candidates=True)
    out = dict(prompt=PROMPT, action=policy(), num_inference_steps=steps, guidance_scale=1.0, fps=FPS, spec=spec,
               base_seed=seed)
    out.update(extra)
    return out


@pytest.fixture(scope="module")
def pipe():
    return build_pipeline("tiny", seed=0)


@pytest.fixture(scope="module")
def plain(pipe):
    """Candidates of the default request on a model with no limits, no threshold, no deadline."""
    return Cosmos3ActionModel(pipe).generate(**kwargs())


def limits_from(candidates: torch.Tensor, **per_channel) -> ActionLimits:
    return ActionLimits(tuple(ChannelLimits(name=f"j{i}", **per_channel) for i in range(candidates.shape[-1])))


def test_default_result_reports_all_valid_and_uncertainty(plain):
    metrics = plain.metrics
    assert plain.candidate_valid == (True,) * 4
    assert metrics["valid_candidates"] == 4 and metrics["dropped_candidates"] == 0
    assert metrics["steps_used"] == metrics["steps_fitted"] == metrics["steps_planned"] == 3
    assert metrics["uncertainty_modes"] >= 1 and 0 < metrics["uncertainty_mode_share"] <= 1
    assert metrics["uncertainty_score"] > 0 and metrics["uncertainty_spread"] >= metrics["uncertainty_score"] * 0.5
    assert "uncertain" not in metrics  # no threshold set


def test_velocity_limit_drops_exactly_the_candidates_a_direct_computation_flags(pipe, plain):
    dt = 1.0 / FPS
    speed = ((plain.candidates[:, 1:] - plain.candidates[:, :-1]).abs() / dt).amax(dim=(1, 2))
    # A bound between the candidates' own peak speeds: some pass, some fail, on purpose.
    bound = float(speed.sort().values[1:3].mean())
    expected = (speed <= bound).tolist()
    model = Cosmos3ActionModel(pipe, limits=limits_from(plain.candidates, max_velocity=bound))
    result = model.generate(**kwargs())
    assert result.candidate_valid == tuple(expected)
    assert result.metrics["dropped_max_velocity"] == expected.count(False)
    assert result.metrics["valid_candidates"] == expected.count(True)
    survivors = plain.candidates[torch.tensor(expected)]
    assert torch.allclose(result.action, survivors.mean(0), atol=1e-5)
    dropped = [v for v in result.verdicts if not v.valid]
    assert all(v.reasons == ("max_velocity",) and "units/s" in v.details[0] for v in dropped)


def test_too_few_survivors_fail_with_the_new_code_and_no_result(pipe, plain):
    top = float(plain.candidates.max())
    model = Cosmos3ActionModel(pipe, limits=limits_from(plain.candidates, max=top - 1e-3), min_valid_candidates=4)
    with pytest.raises(TooFewValidCandidatesError, match=r"min_valid_candidates=4.*max: j\d+ step \d+") as info:
        model.generate(**kwargs())
    assert info.value.code == ErrorCode.TOO_FEW_VALID_CANDIDATES == 80


def test_clamp_policy_clamps_positions_and_says_so(pipe, plain):
    low, high = float(plain.candidates.min()) + 0.05, float(plain.candidates.max()) - 0.05
    model = Cosmos3ActionModel(pipe, limits=limits_from(plain.candidates, min=low, max=high), position_policy="clamp")
    result = model.generate(**kwargs())
    assert result.candidate_valid == (True,) * 4
    assert result.metrics["clamped_candidates"] > 0
    assert float(result.candidates.min()) >= low - 1e-6 and float(result.candidates.max()) <= high + 1e-6
    assert float(result.action.min()) >= low - 1e-6 and float(result.action.max()) <= high + 1e-6


def test_start_jump_uses_the_current_state(pipe, plain):
    first = plain.candidates[:, 0]  # [N, D]
    state = first[0].clone()
    jump = (first - state).abs().amax(dim=1)
    bound = float(jump[1:].min()) / 2 + 1e-6  # candidate 0 starts exactly at the state; the others jump farther
    model = Cosmos3ActionModel(pipe, limits=limits_from(plain.candidates, max_start_jump=bound))
    result = model.generate(**kwargs(current_state=state))
    assert result.candidate_valid == tuple((jump <= bound).tolist())
    assert result.candidate_valid[0]


def test_limits_of_the_wrong_width_are_refused_before_model_work(pipe):
    model = Cosmos3ActionModel(pipe, limits=ActionLimits((ChannelLimits(max=1.0),) * 3))
    with pytest.raises(LimitsFileError, match="3 channel"):
        model.make_request(**kwargs())


def test_threshold_marks_uncertain_results(pipe, plain):
    score = plain.metrics["uncertainty_score"]
    low = Cosmos3ActionModel(pipe, uncertainty_threshold=score / 2).generate(**kwargs())
    high = Cosmos3ActionModel(pipe, uncertainty_threshold=score * 2).generate(**kwargs())
    assert low.metrics["uncertain"] is True and high.metrics["uncertain"] is False
    assert torch.equal(low.action, plain.action)


def test_mode_uncertainty_counts_the_modes_of_the_reduced_candidates(pipe, plain):
    result = Cosmos3ActionModel(pipe).generate(**kwargs(reducer="mode"))
    clusters = get_reducer("mode")  # same clustering as the metric
    assert clusters.name == "mode"
    from trajectory_ensemble_node.reducers import mode_clusters

    groups = mode_clusters(plain.candidates)
    assert result.metrics["uncertainty_modes"] == len(groups)
    assert result.metrics["uncertainty_mode_share"] == max(map(len, groups)) / 4


# --- deadlines ------------------------------------------------------------------------------------------------------


def test_no_deadline_and_zero_deadline_are_bit_identical(pipe, plain):
    zero = Cosmos3ActionModel(pipe).generate(**kwargs(deadline_s=0))
    assert torch.equal(zero.candidates, plain.candidates) and torch.equal(zero.action, plain.action)
    assert "deadline_ms" not in zero.metrics


def test_generous_deadline_changes_nothing_but_the_metrics(pipe, plain):
    result = Cosmos3ActionModel(pipe).generate(**kwargs(deadline_s=3600.0))
    assert torch.equal(result.candidates, plain.candidates)
    assert result.metrics["steps_used"] == result.metrics["steps_fitted"] == 3
    assert result.metrics["deadline_met"] is True


def test_deadline_plans_fewer_steps_from_measured_step_time(pipe):
    model = Cosmos3ActionModel(pipe)
    # As if each step had been measured at 100 s: a 250 s deadline fits 2 of the 6 steps asked for (the real steps
    # take well under a second, so the run never falls behind this plan).
    model.engine.costs = StepCosts(encode_ms=0.0, step_ms=100_000.0, post_ms=0.0)
    result = model.generate(**kwargs(steps=6, deadline_s=250.0))
    assert result.metrics["steps_planned"] == 6
    assert result.metrics["steps_fitted"] == result.metrics["steps_used"] == 2
    # Re-scheduled, the group runs the very schedule of a 2-step request.
    two = Cosmos3ActionModel(pipe).generate(**kwargs(steps=2))
    assert torch.equal(result.candidates, two.candidates)


def test_falling_behind_finishes_early_from_the_clean_estimate(pipe):
    model = Cosmos3ActionModel(pipe)
    calls = []

    def behind_after_two_steps(now_ms, deadline_ms, own_step_ms):
        calls.append(now_ms)
        return len(calls) >= 2

    model.engine.costs.one_more_step_overruns = behind_after_two_steps
    result = model.generate(**kwargs(steps=6, deadline_s=3600.0))
    assert result.metrics["steps_planned"] == result.metrics["steps_fitted"] == 6 and result.metrics["steps_used"] == 2
    assert torch.isfinite(result.candidates).all()
    # The clean estimate is closer to the full 6-step answer than the 2-step latents of the 6-step schedule would be
    # to noise: it is a usable action, not a half-denoised latent.
    full = Cosmos3ActionModel(pipe).generate(**kwargs(steps=6))
    assert float((result.candidates - full.candidates).abs().mean()) < float(full.candidates.abs().mean()) + 1.0


def test_unmeetable_deadline_is_refused_up_front(pipe):
    model = Cosmos3ActionModel(pipe)
    model.engine.costs = StepCosts(encode_ms=50.0, step_ms=10_000.0, post_ms=5.0)
    with pytest.raises(DeadlineUnmeetableError, match="deadline 1.000 s is shorter") as info:
        model.submit(**kwargs(deadline_s=1.0))
    assert info.value.code == ErrorCode.DEADLINE_UNMEETABLE == 82
    assert model.engine.num_queued == 0


def test_provisional_costs_are_replaced_by_the_first_real_measurement_then_blended():
    # The node's start-up measurement (a stand-in frame at the full tier) must not linger in the running averages.
    costs = StepCosts(encode_ms=600.0, step_ms=400.0, post_ms=1.0, provisional={"encode_ms", "step_ms", "post_ms"})
    assert costs.minimum_ms() == pytest.approx(1.1 * 1001.0)
    costs.observe("encode_ms", 50.0)
    costs.observe("step_ms", 10.0)
    assert (costs.encode_ms, costs.step_ms, costs.post_ms) == (50.0, 10.0, 1.0) and costs.provisional == {"post_ms"}
    costs.observe("step_ms", 20.0)
    assert costs.step_ms == pytest.approx(0.7 * 10.0 + 0.3 * 20.0)
