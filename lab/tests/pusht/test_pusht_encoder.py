"""pusht-encoder: frames drawn from states are the env's own, a few steps of encoder training make the readout read a
trivially learnable set, the saved bundle loads through the catalog and serves, and train-pusht's latent cache is
keyed by the encoder's weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from trajectory_ensemble_node.catalog import load_pipeline
from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_lab.pusht import INSTRUCTION
from trajectory_ensemble_lab.pusht import encoder as pusht_encoder
from trajectory_ensemble_lab.pusht import train as pusht_train
from trajectory_ensemble_lab.pusht.recording import TEST_BAG
from trajectory_ensemble_lab.pusht.sim import CONTROL_HZ, make_env, read_state, render_states

# Four scenes far apart: agent (x, y), T (x, y, angle).
STATES = np.array([[100.0, 100.0, 300.0, 350.0, 0.3], [400.0, 120.0, 150.0, 300.0, 2.0],
                   [120.0, 420.0, 350.0, 180.0, -1.0], [420.0, 400.0, 220.0, 220.0, 4.0]])


def test_frames_drawn_from_states_are_the_envs_own_observations():
    env = make_env(pixels=True)
    obs, _ = env.reset(seed=100_003)
    frames, states = [obs["pixels"]], []
    rng = np.random.default_rng(0)
    for _ in range(6):
        state = read_state(env)
        states.append([*state.agent, *state.block])
        obs, *_ = env.step(rng.uniform(100, 400, 2))
        frames.append(obs["pixels"])
    state = read_state(env)
    states.append([*state.agent, *state.block])
    assert np.array_equal(render_states(np.array(states)), np.stack(frames))


def test_targets_are_agent_t_position_and_the_ts_eight_vertices_in_env_pixels():
    targets = pusht_encoder.state_targets(STATES)
    assert targets.shape == (4, pusht_encoder.TARGETS)
    assert np.allclose(targets[:, :4], STATES[:, :4])
    # The bar's corner (-60, 30) at angle 0 from (300, 350) rotated by 0.3 rad: a vertex 67 px from the origin.
    assert np.allclose(np.linalg.norm(targets[0, 4:6] - STATES[0, 2:4]), np.hypot(60, 30), atol=1e-3)


@pytest.fixture(scope="module")
def trained(checkpoint, tmp_path_factory):
    """The tiny checkpoint's VAE trained 40 steps on four scenes, and its saved bundle."""
    torch.manual_seed(0)
    work = tmp_path_factory.mktemp("pusht_encoder")
    pipe, _ = load_pipeline(str(checkpoint), "cpu", "float32")
    pipe.vae.float()
    before = {k: v.clone() for k, v in pipe.vae.encoder.state_dict().items()}
    frames = torch.from_numpy(render_states(STATES))
    targets = torch.from_numpy(pusht_encoder.state_targets(STATES))
    lines: list[str] = []
    readout = pusht_encoder.train(pipe, frames, targets, steps=40, batch=4, lr=1e-3, work_dir=work / "run",
                                  checkpoint_every=20, log=lines.append)
    errors = pusht_encoder.measure(pipe, readout, frames, targets)
    size = pusht_encoder.save_bundle(pipe, readout, frames, work / "bundle", normalization_frames=4)
    return pipe, before, frames, targets, errors, work, size, lines


def test_forty_steps_read_four_scenes_far_better_than_their_mean(trained):
    pipe, before, frames, targets, errors, work, _, _ = trained
    constant = pusht_encoder.position_errors(targets.mean(dim=0, keepdim=True).expand_as(targets), targets)
    # The mean scene is 150..200 px from each; a readout that read nothing could not do better.
    assert errors["agent_mean_px"] < 0.5 * constant["agent_mean_px"], (errors, constant)
    assert errors["t_position_mean_px"] < 0.5 * constant["t_position_mean_px"], (errors, constant)
    # The encoder itself trained (the decoder is never touched).
    assert any(not torch.equal(before[k], v) for k, v in pipe.vae.encoder.state_dict().items())
    assert torch.load(work / "run" / "checkpoint.pt", weights_only=True)["step"] == 40


def test_a_stopped_run_resumes_from_its_checkpoint(trained, checkpoint):
    _, _, frames, targets, _, work, _, _ = trained
    pipe, _ = load_pipeline(str(checkpoint), "cpu", "float32")
    pipe.vae.float()
    lines: list[str] = []
    pusht_encoder.train(pipe, frames, targets, steps=42, batch=4, lr=1e-3, work_dir=work / "run", log=lines.append)
    assert lines[0] == f"resumed at step 40 from {work / 'run' / 'checkpoint.pt'}"
    assert torch.load(work / "run" / "checkpoint.pt", weights_only=True)["step"] == 42


def test_the_bundle_is_under_10_mb_loads_through_the_catalog_and_serves(trained):
    pipe, _, frames, _, _, work, size, _ = trained
    bundle = work / "bundle"
    assert size < 10_000_000 and pusht_encoder.readout_path(bundle).is_file()
    assert not list(bundle.rglob("*readout*")), "the lab's readout never ships inside the bundle"
    loaded, notice = load_pipeline(str(bundle), "cpu", "float32")
    assert notice == f"weights from {bundle}"
    for name, value in pipe.vae.encoder.state_dict().items():
        assert torch.equal(loaded.vae.encoder.state_dict()[name].float(), value.half().float()), name
    model = Cosmos3ActionModel(loaded)
    spec = CandidateTrajectorySpec(count=2, reducer="mode", return_candidates=True)
    served = model.generate(prompt=INSTRUCTION, action=pusht_train.PUSHT_FORMAT.action_condition(frames[0].numpy()),
                            num_inference_steps=2, guidance_scale=1.0, fps=float(CONTROL_HZ), spec=spec, base_seed=1)
    assert tuple(served.action.shape) == (16, 2) and torch.isfinite(served.candidates).all()


def test_train_pusht_with_the_encoder_encodes_anew_and_never_reuses_the_old_encoders_cache(trained, checkpoint,
                                                                                        tmp_path):
    bundle = trained[5] / "bundle"
    old = pusht_train.load_for_training(checkpoint, 0, pusht_train.normalization_images([TEST_BAG]))
    first = pusht_train.build_pusht_dataset(old, [TEST_BAG], stride=32, cache_dir=tmp_path, log=lambda m: None)
    assert len(list((tmp_path / "pusht_data").glob("*.pt"))) == 1
    new = pusht_train.load_for_training(checkpoint, 0, pusht_train.normalization_images([TEST_BAG]), encoder=bundle)
    for name, value in new.vae.state_dict().items():
        assert torch.equal(value, load_pipeline(str(bundle), "cpu", "float32")[0].vae.state_dict()[name].float())
    second = pusht_train.build_pusht_dataset(new, [TEST_BAG], stride=32, cache_dir=tmp_path, log=lambda m: None)
    assert len(list((tmp_path / "pusht_data").glob("*.pt"))) == 2
    assert not torch.allclose(first.condition, second.condition)
    # Normalized on the bag's frames as a fresh pipeline is: about zero mean and unit spread per channel.
    assert second.condition.mean().abs() < 0.5


def test_gate_refuses_frames_outside_validation_starts_and_training_refuses_validation_frames(trained, tmp_path,
                                                                                              capsys):
    bundle, frames = trained[5] / "bundle", trained[2]
    for starts, action in (([200_000] * 4, "gate"), ([100_000] * 4, "train")):
        path = tmp_path / f"{action}.npz"
        np.savez(path, frames=frames.numpy(), targets=trained[3].numpy(), starts=np.array(starts))
        extra = ["--bundle", str(bundle)] if action == "gate" else ["--work-dir", str(tmp_path / "run")]
        assert pusht_encoder.main([action, "--frames", str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert "gate frames must come from validation starts [100000, 200000], got 200000..200000" in err
    assert "training frames include validation or held-out starts (max 100000)" in err


def test_the_commands_train_save_and_gate_with_a_dated_record(trained, checkpoint, tmp_path):
    frames, targets = trained[2], trained[3]
    train_file, val_file = tmp_path / "train.npz", tmp_path / "val.npz"
    np.savez(train_file, frames=frames.numpy(), targets=targets.numpy(), starts=np.array([0, 1, 2, 3]))
    np.savez(val_file, frames=frames.numpy(), targets=targets.numpy(), starts=np.array([100_000] * 4))
    bundle, record = tmp_path / "bundle", tmp_path / "gate.json"
    assert pusht_encoder.main(["train", "--frames", str(train_file), "--init", str(checkpoint), "--work-dir",
                               str(tmp_path / "run"), "--out", str(bundle), "--steps", "2", "--batch", "2"]) == 0
    # Two steps read nothing: the gate fails, and says so in its record.
    assert pusht_encoder.main(["gate", "--bundle", str(bundle), "--frames", str(val_file), "--json",
                               str(record)]) == 1
    result = json.loads(record.read_text())
    assert result["passed"] is False and result["frames"] == 4 and result["validation_starts"] == [100_000]
    assert result["date"] and result["commit"] and result["agent_mean_px"] > pusht_encoder.GATE_PX
    assert result["training"]["steps"] == 2 and result["training"]["frames"] == 4


def test_frozen_trains_the_readout_alone_and_leaves_the_encoder_as_it_was(trained, checkpoint, tmp_path):
    frames, targets = trained[2], trained[3]
    pipe, _ = load_pipeline(str(checkpoint), "cpu", "float32")
    pipe.vae.float()
    before = {k: v.clone() for k, v in pipe.vae.state_dict().items()}
    readout = pusht_encoder.train(pipe, frames, targets, steps=3, batch=4, lr=1e-3, work_dir=tmp_path, frozen=True,
                                  log=lambda m: None)
    assert all(torch.equal(before[k], v) for k, v in pipe.vae.state_dict().items())
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 3 and readout.net[2].weight.numel()
