"""The latent probe: it splits by start, reads a latent that holds the chunk, and refuses a split it cannot make."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trajectory_ensemble_lab.pusht.probe import (
    bag_inputs,
    bag_start,
    chunk_error_px,
    fit_probe,
    hold_still_px,
    main,
    probe_inputs,
)
from trajectory_ensemble_lab.pusht.recording import TEST_BAG, TEST_BAG_START, read_demo_bag
from trajectory_ensemble_lab.training import TrainingError
from trajectory_ensemble_lab.training.dataset import EncodedDataset


def _part(generator: torch.Generator, weights: torch.Tensor, states: int = 40) -> EncodedDataset:
    """A bag whose chunks are a fixed linear map of its latents: a probe can learn it, a constant cannot."""
    condition = torch.randn(states, 4, 1, 2, 2, generator=generator)
    actions = torch.tanh(condition.flatten(1) @ weights).reshape(states, 16, 2)
    return EncodedDataset(branch=None, condition=condition, clips=None, actions=actions,
                          state_of=torch.arange(states), options=[[i] for i in range(states)])


def test_a_latent_that_holds_the_chunk_is_read_on_starts_the_probe_never_saw():
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(16, 32, generator=generator) * 0.3
    parts = [_part(generator, weights) for _ in range(10)]
    latents, chunks, starts = probe_inputs(parts, [100 + i for i in range(10)])
    assert latents.shape == (400, 16) and chunks.shape == (400, 32)
    assert starts.unique().tolist() == list(range(100, 110))
    result = fit_probe(latents, chunks, starts, epochs=200, hidden=64, log=lambda _: None)
    assert (result["starts_train"], result["starts_held_out"]) == (8, 2)  # 100 and 105 held out
    assert (result["examples_train"], result["examples_held_out"]) == (320, 80)
    assert result["probe_held_out_px_median"] < 0.5 * result["constant_held_out_px_median"]


def test_frames_are_read_by_a_cnn_that_learns_where_a_bright_square_is():
    generator = torch.Generator().manual_seed(2)
    frames = torch.full((240, 3, 16, 16), -0.5)
    where = torch.randint(0, 12, (240, 2), generator=generator)
    for i, (row, col) in enumerate(where.tolist()):
        frames[i, :, row:row + 4, col:col + 4] = 0.5
    chunks = (where.float() / 6.0 - 1.0).repeat(1, 16)  # every row is the square's corner
    starts = torch.arange(240) // 8
    result = fit_probe(frames, chunks, starts, epochs=60, hidden=64, log=lambda _: None)
    assert result["starts_held_out"] == 6
    assert result["probe_held_out_px_median"] < 0.5 * result["constant_held_out_px_median"]


def test_the_error_is_the_mean_pixel_distance_over_the_executed_rows():
    expert = torch.zeros(1, 32)
    predicted = torch.zeros(1, 32)
    predicted[0, 0:16:2] = 3 / 256  # 3 px in x on rows 0..7
    predicted[0, 16:] = 1.0  # rows 8..15 are not executed
    assert chunk_error_px(predicted, expert).tolist() == pytest.approx([3.0])


def test_a_split_with_one_side_empty_and_a_bag_of_several_starts_are_refused():
    generator = torch.Generator().manual_seed(1)
    parts = [_part(generator, torch.randn(16, 32, generator=generator)) for _ in range(2)]
    with pytest.raises(TrainingError, match="no start on one side"):
        fit_probe(*probe_inputs(parts, [1, 2]), log=lambda _: None)
    with pytest.raises(TrainingError, match="one start per encoded bag"):
        probe_inputs(parts, [1])
    with pytest.raises(TrainingError, match=r"holds \[3, 4\]"):
        bag_start([{"env_seed": 3}, {"env_seed": 4}], Path("bag"))


def test_the_committed_bag_is_one_start_so_the_command_names_the_split_it_cannot_make(checkpoint, tmp_path, capsys):
    assert main(["--policy", str(checkpoint), "--bags", str(TEST_BAG), "--work-dir", str(tmp_path),
                 "--stride", "40", "--json", str(tmp_path / "probe.json")]) == 2
    assert "split of 1 starts" in capsys.readouterr().err and TEST_BAG_START[0] == 10
    assert not (tmp_path / "probe.json").exists()


def test_agent_positions_and_frames_follow_the_examples_and_holding_still_is_the_agents_own_distance():
    episodes = read_demo_bag(TEST_BAG)
    agents, frames = bag_inputs([TEST_BAG], stride=40, frame_size=24)
    steps = [t for e in episodes for t in range(0, len(e.actions), 40)]
    assert agents.shape == (len(steps), 2) and frames.shape == (len(steps), 3, 24, 24)
    first = episodes[0]
    assert agents[1].tolist() == pytest.approx((first.agent[40] / 256.0 - 1.0).tolist())
    # Each 24x24 pixel is the mean of a 4x4 block of the 96x96 frame, centred on 0.
    block = first.frames[40][:4, :4].reshape(-1, 3).mean(axis=0) / 255.0 - 0.5
    assert frames[1, :, 0, 0].float().tolist() == pytest.approx(block.tolist(), abs=2e-3)
    # An expert chunk 5 px to the right of the agent on every row: holding still is 5 px off.
    chunks = (agents + torch.tensor([5 / 256.0, 0.0])).repeat(1, 16)
    assert hold_still_px(agents, chunks).tolist() == pytest.approx([5.0] * len(steps), abs=1e-4)
