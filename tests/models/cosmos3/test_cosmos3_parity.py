"""Batched candidates equal the unmodified upstream ``Cosmos3OmniPipeline`` called once per candidate seed."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from _cosmos3 import (
    CHUNK,
    FPS,
    PROMPT,
    STEPS,
    fresh_pipe,
    image,
    policy,
    reference_pipe,
    upstream_action,
    within_rule,
)
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    _EMBODIMENT_TO_RAW_ACTION_DIM,
    Cosmos3OmniPipeline,
    CosmosActionCondition,
)

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.errors import ReducerLayoutError, UnsupportedModeError
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, build_pipeline
from trajectory_ensemble_node.models.cosmos3.conditioning import encode_clips, encode_conditioning
from trajectory_ensemble_node.models.cosmos3.tiny import CONFIGS
from trajectory_ensemble_node.reducers import get_reducer

BASE_SEED = 1234


@pytest.fixture(scope="module")
def model() -> Cosmos3ActionModel:
    return Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8)


def run(model: Cosmos3ActionModel, count: int, guidance_scale: float, **kwargs):
    spec = CandidateTrajectorySpec(count=count, reducer="mean" if count > 1 else "none", return_candidates=True)
    defaults = dict(prompt=PROMPT, action=policy(), num_inference_steps=STEPS, fps=FPS, base_seed=BASE_SEED)
    defaults.update(kwargs)
    return model.generate(guidance_scale=guidance_scale, spec=spec, **defaults)


@pytest.mark.parametrize("guidance_scale", [1.0, 3.0], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize("count", [1, 3, 8])
def test_candidates_equal_sequential_upstream(model, count, guidance_scale):
    result = run(model, count, guidance_scale)

    assert result.candidates.shape == (count, CHUNK, 10)
    assert result.candidates.dtype == torch.float32 and result.candidates.device.type == "cpu"
    assert result.action.shape == (CHUNK, 10)
    assert result.seeds[0] == BASE_SEED and len(set(result.seeds)) == count
    assert result.candidate_ids == tuple(range(count))
    for i, seed in enumerate(result.seeds):
        reference = upstream_action(seed, guidance_scale=guidance_scale)
        if count == 1:
            assert torch.equal(result.candidates[i], reference), "count=1 must be bitwise equal to upstream"
        else:
            assert within_rule(result.candidates[i], reference), f"candidate {i} differs from upstream"
    # The reduced action is the reducer applied to the returned candidates, nothing else.
    expected = result.candidates[0] if count == 1 else get_reducer("mean")(result.candidates)
    assert torch.equal(result.action, expected)


@pytest.mark.parametrize("guidance_scale", [1.0, 3.0], ids=["no-cfg", "cfg"])
def test_one_physical_forward_per_step_independent_of_n(guidance_scale):
    fused = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8, cfg_mode="fused")
    for count in (1, 3, 8):
        result = run(fused, count, guidance_scale)
        assert result.metrics["physical_forwards"] == STEPS
        assert result.metrics["candidate_count"] == count
        assert result.metrics["fallback_reason"] is None
        for i, seed in enumerate(result.seeds):
            assert within_rule(result.candidates[i], upstream_action(seed, guidance_scale=guidance_scale))


def test_auto_cfg_keeps_a_lone_candidate_on_the_upstream_row_counts(model):
    # count=1 with CFG runs cond and uncond as two forwards: the exact upstream computation, hence bitwise.
    result = run(model, 1, 3.0)
    assert result.metrics["physical_forwards"] == 2 * STEPS
    assert run(model, 3, 3.0).metrics["physical_forwards"] == STEPS
    separate = Cosmos3ActionModel(fresh_pipe(), cfg_mode="separate")
    assert run(separate, 3, 3.0).metrics["physical_forwards"] == 2 * STEPS


def test_candidate_order_is_stable_across_runs_and_group_sizes(model):
    eight = run(model, 8, 1.0)
    again = run(model, 8, 1.0)
    three = run(model, 3, 1.0)
    assert torch.equal(eight.candidates, again.candidates)
    # Seeds depend only on (base_seed, i), so a smaller group is a prefix of a larger one.
    assert three.seeds == eight.seeds[:3]
    assert torch.equal(three.candidates, eight.candidates[:3])


@pytest.mark.parametrize(
    "domain", sorted(set(_EMBODIMENT_TO_RAW_ACTION_DIM), key=lambda d: _EMBODIMENT_TO_RAW_ACTION_DIM[d])
)
def test_every_embodiment_width(model, domain):
    width = _EMBODIMENT_TO_RAW_ACTION_DIM[domain]
    if domain not in ("pusht", "av", "droid_lerobot", "robomind-franka-dual", "agibotworld", "hand_pose"):
        pytest.skip("one domain per distinct width is enough")
    action = policy(domain=domain)
    result = run(model, 2, 1.0, action=action)
    assert result.candidates.shape == (2, CHUNK, width)
    for i, seed in enumerate(result.seeds):
        assert within_rule(result.candidates[i], upstream_action(seed, guidance_scale=1.0, action=action,
                                                                 key=(domain,)))


def test_inverse_dynamics_matches_upstream(model):
    frames = [policy(seed=s).image for s in (5, 6, 7)]
    action = CosmosActionCondition(
        mode="inverse_dynamics", chunk_size=CHUNK, domain_name="bridge_orig_lerobot", resolution_tier=256, video=frames
    )
    for count, guidance in ((1, 1.0), (3, 3.0)):
        result = run(model, count, guidance, action=action)
        for i, seed in enumerate(result.seeds):
            reference = upstream_action(seed, guidance_scale=guidance, action=action, key=("inverse",))
            if count == 1:
                assert torch.equal(result.candidates[i], reference)
            else:
                assert within_rule(result.candidates[i], reference)


def test_forward_dynamics_is_refused_before_any_work(model):
    action = CosmosActionCondition(
        mode="forward_dynamics", chunk_size=CHUNK, domain_name="droid_lerobot", resolution_tier=256,
        image=policy().image, raw_actions=torch.zeros(CHUNK, 10),
    )
    with pytest.raises(UnsupportedModeError, match="forward_dynamics"):
        model.submit(prompt=PROMPT, action=action, num_inference_steps=STEPS, guidance_scale=1.0, fps=FPS,
                     spec=CandidateTrajectorySpec(count=2, reducer="mean"))
    assert model.engine.num_queued == 0


def test_reducer_invalid_for_layout_is_rejected_when_the_group_is_built(model):
    with pytest.raises(ReducerLayoutError):
        model.make_request(prompt=PROMPT, action=policy(domain="pusht"), num_inference_steps=STEPS,
                           spec=CandidateTrajectorySpec(count=3, reducer="pose_gripper"))
    # The same reducer is valid on a 9D pose + gripper layout.
    model.make_request(prompt=PROMPT, action=policy(domain="droid_lerobot"), num_inference_steps=STEPS,
                       spec=CandidateTrajectorySpec(count=3, reducer="pose_gripper"))


def test_encoding_only_the_conditioning_frame_is_bit_identical():
    pipe = reference_pipe()
    kwargs = dict(prompt=PROMPT, negative_prompt=None, action=policy(chunk=16), fps=FPS, guidance_scale=1.0,
                  device=torch.device("cpu"))
    short = encode_conditioning(pipe, encode_only_used_frames=True, **kwargs)
    full = encode_conditioning(pipe, encode_only_used_frames=False, **kwargs)
    assert torch.equal(short.x0_vision[:, :, :1], full.x0_vision[:, :, :1])
    assert short.x0_vision.shape == full.x0_vision.shape


def test_clips_encoded_together_are_each_clip_encoded_as_served():
    # Training encodes its examples many to a VAE call through the function a served group encodes its one clip
    # with; batching may move the last bits only.
    pipe = reference_pipe()
    served = [
        encode_conditioning(pipe, prompt=PROMPT, negative_prompt=None, action=policy(seed=seed), fps=FPS,
                            guidance_scale=1.0, device=torch.device("cpu")).x0_vision[:, :, :1]
        for seed in (1, 2, 3)
    ]
    alone = encode_clips(pipe, [[image(1)]], 256, 1)
    together = encode_clips(pipe, [[image(seed)] for seed in (1, 2, 3)], 256, 1)
    assert torch.equal(alone, served[0])
    assert together.shape == (3, *served[0].shape[1:])
    for k, latent in enumerate(served):
        assert torch.allclose(together[k : k + 1], latent, rtol=0, atol=1e-5), f"clip {k}"
    with pytest.raises(ValueError, match="share one frame size"):
        encode_clips(pipe, [[image(1)], [image(2, height=96, width=96)]], 256, 1)
    with pytest.raises(ValueError, match="at least one clip"):
        encode_clips(pipe, [], 256, 1)


def test_serving_scheduler_is_never_mutated(model):
    before = copy.deepcopy(model.pipe.scheduler.__dict__.get("timesteps"))
    state_before = (model.pipe.scheduler.num_inference_steps, model.pipe.scheduler._step_index)
    run(model, 3, 3.0, num_inference_steps=5)
    assert (model.pipe.scheduler.num_inference_steps, model.pipe.scheduler._step_index) == state_before
    after = model.pipe.scheduler.__dict__.get("timesteps")
    assert (before is None and after is None) or torch.equal(before, after)


def test_upstream_pipeline_on_the_wrapped_transformer_is_unchanged(model):
    # The fan-out processor must behave exactly like the stock one outside our forwards.
    out = model.pipe(prompt=PROMPT, action=policy(), num_inference_steps=STEPS, guidance_scale=3.0, fps=FPS,
                     generator=torch.Generator().manual_seed(7), output_type="latent", enable_safety_check=False)
    assert torch.equal(out.action[0], upstream_action(7, guidance_scale=3.0))


def test_save_pretrained_then_from_pretrained_local_dir(tmp_path):
    source = fresh_pipe()
    source.save_pretrained(tmp_path / "pipe", safe_serialization=True)
    assert list((tmp_path / "pipe" / "transformer").glob("*.safetensors"))
    loaded = Cosmos3OmniPipeline.from_pretrained(tmp_path / "pipe", enable_safety_checker=False)
    loaded.set_progress_bar_config(disable=True)
    model = Cosmos3ActionModel(loaded)
    result = run(model, 3, 3.0)
    for i, seed in enumerate(result.seeds):
        assert within_rule(result.candidates[i], upstream_action(seed, guidance_scale=3.0))
    assert torch.equal(run(model, 1, 3.0).candidates[0], upstream_action(BASE_SEED, guidance_scale=3.0))


@pytest.mark.parametrize("row_block_rows", [None, 1], ids=["whole-layers", "row-blocks"])
def test_generation_pathway_with_its_own_text_key_norm_matches_upstream(row_block_rows):
    # The variant where the generation pathway norms the text keys itself (``k_norm_und_for_gen``), so the keys it
    # attends to differ from the text pathway's own: the default configs never build it.
    config = dataclasses.replace(CONFIGS["tiny"], extra={"qk_norm_for_text": False, "use_und_k_norm_for_gen": True})
    reference = build_pipeline(config, seed=0)
    assert reference.transformer.layers[0].self_attn.k_norm_und_for_gen is not None
    model = Cosmos3ActionModel(build_pipeline(config, seed=0), max_batch_candidates=8, row_block_rows=row_block_rows)
    lone = run(model, 1, 3.0)
    assert torch.equal(lone.candidates[0], upstream_action(BASE_SEED, guidance_scale=3.0, pipe=reference))
    group = run(model, 3, 3.0)
    for i, seed in enumerate(group.seeds):
        assert within_rule(group.candidates[i], upstream_action(seed, guidance_scale=3.0, pipe=reference))


def test_prefix_cache_is_bitwise_neutral_and_drops_the_prefix_after_step_one():
    cached = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8, prefix_cache=True)
    uncached = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8, prefix_cache=False)
    text_tokens: list[int] = []
    hook = cached.pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: text_tokens.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    try:
        with_cache = run(cached, 3, 3.0)
    finally:
        hook.remove()
    without_cache = run(uncached, 3, 3.0)

    assert torch.equal(with_cache.candidates, without_cache.candidates)
    # One fused CFG forward per step: the cond and uncond prefixes are in the first one only.
    assert len(text_tokens) == STEPS
    assert text_tokens[0] > 0 and text_tokens[1:] == [0] * (STEPS - 1)
    assert len(cached.adapter.prefix_cache) == 0, "a finished group must not leave prefixes cached"


def test_later_groups_reuse_a_retained_prefix_whatever_shares_their_forward_and_stay_bitwise():
    model = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8)  # cfg auto: N=1 separate, N>1 fused
    cache = model.adapter.prefix_cache
    text_tokens: list[int] = []
    hook = model.pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: text_tokens.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    try:
        first = run(model, 1, 3.0)
        assert cache.adopted == 0 and cache.retained == 2  # cond alone, uncond alone
        assert sum(t > 0 for t in text_tokens) == 2
        text_tokens.clear()
        again = run(model, 1, 3.0, base_seed=BASE_SEED + 1)
        assert cache.adopted == 2 and text_tokens == [0] * (2 * STEPS), "the same instruction ran its text again"
        # Fused N=3 puts cond and uncond in one forward; each prefix was computed alone, so both are adopted...
        text_tokens.clear()
        fused = run(model, 3, 3.0)
        assert cache.adopted == 4 and text_tokens == [0] * STEPS
        # ...and a different instruction runs its own text; the uncond branch (the negative prompt) is the same.
        text_tokens.clear()
        other = run(model, 1, 3.0, prompt=PROMPT + " slowly")
        assert cache.adopted == 5 and sum(t > 0 for t in text_tokens) == 1
    finally:
        hook.remove()
    assert torch.equal(first.candidates[0], upstream_action(BASE_SEED, guidance_scale=3.0))
    assert torch.equal(again.candidates[0], upstream_action(BASE_SEED + 1, guidance_scale=3.0))
    # Without a cache the fused group computes both prefixes in its first forward: the same bits as adopting them.
    uncached = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8, prefix_cache=False)
    assert torch.equal(fused.candidates, run(uncached, 3, 3.0).candidates)
    assert torch.equal(other.candidates, run(uncached, 1, 3.0, prompt=PROMPT + " slowly").candidates)
    assert len(cache) == 0, "finished groups must not stay in the per-group cache"
    model.adapter.bump_weights_version()
    assert cache.retained == 0, "new weights make retained prefixes stale"
