"""The lab's one trainer trains a checkpoint with the robot-state slot (issue 58), through the serving path's frame.

A pipeline that declares a state input (``declare_state_input``) is encoded by the serving path's own
``encode_conditioning``: each example's state frame is the one a served group builds from the same frame and state,
bit for bit, and the training forward sees it as a clean conditioning frame (latent frame 1). Saving writes the
declaration into the checkpoint's ``action_stats.json``, and the saved checkpoint loads through the catalog as a model
that takes the state: two states give two sets of candidates, no state is refused by name.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

from trajectory_ensemble_node.catalog import load_pipeline
from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.errors import MissingObservationKeyError
from trajectory_ensemble_node.models.cosmos3 import (
    CONFIGS,
    STATE_FRAME_INDEX,
    Cosmos3ActionModel,
    StateInput,
    declare_state_input,
    declared_state_input,
    encode_conditioning,
    read_state_input,
)
from trajectory_ensemble_lab.training import fit as fit_module
from trajectory_ensemble_lab.training.dataset import ExampleFormat, LabelledState, encode_states
from trajectory_ensemble_lab.training.fit import add_fit_arguments, fit, training_loss
from trajectory_ensemble_lab.training.pipeline import fresh_pipeline

FORMAT = ExampleFormat(instruction="Push the T-shaped block onto the green target.", domain_name="pusht",
                       chunk_size=8, resolution_tier=256, fps=10.0)
STATE_INPUT = StateInput.from_stats(("agent_x", "agent_y"), "minmax", {"min": [0.0, 0.0], "max": [512.0, 512.0]},
                                    domain="pusht")


def _frames(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=(64, 64, 3), dtype=np.uint8) for _ in range(count)]


def _states(with_clips: bool = False) -> list[LabelledState]:
    rng = np.random.default_rng(1)
    states = []
    for k, frame in enumerate(_frames(4)):
        chunk = rng.uniform(-1, 1, size=(FORMAT.chunk_size, 2)).astype(np.float32)
        clips = [[frame] * (FORMAT.chunk_size + 1)] if with_clips else None
        states.append(LabelledState(image=frame, chunks=[chunk], clips=clips,
                                    proprio=np.array([40.0 + 100 * k, 500.0 - 90 * k])))
    return states


@pytest.fixture(scope="module")
def pipe():
    pipe = fresh_pipeline(CONFIGS["tiny"], 0, _frames(4), FORMAT, log=lambda message: None)
    declare_state_input(pipe, STATE_INPUT)
    return pipe


def _served_frame(pipe, state: LabelledState) -> torch.Tensor:
    return encode_conditioning(pipe, prompt=FORMAT.instruction, negative_prompt=None,
                               action=FORMAT.action_condition(state.image), fps=FORMAT.fps,
                               guidance_scale=FORMAT.guidance_scale, device=torch.device("cpu"),
                               state_input=STATE_INPUT, state=state.proprio).x0_vision


def test_examples_carry_the_state_frame_serving_builds_and_train_it_as_a_clean_frame(pipe, monkeypatch):
    states = _states()
    dataset = encode_states(pipe, states, FORMAT, log=lambda message: None)
    assert dataset.condition.shape[2] == 2 and STATE_FRAME_INDEX == 1
    assert dataset.branch.template.vision_noisy_frame_indexes.tolist() == [2]
    for k, state in enumerate(states):
        assert torch.equal(dataset.condition[k], _served_frame(pipe, state)[0, :, :2])
    assert not torch.equal(dataset.condition[0, :, 1], dataset.condition[1, :, 1])

    seen = []
    original = fit_module.forward_items

    def capture(transformer, items, *args, **kwargs):
        seen.extend(items)
        return original(transformer, items, *args, **kwargs)

    monkeypatch.setattr(fit_module, "forward_items", capture)
    with torch.no_grad():
        training_loss(pipe, dataset, [0, 1, 2, 3], torch.tensor([0.9, 0.7, 0.5, 0.3]), torch.Generator().manual_seed(0),
                      0.1)
    vision = torch.cat([item.vision for item in seen])
    # The image and the state frame go in clean at every noise level; the frame after them is noised.
    assert torch.equal(vision[:, :, :2], dataset.condition)
    assert not torch.equal(vision[:, :, 2], torch.zeros_like(vision[:, :, 2]))


def test_clip_targets_keep_the_state_frame_in_its_slot(pipe):
    states = _states(with_clips=True)[:2]
    dataset = encode_states(pipe, states, FORMAT, log=lambda message: None)
    assert torch.equal(dataset.clips[:, :, :2], dataset.condition)


def test_a_few_steps_train_and_save_a_checkpoint_that_serves_with_the_state(pipe, tmp_path):
    dataset = encode_states(pipe, _states(), FORMAT, log=lambda message: None)
    parser = argparse.ArgumentParser()
    add_fit_arguments(parser)
    args = parser.parse_args(["--steps", "4", "--batch", "4", "--log-every", "2", "--checkpoint-every", "0",
                              "--save-dtype", "float32"])
    out = tmp_path / "policy"
    result = fit(pipe, dataset, args, out, tmp_path / "work")
    assert len(result["loss_history"]) == 2 and np.isfinite(result["final_loss"]["loss"])

    declared = read_state_input(out)
    assert declared.names == ("agent_x", "agent_y") and declared.domain == "pusht"
    loaded, _ = load_pipeline(str(out), "cpu", "float32")
    assert declared_state_input(loaded).entry() == STATE_INPUT.entry()
    model = Cosmos3ActionModel(loaded)
    assert model.adapter.capabilities.uses_state and model.adapter.capabilities.state_names == ("agent_x", "agent_y")
    spec = CandidateTrajectorySpec(count=4, reducer="mean", return_candidates=True)
    kwargs = dict(prompt=FORMAT.instruction, action=FORMAT.action_condition(_frames(1)[0]), num_inference_steps=3,
                  guidance_scale=1.0, fps=FORMAT.fps, spec=spec, base_seed=3)
    near = model.generate(**kwargs, state=[40.0, 500.0])
    far = model.generate(**kwargs, state=[400.0, 60.0])
    assert tuple(near.candidates.shape) == (4, 8, 2) and torch.isfinite(near.candidates).all()
    assert not torch.equal(near.candidates, far.candidates)
    assert torch.equal(model.generate(**kwargs, state=[40.0, 500.0]).candidates, near.candidates)
    with pytest.raises(MissingObservationKeyError, match="agent_x"):
        model.generate(**kwargs)


def test_frames_encoded_together_give_the_serving_paths_latents_and_state_frames(pipe):
    states = _states()
    one_by_one = encode_states(pipe, states, FORMAT, log=lambda message: None)
    together = encode_states(pipe, states, FORMAT, frame_batch=3, log=lambda message: None)
    assert together.condition.shape == one_by_one.condition.shape
    # The state frames are built by the same function from the same numbers: equal bit for bit. The VAE's batched
    # convolutions may round the image latents differently in the last bits.
    assert torch.equal(together.condition[:, :, 1], one_by_one.condition[:, :, 1])
    assert torch.allclose(together.condition[:, :, 0], one_by_one.condition[:, :, 0], rtol=0, atol=1e-5)
    assert torch.equal(together.actions, one_by_one.actions)
    assert torch.equal(together.branch.prefix.input_ids, one_by_one.branch.prefix.input_ids)


def test_frames_encoded_together_must_share_one_size(pipe):
    states = _states()
    states[2].image = states[2].image[:48]
    with pytest.raises(fit_module.TrainingError, match=r"state 2 has a frame of shape \(48, 64, 3\)"):
        encode_states(pipe, states, FORMAT, frame_batch=4, log=lambda message: None)


def _fit_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_fit_arguments(parser)
    return parser.parse_args(["--steps", "6", "--batch", "4", "--log-every", "1", "--save-dtype", "float32",
                              *extra])


def test_a_stopped_run_resumed_from_its_checkpoint_ends_where_an_unstopped_run_ends(pipe, tmp_path):
    dataset = encode_states(pipe, _states(), FORMAT, log=lambda message: None)
    initial = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}

    def restart():
        pipe.transformer.load_state_dict(initial)

    straight = fit(pipe, dataset, _fit_args("--checkpoint-every", "0"), tmp_path / "straight", tmp_path / "w1")
    straight_weights = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}

    # A run of the same length that checkpoints at step 3 and is stopped there: what resume.pt holds is step 3.
    restart()
    work = tmp_path / "w2"
    fit(pipe, dataset, _fit_args("--checkpoint-every", "3"), tmp_path / "first", work)
    state = torch.load(work / fit_module.RESUME_FILE, weights_only=False)
    assert state["step"] == 3 and len(state["history"]) == 3
    restart()  # a fresh process: the weights it starts from are the run's initial ones
    resumed = fit(pipe, dataset, _fit_args("--checkpoint-every", "3", "--resume"), tmp_path / "resumed", work)
    assert [h["step"] for h in resumed["loss_history"]] == [1, 2, 3, 4, 5, 6]
    assert [h["loss"] for h in resumed["loss_history"]] == [h["loss"] for h in straight["loss_history"]]
    for name, value in pipe.transformer.state_dict().items():
        assert torch.equal(value, straight_weights[name]), name
    restart()


def test_resume_refuses_a_checkpoint_of_another_length(pipe, tmp_path):
    dataset = encode_states(pipe, _states(), FORMAT, log=lambda message: None)
    initial = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    fit(pipe, dataset, _fit_args("--checkpoint-every", "3"), tmp_path / "out", tmp_path / "w")
    pipe.transformer.load_state_dict(initial)
    args = _fit_args("--checkpoint-every", "3", "--resume")
    args.steps = 9
    with pytest.raises(fit_module.TrainingError, match="continues a run of --steps 6, this run asks for --steps 9"):
        fit(pipe, dataset, args, tmp_path / "out", tmp_path / "w")
    pipe.transformer.load_state_dict(initial)
