"""The execution context: alignment by time, RTC weights, validation with named errors, the latency estimator."""

from __future__ import annotations

import math

import pytest
import torch

from trajectory_ensemble_node.engine.context import ExecutionContext, LatencyEstimator, overlap_weights
from trajectory_ensemble_node.errors import (
    DelayTooLongError,
    ErrorCode,
    ExecutionContextError,
    NegativeDelayError,
)

DT = 0.125


def previous(horizon: int = 8, width: int = 2) -> torch.Tensor:
    return torch.arange(horizon * width, dtype=torch.float32).reshape(horizon, width) / 10


def test_new_action_k_lines_up_with_old_action_k_plus_shift():
    old = previous()
    context = ExecutionContext(old, 10.0, DT, 2, 10.0 + 3 * DT)
    assert (context.shift, context.offset, context.overlap) == (3, 3.0, 5)
    target = context.target(8)
    assert torch.equal(target[:5], old[3:8]), "on-grid stamps read the previous actions exactly"
    assert torch.equal(target[5:], torch.zeros(3, 2))


def test_an_off_grid_stamp_reads_the_previous_chunk_interpolated_at_the_new_rows_times():
    old = previous()
    # 3.4 steps later: new row k is at the time of old position k + 3.4, between old rows k + 3 and k + 4.
    context = ExecutionContext(old, 10.0, DT, 2, 10.0 + 3.4 * DT)
    assert context.shift == 3 and context.offset == pytest.approx(3.4) and context.overlap == 4
    target = context.target(8)
    expected = old[3:7] + 0.4 * (old[4:8] - old[3:7])
    assert torch.allclose(target[:4], expected, atol=1e-6)
    assert torch.equal(target[4:], torch.zeros(4, 2)), "past the old chunk's last action there is nothing to continue"
    # The seam after the frozen actions is taken against the interpolated action at that time too.
    new = torch.zeros(8, 2)
    assert context.seam_jump(new) == pytest.approx(float(torch.linalg.vector_norm(expected[2])), abs=1e-6)


def test_float_noise_in_the_stamps_keeps_a_shift_on_the_grid():
    old = previous()
    context = ExecutionContext(old, 200.0, 0.1, 1, 200.2)  # (200.2 - 200.0) / 0.1 = 2.0000000000000284
    assert context.offset == 2.0 and torch.equal(context.target(8)[:6], old[2:8])


def test_weights_are_one_on_frozen_then_a_decaying_ramp_then_zero():
    context = ExecutionContext(previous(), 0.0, DT, 2, 2 * DT)  # shift 2, overlap 6
    w = context.weights(8)
    assert w.shape == (8,)
    assert torch.equal(w[:2], torch.ones(2))
    ramp = w[2:6]
    assert bool((ramp < 1).all()) and bool((ramp > 0).all())
    assert bool((ramp[1:] < ramp[:-1]).all()), "the ramp must decay"
    assert torch.equal(w[6:], torch.zeros(2))
    # RTC's exp schedule: u * expm1(u) / (e - 1) with u the linear ramp, which is below the linear ramp itself.
    linear = torch.tensor([1 - (k - 1) / 5 for k in range(2, 6)])
    assert bool((ramp <= linear).all())
    assert math.isclose(float(ramp[0]), float(linear[0] * math.expm1(linear[0]) / (math.e - 1)), rel_tol=1e-6)


def test_seam_jump_is_taken_at_the_first_free_action_against_the_old_action_at_that_time():
    old = previous()  # row j = (2j, 2j + 1) / 10
    new = torch.zeros(8, 2)
    new[2] = torch.tensor([1.0, 1.0])
    context = ExecutionContext(old, 0.0, DT, 2, 3 * DT)  # shift 3: new action 2 lines up with old action 5
    assert context.seam_jump(new) == pytest.approx(math.dist((1.0, 1.0), (1.0, 1.1)))
    assert context.report(new).as_metrics()["seam_jump"] == context.seam_jump(new)


def test_seam_jump_past_the_old_chunk_compares_with_its_last_action_where_a_controller_holds():
    old = previous()
    new = torch.zeros(8, 2)
    new[4] = torch.tensor([2.0, 2.0])
    # Shift 4, frozen 4: the frozen actions take up the whole overlap, and new action 4 is past old action 7.
    context = ExecutionContext(old, 0.0, DT, 4, 4 * DT)
    assert context.overlap == 4
    assert context.seam_jump(new) == pytest.approx(math.dist((2.0, 2.0), (1.4, 1.5)))


def test_zero_delay_has_no_frozen_action_but_still_a_ramp():
    w = overlap_weights(0, 4, 8)
    assert bool((w[:4] > 0).all()) and bool((w[:4] < 1).all())
    assert torch.equal(w[4:], torch.zeros(4))


@pytest.mark.parametrize(
    "kwargs, error, code, quoted",
    [
        (dict(frozen=-1), NegativeDelayError, ErrorCode.NEGATIVE_DELAY, "-1"),
        (dict(frozen=8), DelayTooLongError, ErrorCode.DELAY_TOO_LONG, "8"),
        (dict(frozen=3, stamp=6 * DT), DelayTooLongError, ErrorCode.DELAY_TOO_LONG, "3"),
        (dict(previous=torch.zeros(8)), ExecutionContextError, ErrorCode.INVALID_CONTEXT, "(8,)"),
        (dict(previous=torch.full((8, 2), math.nan)), ExecutionContextError, ErrorCode.INVALID_CONTEXT, "NaN"),
        (dict(dt=0.0), ExecutionContextError, ErrorCode.INVALID_CONTEXT, "0.0"),
        (dict(stamp=-1.0), ExecutionContextError, ErrorCode.INVALID_CONTEXT, "-1.0"),
        (dict(guidance="magic"), ExecutionContextError, ErrorCode.INVALID_CONTEXT, "magic"),
    ],
)
def test_bad_contexts_raise_named_errors_quoting_the_value(kwargs, error, code, quoted):
    fields = dict(previous=previous(), previous_stamp=0.0, dt=DT, frozen=2, stamp=2 * DT)
    fields.update(kwargs)
    with pytest.raises(error) as info:
        ExecutionContext(**fields)
    assert info.value.code == code
    assert quoted in str(info.value)


def test_check_refuses_a_wrong_width_and_a_delay_beyond_the_new_chunk():
    context = ExecutionContext(previous(8, 2), 0.0, DT, 4, 0.0)
    context.check(8, 2)
    with pytest.raises(ExecutionContextError, match="width 2"):
        context.check(8, 7)
    with pytest.raises(DelayTooLongError, match="4"):
        context.check(4, 2)


def test_context_is_frozen_and_owns_a_copy():
    old = previous()
    context = ExecutionContext(old, 0.0, DT, 1, 0.0)
    old.zero_()
    assert float(context.previous.abs().sum()) > 0
    with pytest.raises(AttributeError):
        context.frozen = 3  # type: ignore[misc]


def test_latency_estimator_rounds_up_to_whole_steps():
    estimator = LatencyEstimator(alpha=0.5, margin=0.0)
    assert estimator.frozen_steps(DT) == 0
    estimator.observe(2 * DT)
    assert estimator.frozen_steps(DT) == 2, "an exact multiple of dt must not round up"
    estimator.observe(3 * DT)  # mean 2.5 dt
    assert estimator.frozen_steps(DT) == 3
    with pytest.raises(NegativeDelayError):
        estimator.observe(-0.1)
    context = ExecutionContext.from_latency(previous(), 0.0, DT, 4 * DT, estimator)
    assert context.frozen == 3


def test_latency_estimator_margin_covers_spread():
    steady, jittery = LatencyEstimator(margin=1.0), LatencyEstimator(margin=1.0)
    for i in range(20):
        steady.observe(0.2)
        jittery.observe(0.2 + (0.1 if i % 2 else -0.1))
    assert steady.frozen_steps(0.1) == 2
    assert jittery.frozen_steps(0.1) > steady.frozen_steps(0.1)


def test_one_latency_from_a_jumped_clock_is_refused_and_does_not_move_the_frozen_count():
    estimator = LatencyEstimator()
    for value in (0.20, 0.22, 0.19, 0.21, 0.20):
        assert estimator.observe(value)
    before = estimator.estimate
    # A goal that straddled a forward jump of the simulated clock "took" 6e4 s (issue 36 saw 6.0e7 ms).
    assert not estimator.observe(6.0e4)
    assert estimator.estimate == before and estimator.rejected == 1
    assert estimator.frozen_steps(0.1) == 3
    # A slow group well inside the gate is folded in: the margin is there for it.
    assert estimator.observe(0.9) and estimator.estimate > before


def test_agreeing_outliers_in_a_row_are_the_new_latency_not_poison():
    estimator = LatencyEstimator(margin=0.0)
    for _ in range(8):
        estimator.observe(0.1)
    # The load went up tenfold for good (N = 32 instead of 4): the first two are refused, the third adopts the level.
    assert [estimator.observe(2.0) for _ in range(3)] == [False, False, True]
    assert estimator.estimate == pytest.approx(2.0) and estimator.rejected == 0
    # Outliers that disagree with each other are not a level: they stay refused.
    noisy = LatencyEstimator()
    for _ in range(8):
        noisy.observe(0.1)
    assert [noisy.observe(v) for v in (50.0, 3000.0, 9e5)] == [False, False, False]


def test_a_reset_forgets_every_latency_and_the_known_part_counts_without_an_estimate():
    estimator = LatencyEstimator(margin=0.0, initial=0.05)
    estimator.observe(1.0)
    estimator.reset()
    assert estimator.estimate == 0.05 and estimator.count == 0
    fresh = LatencyEstimator()
    # A frame two dt old when the goal is decided: two actions have gone already, estimate or not.
    assert fresh.frozen_steps(0.1, elapsed_s=0.2) == 2
    fresh.observe(0.15)
    assert fresh.frozen_steps(0.1, elapsed_s=0.2) == 4  # ceil(0.35 / 0.1)
