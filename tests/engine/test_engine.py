"""The group scheduler around the real Cosmos 3 adapter: co-batching, microbatches, fallback, cancel, failure, retry."""

from __future__ import annotations

import threading

import pytest
import torch
from _cosmos3 import FPS, PROMPT, STEPS, candidate_spec, fresh_pipe, policy, upstream_action, within_rule

from trajectory_ensemble_node.engine import completion as scheduler_module  # reduce_candidates is called there
from trajectory_ensemble_node.errors import (
    AbortReason,
    EngineShutdownError,
    ErrorCode,
    GroupCanceledError,
    GroupFailedError,
    GroupPreemptedError,
    InvalidSpecError,
    TooFewValidCandidatesError,
)
from trajectory_ensemble_node.metrics import GROUP_METRIC_KEYS
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel


def request_kwargs(count: int, guidance: float = 1.0, *, seed: int = 99, prompt: str = PROMPT, image_seed: int = 1,
                   **extra):
    spec = candidate_spec(count)
    kwargs = dict(prompt=prompt, action=policy(seed=image_seed), num_inference_steps=STEPS, guidance_scale=guidance,
                  fps=FPS, spec=spec, base_seed=seed)
    kwargs.update(extra)
    return kwargs


@pytest.fixture(scope="module")
def pipe():
    return fresh_pipe()


@pytest.fixture
def reduce_spy(monkeypatch):
    calls: list[int] = []
    real = scheduler_module.reduce_candidates

    def spy(candidates, *args, **kwargs):
        calls.append(candidates.shape[0])
        return real(candidates, *args, **kwargs)

    monkeypatch.setattr(scheduler_module, "reduce_candidates", spy)
    return calls


def test_co_batched_groups_equal_each_group_alone(pipe):
    model = Cosmos3ActionModel(pipe, max_batch_candidates=8)
    first = request_kwargs(3, 3.0, seed=11)
    second = request_kwargs(2, 1.0, seed=22, prompt="open the drawer slowly", image_seed=2)
    alone = [model.generate(**first), model.generate(**second)]

    handles = [model.submit(**first), model.submit(**second)]
    model.run_until_idle()
    together = [h.result() for h in handles]

    for solo, shared in zip(alone, together):
        assert shared.candidate_ids == solo.candidate_ids and shared.seeds == solo.seeds
        for i in range(solo.candidates.shape[0]):
            assert within_rule(shared.candidates[i], solo.candidates[i])
        assert shared.metrics["co_batched_groups_max"] == 2
        assert shared.metrics["physical_forwards"] == STEPS


def test_co_batched_groups_adopt_the_instruction_an_earlier_group_computed(pipe):
    # K clients sending the same instruction at once: after the first group, no co-batched forward runs its text.
    model = Cosmos3ActionModel(pipe, max_batch_candidates=8)
    cache = model.adapter.prefix_cache
    model.generate(**request_kwargs(1, seed=1))
    text_tokens: list[int] = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: text_tokens.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    adopted = cache.adopted
    kwargs = [request_kwargs(1, seed=10 + i, image_seed=2 + i) for i in range(3)]
    try:
        handles = [model.submit(**k) for k in kwargs]
        model.run_until_idle()
    finally:
        hook.remove()
    together = [h.result() for h in handles]
    assert cache.adopted - adopted == 3 and text_tokens == [0] * STEPS
    for shared, k in zip(together, kwargs):
        assert shared.metrics["co_batched_groups_max"] == 3
        assert within_rule(shared.candidates[0], model.generate(**k).candidates[0])


def test_groups_that_join_mid_denoise_share_forwards_at_different_steps(pipe):
    model = Cosmos3ActionModel(pipe, max_batch_candidates=8)
    early = model.submit(**request_kwargs(2, seed=5, num_inference_steps=6))
    model.engine._iterate()  # admit + first step of the early group
    model.engine._iterate()
    late = model.submit(**request_kwargs(2, seed=6, prompt="wipe the table", image_seed=3))
    model.run_until_idle()
    late_result, early_result = late.result(), early.result()
    assert late_result.metrics["co_batched_groups_max"] == 2
    alone = model.generate(**request_kwargs(2, seed=6, prompt="wipe the table", image_seed=3))
    for i in range(2):
        assert within_rule(late_result.candidates[i], alone.candidates[i])
    assert early_result.metrics["physical_forwards"] == 6


def test_microbatched_group_equals_one_batch(pipe):
    one_batch = Cosmos3ActionModel(pipe, max_batch_candidates=8).generate(**request_kwargs(8, 3.0))
    micro = Cosmos3ActionModel(pipe, max_batch_candidates=3).generate(**request_kwargs(8, 3.0))
    assert micro.candidate_ids == one_batch.candidate_ids and micro.seeds == one_batch.seeds
    for i in range(8):
        assert within_rule(micro.candidates[i], one_batch.candidates[i])
    assert micro.metrics["microbatches"] == 3
    assert micro.metrics["physical_forwards"] == 3 * STEPS
    assert micro.metrics["fallback_reason"] is None


def test_sequential_fallback_runs_the_plain_path_per_candidate(pipe):
    model = Cosmos3ActionModel(pipe, max_batch_candidates=2, oversize_policy="sequential")
    result = model.generate(**request_kwargs(3, 1.0, seed=1234))
    assert "exceed max_batch_candidates=2" in result.metrics["fallback_reason"]
    for i, seed in enumerate(result.seeds):
        # Each candidate took the count=1 path, so it is bitwise the upstream call for its seed.
        assert torch.equal(result.candidates[i], upstream_action(seed, guidance_scale=1.0))


def test_reject_policy_refuses_oversize_groups_before_any_work(pipe):
    model = Cosmos3ActionModel(pipe, max_batch_candidates=2, oversize_policy="reject")
    with pytest.raises(InvalidSpecError, match="max_batch_candidates=2"):
        model.submit(**request_kwargs(3))
    assert model.engine.num_queued == 0


def test_retry_after_injected_failure_gives_the_clean_candidates(pipe):
    clean = Cosmos3ActionModel(pipe).generate(**request_kwargs(3, 3.0))
    model = Cosmos3ActionModel(pipe, max_retries=1)
    real_forward = model.adapter.forward
    calls = {"n": 0}

    def flaky(slices, should_abort=None):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected slice failure")
        return real_forward(slices, should_abort)

    model.adapter.forward = flaky
    retried = model.generate(**request_kwargs(3, 3.0))
    assert retried.metrics["retries"] == 1
    assert torch.equal(retried.candidates, clean.candidates)
    assert retried.metrics["physical_forwards"] == STEPS


def test_failed_slice_fails_the_whole_group_without_reducing(pipe, reduce_spy):
    model = Cosmos3ActionModel(pipe, max_batch_candidates=2)  # 5 candidates -> 3 microbatches per step
    real_forward = model.adapter.forward

    def failing(slices, should_abort=None):
        if any(s.start == 2 for s in slices):
            raise RuntimeError("slice 2-4 exploded")
        return real_forward(slices, should_abort)

    model.adapter.forward = failing
    handle = model.submit(**request_kwargs(5))
    model.run_until_idle()
    with pytest.raises(GroupFailedError, match="slice 2-4 exploded") as info:
        handle.result()
    assert info.value.code == ErrorCode.ENGINE_FAILURE
    assert reduce_spy == []
    # The engine keeps serving.
    model.adapter.forward = real_forward
    assert model.generate(**request_kwargs(2)).action.shape == (8, 10)


def test_cancel_stops_within_one_step_and_returns_no_aggregate(pipe, reduce_spy):
    model = Cosmos3ActionModel(pipe)
    steps_seen: list[int] = []
    holder: dict = {}

    def on_progress(event):
        if event.stage == "denoising":
            steps_seen.append(event.step)
            if event.step == 1:
                holder["handle"].cancel()

    holder["handle"] = model.submit(**request_kwargs(4, num_inference_steps=8, on_progress=on_progress))
    model.run_until_idle()
    with pytest.raises(GroupCanceledError) as info:
        holder["handle"].result()
    assert info.value.code == ErrorCode.CANCELED and info.value.reason == AbortReason.CANCELED
    assert steps_seen == [1]
    assert reduce_spy == []


def test_preempted_group_names_the_preempting_goal(pipe, reduce_spy):
    model = Cosmos3ActionModel(pipe)
    handle = model.submit(**request_kwargs(2))
    handle.cancel(AbortReason.PREEMPTED, "preempted by goal-b")
    model.run_until_idle()
    with pytest.raises(GroupPreemptedError, match="preempted by goal-b") as info:
        handle.result()
    assert info.value.code == ErrorCode.PREEMPTED
    assert reduce_spy == []


def test_non_finite_candidates_are_never_reduced(pipe, reduce_spy):
    # Issue 17: a NaN candidate is dropped and the survivors are reduced; it never reaches the reducer.
    model = Cosmos3ActionModel(pipe)
    real_finish = model.adapter.finish

    def poisoned(state):
        out = real_finish(state)
        out.candidates[1, 0, 0] = float("nan")
        return out

    model.adapter.finish = poisoned
    handle = model.submit(**request_kwargs(3))
    model.run_until_idle()
    result = handle.result()
    assert reduce_spy == [2]
    assert result.candidate_valid == (True, False, True)
    assert torch.isfinite(result.action).all()


def test_all_non_finite_candidates_fail_the_group(pipe, reduce_spy):
    model = Cosmos3ActionModel(pipe)
    real_finish = model.adapter.finish

    def poisoned(state):
        out = real_finish(state)
        out.candidates[:, 0, 0] = float("inf")
        return out

    model.adapter.finish = poisoned
    handle = model.submit(**request_kwargs(3))
    model.run_until_idle()
    with pytest.raises(TooFewValidCandidatesError, match=r"0 of 3 candidates valid") as info:
        handle.result()
    assert info.value.code == ErrorCode.TOO_FEW_VALID_CANDIDATES
    assert reduce_spy == []


def test_metrics_carry_every_declared_key(pipe):
    result = Cosmos3ActionModel(pipe).generate(**request_kwargs(2))
    assert set(GROUP_METRIC_KEYS) <= set(result.metrics)
    assert result.metrics["candidate_count"] == 2
    assert result.metrics["peak_memory_bytes"] > 0
    for key in ("encode_ms", "denoise_ms", "action_postprocess_ms", "reduce_ms", "total_ms"):
        assert result.metrics[key] >= 0.0
    assert result.metrics["total_ms"] >= result.metrics["denoise_ms"]


def test_background_engine_serves_concurrent_callers_and_stops_cleanly(pipe):
    model = Cosmos3ActionModel(pipe)
    model.engine.start()
    try:
        results: dict[int, object] = {}

        def call(seed: int) -> None:
            results[seed] = model.generate(**request_kwargs(2, seed=seed))

        threads = [threading.Thread(target=call, args=(seed,)) for seed in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(results) == [1, 2]
        assert results[1].seeds[0] == 1 and results[2].seeds[0] == 2
    finally:
        pending = model.submit(**request_kwargs(2, num_inference_steps=50))
        model.engine.stop()
    with pytest.raises(EngineShutdownError):
        pending.result(timeout=10)


def test_work_between_groups_waits_for_running_groups(pipe):
    model = Cosmos3ActionModel(pipe)
    order: list[str] = []
    running = model.submit(**request_kwargs(2, on_progress=lambda e: order.append(f"{e.stage}:{e.step}")))
    model.engine._iterate()  # admit and run the first step
    future = model.engine.run_between_groups(lambda: order.append("update") or 7)
    queued = model.submit(**request_kwargs(2, seed=3))
    model.run_until_idle()
    assert future.result() == 7
    assert running.result() and queued.result()
    # The update ran after the running group's last step and before the queued group was admitted.
    assert order.index("update") > order.index(f"denoising:{STEPS}")


def test_serving_builds_no_autograd_graph(pipe):
    # Parameters require grad (as after from_pretrained); the engine must still run without recording a graph.
    assert any(p.requires_grad for p in pipe.transformer.parameters())
    model = Cosmos3ActionModel(pipe)
    seen: list[bool] = []
    real_step = model.adapter.step

    def spying_step(state):
        seen.append(state.vision.requires_grad or state.action.requires_grad or torch.is_grad_enabled())
        return real_step(state)

    model.adapter.step = spying_step
    result = model.generate(**request_kwargs(2))
    assert seen and not any(seen)
    assert not result.action.requires_grad and not result.candidates.requires_grad


def test_a_cancel_during_a_forward_stops_it_within_a_layer(pipe, reduce_spy):
    model = Cosmos3ActionModel(pipe)
    layers_run: list[int] = []
    holder: dict = {}
    processor = model.adapter.processor
    # Every layer checks for an abort before its work, whole (processor call) or in row blocks (layers.py).
    real_check = type(processor).check_abort

    def counting_check(self):
        layers_run.append(1)
        if len(layers_run) == 1:  # first layer of the first forward: the client cancels now
            holder["handle"].cancel()
        return real_check(self)

    type(processor).check_abort = counting_check
    try:
        holder["handle"] = model.submit(**request_kwargs(3))
        model.run_until_idle()
    finally:
        type(processor).check_abort = real_check
    with pytest.raises(GroupCanceledError):
        holder["handle"].result()
    # The processor checks before computing each layer, so the forward stopped right there: not one full forward
    # (the tiny transformer has 2 layers), no step, no reduce.
    assert len(layers_run) == 1
    assert reduce_spy == []


def test_a_cancel_mid_forward_does_not_abort_other_groups_in_it(pipe):
    model = Cosmos3ActionModel(pipe, max_batch_candidates=8)
    alone = model.generate(**request_kwargs(2, seed=8))
    canceled_after: list[int] = []
    holder: dict = {}

    def on_progress(event):
        if event.stage == "denoising" and event.step == 1:
            holder["victim"].cancel()
            canceled_after.append(event.step)

    holder["victim"] = model.submit(**request_kwargs(2, seed=9, on_progress=on_progress))
    survivor = model.submit(**request_kwargs(2, seed=8))
    model.run_until_idle()
    with pytest.raises(GroupCanceledError):
        holder["victim"].result()
    result = survivor.result()
    assert canceled_after == [1]
    for i in range(2):
        assert within_rule(result.candidates[i], alone.candidates[i])
