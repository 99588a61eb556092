"""RL rollouts from candidate groups: Euler grid, SDE log-probs, capture files, co-batching with serving."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _cosmos3 import CHUNK, FPS, PROMPT, candidate_spec, fresh_pipe, policy, within_rule
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from safetensors.torch import load_file

from trajectory_ensemble_node.errors import InvalidSpecError
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, RolloutError, RolloutSpec
from trajectory_ensemble_node.models.cosmos3.rollout import build_rollout_scheduler

STEPS = 4


def kwargs(count: int, guidance: float = 1.0, *, seed: int = 77, **extra):
    spec = candidate_spec(count)
    base = dict(prompt=PROMPT, action=policy(), num_inference_steps=STEPS, guidance_scale=guidance, fps=FPS,
                spec=spec, base_seed=seed)
    base.update(extra)
    return base


@pytest.fixture(scope="module")
def model():
    return Cosmos3ActionModel(fresh_pipe())


def test_rollout_returns_per_step_log_probs_and_writes_a_self_describing_file(model, tmp_path):
    result = model.generate(**kwargs(3, 3.0, rollout=RolloutSpec(noise_level=0.7, output_dir=tmp_path)))
    rollout = result.rollout
    assert rollout.action_log_probs.shape == (3, STEPS) and rollout.action_log_probs.dtype == torch.float32
    assert torch.isfinite(rollout.action_log_probs).all() and (rollout.action_log_probs != 0).all()
    assert rollout.vision_log_probs is not None and rollout.vision_log_probs.shape == (3, STEPS)
    assert rollout.path.is_file() and rollout.path.suffix == ".safetensors"
    manifest = json.loads(rollout.manifest_path.read_text())
    assert manifest["weights_version"] == model.weights_version
    assert manifest["seeds"] == list(result.seeds) and manifest["candidate_ids"] == [0, 1, 2]
    assert manifest["noise_level"] == 0.7 and manifest["sde_steps"] == list(range(STEPS))
    tensors = load_file(str(rollout.path))
    assert tensors["cond_input_ids"].numel() > 0 and tensors["uncond_input_ids"].numel() > 0
    assert tensors["condition_vision_latents"].shape[2] == tensors["vision_condition_mask"].shape[0]
    # The final latent of the record is the returned candidate (padding channels dropped).
    final_action = tensors["action_latents"][:, -1, :, :10]
    assert torch.equal(final_action, result.candidates)


def test_same_seeds_reproduce_candidates_and_log_probs_bit_for_bit(model):
    first = model.generate(**kwargs(3, 3.0, rollout=RolloutSpec(noise_level=0.9)))
    second = model.generate(**kwargs(3, 3.0, rollout=RolloutSpec(noise_level=0.9)))
    assert torch.equal(first.candidates, second.candidates)
    assert torch.equal(first.rollout.action_log_probs, second.rollout.action_log_probs)
    assert torch.equal(first.rollout.vision_log_probs, second.rollout.vision_log_probs)
    other = model.generate(**kwargs(3, 3.0, seed=78, rollout=RolloutSpec(noise_level=0.9)))
    assert not torch.equal(first.candidates, other.candidates)


def _recompute(tensors: dict[str, torch.Tensor], manifest: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Rebuild every SDE transition's Gaussian from the file alone (written independently of the engine code)."""
    eta = manifest["noise_level"]
    sigmas = tensors["sigmas"].double()
    points = tensors["latent_points"].tolist()
    captured = tensors["captured_steps"].tolist()
    one = 1 - 1e-4  # a sigma this close to 1 counts as 1 (grids often start at 1 - 1e-6)
    below_one = sigmas[(sigmas < one) & (sigmas > 0)].max().item()
    vision_noisy = (tensors["vision_condition_mask"] == 0)  # [T, 1, 1]
    action_noisy = (tensors["action_condition_mask"] == 0) & (
        torch.arange(tensors["action_latents"].shape[-1]) < manifest["raw_action_dim"]
    )
    steps = manifest["num_inference_steps"]
    count = tensors["action_latents"].shape[0]
    out = {"vision": torch.zeros(count, steps, dtype=torch.float64), "action": torch.zeros(count, steps,
                                                                                           dtype=torch.float64)}
    for step in manifest["sde_steps"]:
        sigma, sigma_next = sigmas[step].item(), sigmas[step + 1].item()
        dt = sigma_next - sigma
        s_for_std = sigma if sigma < one else below_one
        std_t = eta * math.sqrt(s_for_std / (1 - s_for_std))
        s = std_t * math.sqrt(-dt)
        for name, noisy in (("vision", vision_noisy), ("action", action_noisy)):
            x = tensors[f"{name}_latents"][:, points.index(step)].double()
            x_next = tensors[f"{name}_latents"][:, points.index(step + 1)].double()
            v = tensors[f"{name}_velocity"][:, captured.index(step)].double()
            mu = x * (1 + std_t**2 * dt / (2 * sigma)) + v * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
            density = -((x_next - mu) ** 2) / (2 * s**2) - math.log(s) - 0.5 * math.log(2 * math.pi)
            mask = noisy.expand_as(x).double()
            out[name][:, step] = (density * mask).flatten(1).sum(1) / mask.flatten(1).sum(1)
    return out["action"], out["vision"]


def test_independent_recomputation_from_the_saved_file_reproduces_every_log_prob(model, tmp_path):
    spec = RolloutSpec(noise_level=0.8, sde_steps=(0, 2, 3), output_dir=tmp_path)
    result = model.generate(**kwargs(4, 3.0, rollout=spec))
    tensors = load_file(str(result.rollout.path))
    manifest = json.loads(result.rollout.manifest_path.read_text())
    assert manifest["sde_steps"] == [0, 2, 3]
    action_lp, vision_lp = _recompute(tensors, manifest)
    assert torch.allclose(action_lp.float(), tensors["action_log_probs"], atol=1e-4, rtol=0)
    assert torch.allclose(vision_lp.float(), tensors["vision_log_probs"], atol=1e-4, rtol=0)
    # ODE steps carry log-prob 0 and move deterministically.
    assert (tensors["action_log_probs"][:, 1] == 0).all()


def test_eta_zero_equals_a_serving_run_on_euler_with_the_same_grid(tmp_path):
    pipe = fresh_pipe()
    model = Cosmos3ActionModel(pipe)
    result = model.generate(**kwargs(3, 1.0, rollout=RolloutSpec(noise_level=0.0, flow_shift=3.0)))
    grid = build_rollout_scheduler(pipe.scheduler, STEPS, torch.device("cpu"), flow_shift=3.0).sigmas[:-1].tolist()
    assert (result.rollout.action_log_probs == 0).all()

    class FixedGridEuler(FlowMatchEulerDiscreteScheduler):
        def set_timesteps(self, num_inference_steps=None, device=None, **_):
            super().set_timesteps(sigmas=grid, device=device)

    reference = fresh_pipe()
    reference.scheduler = FixedGridEuler(shift=1.0)
    for i, seed in enumerate(result.seeds):
        out = reference(prompt=PROMPT, action=policy(), num_inference_steps=STEPS, guidance_scale=1.0, fps=FPS,
                        generator=torch.Generator().manual_seed(seed), output_type="latent",
                        enable_safety_check=False).action[0]
        assert within_rule(result.candidates[i], out)


def test_rollout_grids_inherit_serving_or_rebuild_from_an_explicit_shift():
    pipe = fresh_pipe()
    inherited = build_rollout_scheduler(pipe.scheduler, 6, torch.device("cpu"), flow_shift=None)
    serving = type(pipe.scheduler).from_config(pipe.scheduler.config)
    serving.set_timesteps(6)
    assert torch.equal(inherited.sigmas[:-1], serving.sigmas[:-1].float())
    assert inherited.sigmas[-1] == 0
    explicit = build_rollout_scheduler(pipe.scheduler, 6, torch.device("cpu"), flow_shift=5.0)
    u = torch.linspace(1, 1 / 1000, 6, dtype=torch.float64)
    assert torch.allclose(explicit.sigmas[:-1].double(), 5 * u / (1 + 4 * u), atol=1e-7)
    assert pipe.scheduler.timesteps is None or pipe.scheduler.num_inference_steps is None


def test_rollout_co_batched_with_serving_leaves_serving_results_unchanged(model):
    serving_alone = model.generate(**kwargs(3, 3.0, seed=5))
    scheduler_state = dict(model.pipe.scheduler.__dict__)
    serving = model.submit(**kwargs(3, 3.0, seed=5))
    rollout = model.submit(**kwargs(2, 1.0, seed=6, prompt="push the block left",
                                    rollout=RolloutSpec(noise_level=0.5)))
    model.run_until_idle()
    together, rolled = serving.result(), rollout.result()
    assert together.metrics["co_batched_groups_max"] == 2 and rolled.rollout is not None
    assert together.seeds == serving_alone.seeds and together.candidate_ids == serving_alone.candidate_ids
    for i in range(3):
        assert within_rule(together.candidates[i], serving_alone.candidates[i])
    assert model.pipe.scheduler.__dict__.keys() == scheduler_state.keys()
    assert model.pipe.scheduler.num_inference_steps == scheduler_state["num_inference_steps"]


def test_inverse_dynamics_rollout_has_no_vision_log_prob(model):
    frames = [policy(seed=s).image for s in (5, 6)]
    action = CosmosActionCondition(mode="inverse_dynamics", chunk_size=CHUNK, domain_name="fractal",
                                   resolution_tier=256, video=frames)
    result = model.generate(**kwargs(2, 1.0, action=action, rollout=RolloutSpec(noise_level=0.5)))
    assert result.rollout.vision_log_probs is None  # every vision token is conditioning: no density to report
    assert torch.isfinite(result.rollout.action_log_probs).all()


def test_invalid_rollouts_are_refused_with_named_errors(model):
    with pytest.raises(InvalidSpecError, match="noise_level"):
        RolloutSpec(noise_level=-0.1)
    with pytest.raises(InvalidSpecError, match="num_inference_steps"):
        model.make_request(**kwargs(2, rollout=RolloutSpec(sde_steps=(STEPS,))))
    sequential = Cosmos3ActionModel(model.pipe, max_batch_candidates=2, oversize_policy="sequential")
    handle = sequential.submit(**kwargs(3, rollout=RolloutSpec()))
    sequential.run_until_idle()
    with pytest.raises(RolloutError, match="sequential fallback"):
        handle.result()
