"""``train-pusht`` on the committed demonstration bag: the bag source cuts one example per control step whose chunk is
the recorded reference (as replay reads it), the action statistics load in the node's normalizer, a few steps of the
shared trainer lower the loss on a fixed batch and save a pipeline the node's catalog loads and serves as [16, 2]."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from trajectory_ensemble_node.catalog import load_pipeline
from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, install_fanout
from trajectory_ensemble_node.normalization import ActionNormalizer
from trajectory_ensemble_node.replay import bags
from trajectory_ensemble_node.replay.reference import read_reference
from trajectory_ensemble_lab.pusht import train as pusht_train
from trajectory_ensemble_lab.pusht import train_cli
from trajectory_ensemble_lab.pusht import INSTRUCTION
from trajectory_ensemble_lab.pusht.recording import EPISODES_KEY, PERIOD_NS, TEST_BAG, read_demo_bag
from trajectory_ensemble_lab.pusht.sim import CONTROL_HZ
from trajectory_ensemble_lab.training import TrainingError
from trajectory_ensemble_lab.training.fit import fit, training_loss
from trajectory_ensemble_lab.training.pipeline import fresh_pipeline

STRIDE = 8


def _example_frames() -> list[tuple[int, int, np.ndarray]]:
    """Every frame an example starts from, as ``(stamp, steps left in its episode, rgb)``: all but each episode's
    last frame."""
    listing = json.loads(bags.bag_info(TEST_BAG).custom_data[EPISODES_KEY])
    images = bags.read_messages(TEST_BAG, bags.DEMO_IMAGE_TOPIC)
    starts = [int(entry["first_frame_ns"]) for entry in listing]
    out = []
    for k, entry in enumerate(listing):
        mine = [(t, msg) for t, msg in images if t >= starts[k] and (k + 1 == len(starts) or t < starts[k + 1])]
        steps = int(entry["steps"])
        assert len(mine) == steps + 1
        out.extend((t, steps - j, bags.image_rgb(msg)) for j, (t, msg) in enumerate(mine[:-1]))
    return out


def test_the_bag_source_gives_each_control_step_its_frame_and_the_recorded_next_16_actions():
    frames = _example_frames()
    states = list(pusht_train.demo_states([TEST_BAG]))
    # One example per control step of both demonstrations.
    assert len(states) == len(frames) == sum(e["steps"] for e in pusht_train.listed_episodes([TEST_BAG])) > 100
    reference = read_reference(TEST_BAG, bags.DEMO_REFERENCE_TOPIC)
    normalizer = pusht_train.action_normalizer()
    padded = 0
    for (stamp, left, rgb), state in zip(frames, states):
        assert np.array_equal(state.image, rgb) and state.clips is None
        (chunk,) = state.chunks
        assert chunk.shape == (pusht_train.CHUNK, 2) and np.all(np.abs(chunk) <= 1.0)
        raw = normalizer.denormalize(torch.as_tensor(chunk, dtype=torch.float64)).numpy()
        # Row j of a chunk served from this frame stands at stamp + (j + 1) periods, where the reference (as replay
        # reads it) holds the expert's action; past the episode's end the chunk repeats its last action.
        end = min(pusht_train.CHUNK, left)
        times = stamp + (np.arange(end) + 1) * PERIOD_NS
        np.testing.assert_allclose(raw[:end], reference.sample([0, 1], times), atol=1e-3)
        if end < pusht_train.CHUNK:
            padded += 1
            assert np.array_equal(raw[end:], np.repeat(raw[end - 1 : end], pusht_train.CHUNK - end, axis=0))
    # The last 15 steps of each of the two episodes reach past its end.
    assert padded == 2 * (pusht_train.CHUNK - 1)


def test_the_action_stats_file_is_a_fixed_minmax_over_0_512_the_node_reads(tmp_path):
    path = pusht_train.write_stats(tmp_path)
    data = json.loads(path.read_text())
    # The node enters the domain's entry when the file has one (serving/startup_checks.py).
    normalizer = ActionNormalizer.from_json(path, "minmax", 2, domain="pusht" if "pusht" in data else None)
    raw = torch.tensor([[0.0, 512.0], [256.0, 128.0]], dtype=torch.float64)
    assert torch.allclose(normalizer.normalize(raw), torch.tensor([[-1.0, 1.0], [0.0, -0.5]], dtype=torch.float64))
    assert torch.allclose(normalizer.denormalize(normalizer.normalize(raw)), raw)


def test_clips_cover_the_chunk_and_pad_with_the_last_frame():
    episode = read_demo_bag(TEST_BAG)[0]
    last = len(episode.actions) - 1
    states = list(pusht_train.episode_states(episode, pusht_train.action_normalizer(), clips=True))
    assert len(states) == len(episode.actions)
    (first,) = states[0].clips
    assert len(first) == pusht_train.CHUNK + 1
    assert all(np.array_equal(f, episode.frames[j]) for j, f in enumerate(first))
    (tail,) = states[last].clips
    assert np.array_equal(tail[0], episode.frames[last])
    assert all(np.array_equal(f, episode.frames[-1]) for f in tail[1:])


def test_no_bag_is_refused_by_name(tmp_path, capsys):
    with pytest.raises(TrainingError, match="no demonstration bag"):
        pusht_train.demo_bags(tmp_path)
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--bags", str(tmp_path), "--work-dir", str(tmp_path / "work")])
    assert train_cli.run(args) == 2
    assert f"error: INVALID_PARAMETERS (52): no demonstration bag (a folder with metadata.yaml) at {str(tmp_path)!r}" \
        in capsys.readouterr().err


def test_the_prefix_options_are_the_toys_and_bounded_by_the_16_row_chunk(capsys):
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--prefix-conditioning", "0.5", "--prefix-max", "4", "--prefix-offset", "0.02"])
    assert (args.prefix_conditioning, args.prefix_max, args.prefix_offset) == (0.5, 4, 0.02)
    assert parser.parse_args([]).prefix_max == 8 and parser.parse_args([]).prefix_conditioning == 0.0
    for bad in (["--prefix-max", "16"], ["--prefix-conditioning", "1.5"], ["--prefix-offset", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    assert "--prefix-max: must be in [1, 16), got '16'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A fresh PushT pipeline, its encoded examples (every 8th step of the committed bag), the loss of one fixed
    batch before training, and the directory of the pipeline after 30 steps."""
    torch.manual_seed(0)
    work = tmp_path_factory.mktemp("pusht_train")
    images = pusht_train.normalization_images([TEST_BAG], count=8)
    pipe = fresh_pipeline(pusht_train.PUSHT_CONFIG, 0, images, pusht_train.PUSHT_FORMAT, log=lambda message: None)
    dataset = pusht_train.build_pusht_dataset(pipe, [TEST_BAG], stride=STRIDE, cache_dir=work, log=lambda m: None)
    install_fanout(pipe.transformer)
    batch = list(range(8))
    sigmas = torch.tensor([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])

    def fixed_batch_loss() -> tuple[float, float]:
        with torch.no_grad():
            _, action, vision = training_loss(pipe, dataset, batch, sigmas, torch.Generator().manual_seed(3), 0.1)
        return action, vision

    # Encoded again from the same cache (what a resumed run does): nothing is re-encoded, the tensors are equal.
    cached = pusht_train.build_pusht_dataset(pipe, [TEST_BAG], stride=STRIDE, cache_dir=work, log=lambda m: None)
    before = fixed_batch_loss()
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--steps", "30", "--batch", "8", "--lr", "1e-3", "--log-every", "10",
                              "--checkpoint-every", "0", "--threads", "1"])
    out = work / "policy"
    result = fit(pipe, dataset, args, out, work)
    pusht_train.write_stats(out)
    return dataset, before, fixed_batch_loss(), out, result, cached, work


def test_the_dataset_has_one_state_per_eighth_step_and_no_clips(trained):
    dataset = trained[0]
    steps = [e["steps"] for e in pusht_train.listed_episodes([TEST_BAG])]
    assert dataset.num_states == sum(-(-s // STRIDE) for s in steps)
    assert tuple(dataset.actions.shape) == (dataset.num_states, 16, 2) and dataset.clips is None
    # 96x96 frames are padded, never scaled, at tier 256: a 6x6 latent (VAE factor 16).
    assert tuple(dataset.condition.shape[1:]) == (16, 1, 6, 6)


def test_each_bag_is_encoded_once_into_the_cache_and_read_back_equal(trained):
    dataset, cached, work = trained[0], trained[5], trained[6]
    assert len(list((work / "pusht_data").glob("*.pt"))) == 1
    for name in ("condition", "actions", "state_of"):
        assert torch.equal(getattr(cached, name), getattr(dataset, name))
    assert cached.options == dataset.options and torch.equal(cached.branch.prefix.input_ids,
                                                              dataset.branch.prefix.input_ids)


def test_thirty_steps_lower_the_loss_of_a_fixed_batch(trained):
    _, before, after, _, result, _, _ = trained
    assert after[0] < 0.8 * before[0], (before, after)
    assert len(result["loss_history"]) == 3


def test_the_saved_pipeline_is_under_10_mb_loads_through_the_catalog_and_serves_a_16_by_2_chunk(trained):
    _, _, _, out, result, _, _ = trained
    assert result["saved_bytes"] < 10_000_000
    weights = sorted(p.name for p in out.rglob("*.safetensors"))
    assert weights and not list(out.rglob("*.bin")) and not list(out.rglob("*.pt"))
    pipe, notice = load_pipeline(str(out), "cpu", "float32")
    assert notice == f"weights from {out}"
    model = Cosmos3ActionModel(pipe)
    frame = read_demo_bag(TEST_BAG)[0].frames[5]
    spec = CandidateTrajectorySpec(count=4, reducer="mode", return_candidates=True)
    served = model.generate(prompt=INSTRUCTION, action=pusht_train.PUSHT_FORMAT.action_condition(frame),
                            num_inference_steps=4, guidance_scale=1.0, fps=float(CONTROL_HZ), spec=spec,
                            base_seed=7)
    assert tuple(served.action.shape) == (16, 2) and tuple(served.candidates.shape) == (4, 16, 2)
    assert torch.isfinite(served.candidates).all()
    # Denormalized by the file written beside it, the served chunk is a target in env pixels.
    stats = ActionNormalizer.from_json(out / pusht_train.STATS_FILE, "minmax", 2, domain="pusht")
    assert stats.denormalize(served.action.double()).shape == (16, 2)


def test_the_training_format_is_the_bundled_policys_serving_settings():
    """The lab trains what ``model: pusht`` serves: one set of settings, checked here rather than kept twice."""
    from trajectory_ensemble_node.bundled import PUSHT_SETTINGS

    from trajectory_ensemble_lab.pusht.train import PUSHT_FORMAT

    trained = {"domain_name": PUSHT_FORMAT.domain_name, "chunk_size": PUSHT_FORMAT.chunk_size,
               "resolution_tier": PUSHT_FORMAT.resolution_tier, "fps": PUSHT_FORMAT.fps,
               "guidance_scale": PUSHT_FORMAT.guidance_scale, "instruction": PUSHT_FORMAT.instruction}
    assert trained == dict(PUSHT_SETTINGS)
