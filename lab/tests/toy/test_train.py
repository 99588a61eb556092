"""``train-toy``'s objective on a one-scene dataset encoded by the shipped toy pipeline: the default loss is unchanged
by the prefix options, a clean prefix reaches the model as conditioning and leaves the loss, a moved prefix trains
the moved chunk, bad values are refused."""

from __future__ import annotations

import argparse

import pytest
import torch

from trajectory_ensemble_node.models.cosmos3 import install_fanout
from trajectory_ensemble_node.toy import load_toy_pipeline, task
from trajectory_ensemble_lab.toy import augment
from trajectory_ensemble_lab.toy import train as toy_train
from trajectory_ensemble_lab.toy.data import build_dataset


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    pipe = load_toy_pipeline()
    dataset = build_dataset(pipe, 1, mid_probability=0.0, log=lambda message: None)
    install_fanout(pipe.transformer)
    return pipe, dataset


def _loss(setup, prefixes, actions=None, offsets=None):
    pipe, dataset = setup
    if actions is not None:
        dataset = type(dataset)(**{**dataset.__dict__, "actions": actions})
    examples = [0, 1]
    sigmas = torch.tensor([0.6, 0.3])
    return toy_train.training_loss(pipe, dataset, examples, sigmas, torch.Generator().manual_seed(5), 0.1, prefixes,
                                    offsets)


def test_zero_prefixes_leave_the_original_objective_bit_for_bit(setup):
    with torch.no_grad():
        plain = _loss(setup, None)
        zeros = _loss(setup, [0, 0])
    assert plain[0].item() == zeros[0].item() and plain[1:] == zeros[1:]


def test_a_clean_prefix_is_read_by_the_model_and_left_out_of_the_loss(setup):
    _, dataset = setup
    with torch.no_grad():
        plain = _loss(setup, None)
        prefixed = _loss(setup, [3, 2])
        # Moving the clean prefix changes what the model sees, so the loss on the noisy actions moves too.
        moved = dataset.actions.clone()
        moved[0, :3] += 0.5
        moved[1, :2] -= 0.5
        prefixed_moved = _loss(setup, [3, 2], moved)
        # A clean prefix 50 units off would add ~780 to the action MSE if its tokens were in the loss.
        far = dataset.actions.clone()
        far[0, :3] += 50.0
        far[1, :2] += 50.0
        prefixed_far = _loss(setup, [3, 2], far)
        unmasked_far = _loss(setup, None, far)
    assert prefixed[1] != plain[1]
    assert prefixed_moved[1] != prefixed[1]
    assert unmasked_far[1] > 500.0
    assert prefixed_far[1] < 50.0


def test_prefix_gradients_reach_the_transformer(setup):
    pipe, _ = setup
    pipe.transformer.zero_grad(set_to_none=True)
    loss, _, _ = _loss(setup, [4, 1])
    loss.backward()
    grads = [p.grad for p in pipe.transformer.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    pipe.transformer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("prefixes", [[0], [task.HORIZON, 0], [-1, 0]])
def test_prefixes_out_of_range_are_refused_with_the_value(setup, prefixes):
    with pytest.raises(ValueError, match=r"prefixes must give each of the 2 examples"):
        _loss(setup, prefixes)


def test_sample_prefixes_draws_nothing_when_off_and_stays_in_range_when_on():
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    assert augment.sample_prefixes(8, generator, 0.0, 4) == [0] * 8
    assert torch.equal(generator.get_state(), state)  # off: the noise of a plain run is unchanged
    drawn = augment.sample_prefixes(2000, generator, 0.5, 3)
    assert set(drawn) == {0, 1, 2, 3}
    assert 0.45 < sum(d > 0 for d in drawn) / len(drawn) < 0.55


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--prefix-conditioning", "1.5", "must be a share in [0, 1], got '1.5'"),
    ("--bimodal-share", "-0.1", "must be a share in [0, 1], got '-0.1'"),
    ("--prefix-offset", "-0.1", "must be a finite number >= 0, got '-0.1'"),
    ("--prefix-offset", "nan", "must be a finite number >= 0, got 'nan'"),
    ("--prefix-max", "0", f"must be in [1, {task.HORIZON}), got '0'"),
    ("--prefix-max", str(task.HORIZON), f"must be in [1, {task.HORIZON}), got '{task.HORIZON}'"),
    ("--demo-speed", "1.0", "must be in [0, 1), got '1.0'"),
    ("--demo-speed", "-0.2", "must be in [0, 1), got '-0.2'"),
    ("--demo-speed-share", "2", "must be a share in [0, 1], got '2'"),
])
def test_bad_option_values_are_refused_with_the_value(option, value, message, capsys):
    parser = argparse.ArgumentParser()
    toy_train.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([option, value])
    assert message in capsys.readouterr().err


def test_offset_prefix_moves_the_prefix_and_joins_it_without_a_jump():
    chunk = torch.stack([torch.linspace(0.1, 0.8, task.HORIZON), torch.zeros(task.HORIZON)], dim=1)
    offset = torch.tensor([0.0, 0.2])
    moved = augment.offset_prefix(chunk, 2, offset)
    shift = (moved - chunk)[:, 1]
    assert torch.allclose(shift[:2], torch.tensor([0.1, 0.2]))  # drifts away from the robot up to the offset
    assert torch.all(shift[1:].diff() <= 1e-7) and shift[-1].abs() < 1e-7  # then back, by the chunk's end
    assert (shift[2] - shift[1]).abs() < 0.2 / 4  # no jump right after the prefix
    assert torch.equal(moved[:, 0], chunk[:, 0])
    with pytest.raises(ValueError, match=f"clean must be in \\[1, {task.HORIZON}\\), got 0"):
        augment.offset_prefix(chunk, 0, offset)


def test_offset_examples_train_the_moved_chunk_without_the_vision_term(setup):
    with torch.no_grad():
        plain = _loss(setup, [2, 3])
        moved = _loss(setup, [2, 3], offsets=[torch.tensor([0.1, -0.1]), torch.tensor([0.0, 0.1])])
        one = _loss(setup, [2, 3], offsets=[torch.tensor([0.1, -0.1]), None])
    assert moved[1] != plain[1]
    assert moved[2] == 0.0  # neither clip shows its moved chunk
    assert one[2] != plain[2] and one[2] > 0.0  # the vision term of the unmoved example only
    with pytest.raises(ValueError, match="offsets must give each of the 2 examples"):
        _loss(setup, [0, 3], offsets=[torch.tensor([0.1, 0.1]), None])


def test_drift_chunk_grows_linearly_to_the_offset():
    chunk = torch.zeros(task.HORIZON, 2)
    moved = augment.drift_chunk(chunk, torch.tensor([0.08, -0.04]))
    assert torch.allclose(moved[-1], torch.tensor([0.08, -0.04]))
    assert torch.allclose(moved[:, 0].diff(), torch.full((task.HORIZON - 1,), 0.01))


def test_drifted_demonstrations_change_the_trained_chunk_and_zero_drift_changes_nothing(setup):
    with torch.no_grad():
        plain = _loss(setup, None)
        still = toy_train.training_loss(setup[0], setup[1], [0, 1], torch.tensor([0.6, 0.3]),
                                        torch.Generator().manual_seed(5), 0.1, None, None, torch.zeros(2, 2))
        drifted = toy_train.training_loss(setup[0], setup[1], [0, 1], torch.tensor([0.6, 0.3]),
                                          torch.Generator().manual_seed(5), 0.1, None, None,
                                          torch.tensor([[0.1, 0.0], [0.0, -0.1]]))
    assert still[1:] == plain[1:]
    assert drifted[1] != plain[1]
    with pytest.raises(ValueError, match=r"drifts must have shape \(2, 2\), got \(3, 2\)"):
        toy_train.training_loss(setup[0], setup[1], [0, 1], torch.tensor([0.6, 0.3]), torch.Generator(), 0.1,
                                None, None, torch.zeros(3, 2))


def test_dataset_keeps_where_each_demonstration_starts(setup):
    _, dataset = setup
    scene = task.make_scene(task.TRAIN_SEED_BASE)
    assert dataset.starts.shape == (len(dataset.actions), 2)
    assert torch.allclose(dataset.starts, torch.tensor(scene.robot, dtype=torch.float32).expand(2, 2))


def test_retime_chunk_walks_the_same_path_slower_or_faster_and_stays_at_its_end():
    chunk = torch.stack([0.1 * torch.arange(1, task.HORIZON + 1), torch.zeros(task.HORIZON)], dim=1)
    chunk[4:, 1] = 0.1 * torch.arange(1, task.HORIZON - 3)  # a corner: the path bends after waypoint 3
    start = torch.zeros(2)
    assert torch.equal(augment.retime_chunk(chunk, start, 1.0), chunk)
    slow = augment.retime_chunk(chunk, start, 0.5)
    assert torch.allclose(slow[0], torch.tensor([0.05, 0.0]))  # half way to waypoint 0
    assert torch.allclose(slow[1::2], chunk[: task.HORIZON // 2])  # every other step lands on a waypoint
    fast = augment.retime_chunk(chunk, start, 1.5)
    assert torch.allclose(fast[0], (chunk[0] + chunk[1]) / 2)
    assert torch.equal(fast[-3:], chunk[-1].expand(3, 2))  # arrived: stays at the last waypoint
    with pytest.raises(ValueError, match="factor must be a finite number > 0, got 0.0"):
        augment.retime_chunk(chunk, start, 0.0)


def test_sample_speeds_draws_nothing_when_off_and_stays_in_range_when_on():
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    assert torch.equal(augment.sample_speeds(8, generator, 0.5, 0.0), torch.ones(8))
    assert torch.equal(generator.get_state(), state)
    drawn = augment.sample_speeds(4000, generator, 0.5, 0.3)
    moved = drawn[drawn != 1.0]
    assert 0.45 < len(moved) / len(drawn) < 0.55
    assert moved.min() >= 0.7 and moved.max() <= 1.3 and moved.min() < 0.72 and moved.max() > 1.28
    # Only eligible examples (e.g. those with a clean prefix) are retimed, from the same draw.
    eligible = [i % 2 == 0 for i in range(8)]
    alone = augment.sample_speeds(8, torch.Generator().manual_seed(3), 1.0, 0.3)
    some = augment.sample_speeds(8, torch.Generator().manual_seed(3), 1.0, 0.3, eligible)
    assert torch.equal(some[0::2], alone[0::2]) and torch.equal(some[1::2], torch.ones(4))
    with pytest.raises(ValueError, match="eligible must have 8 entries, got 3"):
        augment.sample_speeds(8, generator, 1.0, 0.3, [True] * 3)


def test_retimed_demonstrations_train_the_retimed_chunk_without_the_vision_term(setup):
    pipe, dataset = setup
    args = (pipe, dataset, [0, 1], torch.tensor([0.6, 0.3]))
    with torch.no_grad():
        plain = toy_train.training_loss(*args, torch.Generator().manual_seed(5), 0.1)
        unit = toy_train.training_loss(*args, torch.Generator().manual_seed(5), 0.1, speeds=torch.ones(2))
        both = toy_train.training_loss(*args, torch.Generator().manual_seed(5), 0.1, speeds=torch.tensor([0.7, 1.3]))
        one = toy_train.training_loss(*args, torch.Generator().manual_seed(5), 0.1, speeds=torch.tensor([0.7, 1.0]))
    assert unit[0].item() == plain[0].item() and unit[1:] == plain[1:]
    assert both[1] != plain[1]
    assert both[2] == 0.0  # neither clip shows its retimed chunk
    assert one[2] > 0.0 and one[2] != plain[2]  # the vision term of the example at its own speed only
    with pytest.raises(ValueError, match=r"speeds must have shape \(2,\), got \(3,\)"):
        toy_train.training_loss(*args, torch.Generator(), 0.1, speeds=torch.ones(3))
    with pytest.raises(ValueError, match="needs the dataset's start positions"):
        bare = type(dataset)(**{**dataset.__dict__, "starts": None})
        toy_train.training_loss(pipe, bare, [0, 1], torch.tensor([0.6, 0.3]), torch.Generator(), 0.1,
                                speeds=torch.tensor([0.7, 1.0]))
