"""Flow-GRPO trainer: the recompute reproduces recorded log-probs, advantages are per group, the CLI writes its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _cosmos3 import FPS, PROMPT, fresh_pipe, policy

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, RolloutSpec, encode_conditioning, read_record
from trajectory_ensemble_node.toy import load_toy_pipeline, request_kwargs, task
from trajectory_ensemble_lab.toy.grpo import (
    GroupRecord,
    GrpoError,
    PolicyTrainer,
    group_advantages,
    recompute_log_probs,
    recorded_log_probs,
    score,
)



@pytest.fixture(autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _tiny_record(guidance: float, sde_steps, tmp_path) -> tuple[Cosmos3ActionModel, GroupRecord, object]:
    """A rollout group of the tiny random model, read back from its file, with the trainer's own conditioning."""
    model = Cosmos3ActionModel(fresh_pipe())
    action = policy()
    spec = CandidateTrajectorySpec(count=3, reducer="mean", return_candidates=True)
    result = model.generate(prompt=PROMPT, action=action, num_inference_steps=4, guidance_scale=guidance, fps=FPS,
                            spec=spec, base_seed=11,
                            rollout=RolloutSpec(noise_level=0.8, sde_steps=sde_steps, output_dir=tmp_path))
    tensors, manifest = read_record(result.rollout.path)
    trainer_pipe = fresh_pipe()  # the trainer's own copy: same weights, no serving state shared
    conditioning = encode_conditioning(trainer_pipe, prompt=PROMPT, negative_prompt=None, action=action, fps=FPS,
                                       guidance_scale=guidance, device=torch.device("cpu"))
    return model, GroupRecord(conditioning=conditioning, tensors=tensors, manifest=manifest), trainer_pipe


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_recomputed_log_probs_equal_the_recorded_ones_before_any_update(guidance, tmp_path):
    _, record, trainer_pipe = _tiny_record(guidance, (0, 2, 3), tmp_path)
    trainer = PolicyTrainer(trainer_pipe.transformer, lr=1e-4)
    assert record.steps == [0, 2, 3]
    assert trainer.ratio_deviation([record]) <= 1e-5
    # And with gradients: the same numbers, and a gradient that reaches the transformer's weights.
    log_probs, _, _ = recompute_log_probs(trainer_pipe.transformer, record)
    assert torch.allclose(log_probs.detach(), recorded_log_probs(record), atol=1e-5, rtol=0)
    log_probs.sum().backward()
    grads = [p.grad for p in trainer_pipe.transformer.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)


def test_an_update_moves_the_ratio_and_reaches_the_served_model(tmp_path):
    model, record, trainer_pipe = _tiny_record(1.0, None, tmp_path)
    trainer = PolicyTrainer(trainer_pipe.transformer, lr=1e-3)
    stats = trainer.step([record], np.array([[1.0, -1.0, 0.0]]))
    assert stats["ratio_max_abs_dev"] <= 1e-5  # measured before the update, inside the step
    assert trainer.ratio_deviation([record]) > 1e-4  # the update changed the policy
    report = model.update_weights(trainer.save(tmp_path / "w.safetensors"))
    assert report.weights_version == 1
    served = dict(model.pipe.transformer.named_parameters())
    for name, param in trainer_pipe.transformer.named_parameters():
        assert torch.equal(served[name].detach(), param.detach()), name


def test_a_record_from_another_prompt_is_refused(tmp_path):
    _, record, trainer_pipe = _tiny_record(1.0, None, tmp_path)
    other = encode_conditioning(trainer_pipe, prompt="open the drawer", negative_prompt=None, action=policy(),
                                fps=FPS, guidance_scale=1.0, device=torch.device("cpu"))
    with pytest.raises(GrpoError, match="other prompt tokens"):
        GroupRecord(conditioning=other, tensors=record.tensors, manifest=record.manifest)


def test_advantages_are_normalized_within_each_group():
    rewards = np.array([[1.0, -1.0, 1.0, -1.0], [0.50, 0.51, 0.49, 0.50]])
    adv = group_advantages(rewards, std_floor=0.1)
    assert np.allclose(adv[0], [1, -1, 1, -1])
    assert np.allclose(adv.mean(axis=1), 0)
    # A group that differs only by small final errors gets small advantages, not unit-scaled noise.
    assert np.abs(adv[1]).max() < 0.2
    with pytest.raises(GrpoError, match="std_floor"):
        group_advantages(rewards, std_floor=0.0)


def test_rewards_follow_the_task_metrics():
    scene = task.make_scene(task.HELDOUT_SEED_BASE + 3)
    good = task.expert_path(scene, 1)
    through = scene.robot + np.linspace(0.125, 1.0, task.HORIZON)[:, None] * (scene.target - scene.robot)
    metrics = score(scene, np.stack([good, through]))
    assert metrics["success"].tolist() == [True, False]
    assert metrics["collision"].tolist() == [False, True]
    assert metrics["reward"][0] > metrics["reward"][1]


def test_toy_rollouts_on_the_serving_grid_stay_in_range(tmp_path):
    # The toy's serving grid starts at sigma = 1 - 1e-6; the SDE step must treat it as sigma = 1 (not std_t ~ 700).
    model = Cosmos3ActionModel(load_toy_pipeline())
    spec = CandidateTrajectorySpec(count=4, reducer="mean", return_candidates=True)
    result = model.generate(**request_kwargs(task.render(task.make_scene(3))), spec=spec, base_seed=5,
                            rollout=RolloutSpec(noise_level=0.7))
    assert float(result.rollout.sigmas[0]) > 1 - 1e-4
    assert result.candidates.abs().max() < 3.0


@pytest.mark.slow
def test_train_grpo_cli_writes_the_json_and_pushes_weights(tmp_path):
    from trajectory_ensemble_node.cli import main

    out = tmp_path / "grpo.json"
    code = main(["train-grpo", "--iterations", "2", "--scenes", "1", "--group-size", "3", "--steps", "3",
                 "--heldout-scenes", "2", "--heldout-group", "2", "--lr", "1e-4",
                 "--work-dir", str(tmp_path / "work"), "--json", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    grpo = result["grpo"]
    assert result["date"] and result["commit"]
    assert grpo["initial_ratio_max_abs_dev"] <= 1e-5
    assert len(grpo["reward_by_iteration"]) == 2 and all(np.isfinite(grpo["reward_by_iteration"]))
    for when in ("before", "after"):
        entry = grpo["heldout"][when]
        assert 0 <= entry["candidate_collision_rate"] <= 1 and 0 <= entry["success_rate"] <= 1
        low, high = entry["candidate_collision_rate_ci95"]
        assert low <= entry["candidate_collision_rate"] <= high
        assert entry["candidates"] == 4
    # Every later rollout was drawn by the weights pushed after the previous iteration.
    assert [e["weights_version_sampled"] for e in grpo["iterations"]] == [0, 1]
    assert grpo["weights_versions"] == [1, 2]
    assert Path(grpo["final_weights"]).is_file() and out.with_suffix(".png").is_file()
    assert grpo["settings"]["heldout_scene_seeds"][0] >= task.HELDOUT_SEED_BASE


def test_sde_steps_option_reads_ranges_and_refuses_anything_else():
    from trajectory_ensemble_lab.grpo.train import parse_steps

    assert parse_steps("") is None
    assert parse_steps("0-5") == (0, 1, 2, 3, 4, 5)
    assert parse_steps("4,0-1") == (0, 1, 4)
    with pytest.raises(GrpoError, match="'first'"):
        parse_steps("first")
