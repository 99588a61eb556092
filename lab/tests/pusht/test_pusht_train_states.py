"""``train-pusht --states``: the PushT policy from state-only episodes, with the agent's position as its state input.

Frames are drawn from the episodes' states (the env's own observations, checked in test_pusht_encoder), each example
carries the expert's clean labels (a DART episode's, not what it sent) and, with the state input, the agent's position
at its frame as a state frame built by the serving path's own function. The encoded parts are cached and can be
filled by several processes; the written statistics keep the state declaration the node reads."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import shutil

import numpy as np
import pytest
import torch

from trajectory_ensemble_node.models.cosmos3 import build_state_frame, declared_state_input, read_state_input
from trajectory_ensemble_lab.pusht import train as pusht_train
from trajectory_ensemble_lab.pusht import train_cli
from trajectory_ensemble_lab.training.fit import fit
from trajectory_ensemble_lab.pusht.demos import DartNoise, run_episode
from trajectory_ensemble_lab.pusht.policy_state import AGENT_STATE_NAMES, POSE_STATE_NAMES, request_state
from trajectory_ensemble_lab.pusht.sim import make_env
from trajectory_ensemble_lab.pusht.state_demos import read_episode, write_episode
from trajectory_ensemble_lab.training import TrainingError

START, STRIDE = 10, 8


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    """A clean success, a clean failure (cut at 30 steps) and a DART episode of start 10, as state-only files."""
    folder = tmp_path_factory.mktemp("states")
    played = [run_episode(START, 0), run_episode(START, 1, max_steps=30),
              run_episode(START, 2, max_steps=40, dart=DartNoise(6.0))]
    assert played[0].success and not played[1].success and played[2].dart_sigma > 0
    for ep in played:
        write_episode(folder, ep)
    return folder, played


@pytest.fixture(scope="module")
def encoded(episodes, tmp_path_factory):
    folder, _ = episodes
    work = tmp_path_factory.mktemp("work")
    files = pusht_train.state_episode_files([folder])
    images = pusht_train.state_normalization_images(files, count=4)
    pipe = pusht_train.load_for_training(None, 0, images, state_names=AGENT_STATE_NAMES)
    dataset = pusht_train.build_state_dataset(pipe, files, stride=STRIDE, cache_dir=work, log=lambda m: None)
    return pipe, files, dataset, work


def test_examples_are_the_kept_episodes_steps_with_clean_labels_and_the_agents_position(encoded):
    pipe, files, dataset, _ = encoded
    played = [read_episode(path) for path in files]  # as written: float32 states
    assert [ep.expert_seed for ep in played] == [0, 1, 2]
    kept = [played[0], played[2]]  # the clean failure is left out; a DART episode trains whatever its end
    steps = [t for ep in kept for t in range(0, len(ep.labels), STRIDE)]
    assert dataset.num_states == len(steps) and tuple(dataset.actions.shape) == (len(steps), 16, 2)
    # The image frame and the state frame, both clean conditioning frames of a 6x6 latent.
    assert tuple(dataset.condition.shape[1:]) == (16, 2, 6, 6)
    normalizer, declared = pusht_train.action_normalizer(), declared_state_input(pipe)
    assert declared.names == ("agent_x", "agent_y")
    row = 0
    for ep in kept:
        labels = normalizer.normalize(torch.as_tensor(ep.labels, dtype=torch.float64)).numpy()
        for t in range(0, len(ep.labels), STRIDE):
            assert np.array_equal(dataset.actions[row].numpy(), pusht_train.chunk_at(labels, t).astype(np.float32))
            normalized, _ = declared.normalize(tuple(ep.states[t, :2]))
            assert torch.equal(dataset.condition[row, :, 1], build_state_frame(normalized.float(), 16, 6, 6))
            row += 1
    dart = played[2]
    assert not np.array_equal(dart.labels, dart.actions)  # the labels trained on are not the noisy targets sent


def test_parts_are_cached_and_shards_fill_the_same_cache(episodes, encoded, tmp_path):
    pipe, files, dataset, work = encoded
    assert len(list((work / "pusht_data").glob("*.pt"))) == 1
    again = pusht_train.build_state_dataset(pipe, files, stride=STRIDE, cache_dir=work, log=lambda m: None)
    assert torch.equal(again.condition, dataset.condition) and torch.equal(again.actions, dataset.actions)
    assert pusht_train.build_state_dataset(pipe, files, stride=STRIDE, cache_dir=tmp_path, shard=(0, 2),
                                           log=lambda m: None) is None
    assert len(list((tmp_path / "pusht_data").glob("*.pt"))) == 1
    read_back = pusht_train.build_state_dataset(pipe, files, stride=STRIDE, cache_dir=tmp_path, log=lambda m: None)
    assert torch.equal(read_back.condition, dataset.condition)
    # One process filling the whole cache is a shard too: it encodes and returns nothing to train on.
    assert pusht_train.build_state_dataset(pipe, files, stride=STRIDE, cache_dir=tmp_path, shard=(0, 1),
                                           log=lambda m: None) is None
    with pytest.raises(TrainingError, match="shard must be K/N with 0 <= K < N, got 2/2"):
        pusht_train.build_state_dataset(pipe, files, shard=(2, 2))


def test_a_parts_keys_under_several_settings_hash_its_files_once_and_match_keys_hashed_alone(encoded, tmp_path):
    pipe, files, _, work = encoded
    content = pusht_train._content_digest(pipe, files)
    before = content.hexdigest()
    shared = [pusht_train._cache_key(pipe, files, False, STRIDE, pusht_train.state_input(names), content=content)
              for names in pusht_train.STATE_SETS.values()]
    alone = [pusht_train._cache_key(pipe, files, False, STRIDE, pusht_train.state_input(names))
             for names in pusht_train.STATE_SETS.values()]
    assert shared == alone and len(set(shared)) == len(shared)  # one key per state input
    assert content.hexdigest() == before  # each key finished a copy
    # The cached part is under the pipeline's own key; other bytes make another key.
    assert (work / "pusht_data" / f"{pusht_train._cache_key(pipe, files, False, STRIDE)}.pt").exists()
    changed = tmp_path / files[0].name
    changed.write_bytes(files[0].read_bytes() + b"\0")
    assert pusht_train._cache_key(pipe, [changed, *files[1:]], False, STRIDE) not in shared + alone


def test_runs_with_their_own_work_dirs_share_one_cache_dir(episodes, tmp_path, capsys):
    folder, _ = episodes
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    cache = tmp_path / "cache"

    def encode(work: str, shard: str = "0/2") -> int:
        return train_cli.run(parser.parse_args([
            "--states", str(folder), "--state-input", "--stride", str(STRIDE), "--encode-shard", shard,
            "--work-dir", str(tmp_path / work), "--cache-dir", str(cache)]))

    assert encode("first") == 0
    out = capsys.readouterr().out
    assert "encoded shard 0/2" in out and "step " not in out  # encoded, then exited: nothing trained
    parts = sorted((cache / "pusht_data").glob("*.pt"))
    assert len(parts) == 1 and not (tmp_path / "first" / "pusht_data").exists()
    written = parts[0].stat().st_mtime_ns
    capsys.readouterr()
    assert encode("second") == 0
    assert "encoded part 1/1" in capsys.readouterr().out
    # The second run read the first one's part: nothing new in the cache, the part not written again.
    assert sorted((cache / "pusht_data").glob("*.pt")) == parts and parts[0].stat().st_mtime_ns == written
    assert not (tmp_path / "second" / "pusht_data").exists()
    # 0/1 (one process for the whole cache) also encodes and exits; it once went on to train with the defaults.
    assert encode("third", "0/1") == 0
    out = capsys.readouterr().out
    assert "encoded shard 0/1" in out and "step " not in out


def test_validation_starts_never_train(episodes, encoded, tmp_path):
    _, played = episodes
    pipe = encoded[0]
    write_episode(tmp_path, dataclasses.replace(played[0], env_seed=100_003))
    with pytest.raises(TrainingError, match="start 100003"):
        pusht_train.build_state_dataset(pipe, pusht_train.state_episode_files([tmp_path]), stride=STRIDE)


def test_the_written_statistics_keep_the_state_declaration(tmp_path):
    pusht_train.write_stats(tmp_path, pusht_train.state_input())
    declared = read_state_input(tmp_path)
    assert declared.names == ("agent_x", "agent_y") and declared.domain == "pusht"
    assert declared.entry() == pusht_train.state_input().entry()
    pusht_train.write_stats(tmp_path / "plain")
    assert read_state_input(tmp_path / "plain") is None


def test_the_state_input_needs_state_only_episodes(capsys):
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    assert train_cli.run(parser.parse_args(["--state-input", "--steps", "1"])) == 2
    assert "--state-input trains from state-only episodes: give --states" in capsys.readouterr().err
    assert train_cli.run(parser.parse_args(["--prompt-merges", "64", "--steps", "1"])) == 2
    assert "--prompt-merges trains from state-only episodes: give --states" in capsys.readouterr().err


@pytest.fixture(scope="module")
def state_checkpoint(encoded, tmp_path_factory):
    """A PushT checkpoint with the agent's position as its state input, after two training steps."""
    pipe, _, dataset, work = encoded
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--steps", "2", "--batch", "4", "--checkpoint-every", "0", "--log-every", "1"])
    out = tmp_path_factory.mktemp("state_policy") / "policy"
    fit(pipe, dataset, args, out, work)
    pusht_train.write_stats(out, declared_state_input(pipe))
    return out


def test_the_evaluators_send_the_agents_position_to_a_model_that_takes_it(state_checkpoint, recorded_policy):
    from trajectory_ensemble_lab.pusht import evaluate as ev
    from trajectory_ensemble_lab.pusht.bench import Drawer

    policy = recorded_policy(state_checkpoint)
    assert policy.metadata["state"]["names"] == ["agent_x", "agent_y"]
    record = ev.run_episode(policy, 100_000, count=2, reducer="mode", max_steps=10)
    env = make_env(pixels=True)
    obs, _ = env.reset(seed=100_000)
    groups = [obs for obs in policy.sent if "observation/image" in obs]
    assert record.requests == len(groups) == 2
    assert np.array_equal(groups[0]["observation/state"], np.asarray(obs["agent_pos"], dtype=np.float64))
    chunk, _ = Drawer(policy, 2)(obs["pixels"], seed=1, step=0, session="s", count=2, reducer="mode",
                                 agent_pos=np.array([300.0, 40.0]))
    assert np.array_equal(policy.sent[-1]["observation/state"], [300.0, 40.0]) and chunk.shape == (16, 2)
    with pytest.raises(ev.PushTError, match=r"PushT has only \['agent_x', .*'block_sin'\], not \['joint_3'\]"):
        request_state({"state": {"names": ["agent_x", "joint_3"]}}, [1.0, 2.0])
    assert request_state({}, [1.0, 2.0]) == {}


def test_the_node_takes_the_sims_joint_state_and_serves_the_in_process_chunks(state_checkpoint, tmp_path,
                                                                              ros_domain_id):
    # The PushT sim publishes the agent's position as a JointState (agent_x, agent_y) with each frame's stamp; the
    # node pairs them, so goal c serves request c's frame, state and seed: the in-process chunks, bit for bit.
    pytest.importorskip("rclpy")
    pytest.importorskip("trajectory_ensemble_msgs")
    import json

    from trajectory_ensemble_lab.bench import cli

    common = ["--pusht", "--episodes", "1", "--seed", "100000", "--count", "2", "--max-steps", "12", "--steps", "2",
              "--trace", "--methods", "single,mode", "--delays", "0", "--continuity", "",
              "--policy", str(state_checkpoint)]
    records = {}
    for through in ("process", "node"):
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        out = tmp_path / f"{through}.json"
        assert cli.run(parser.parse_args([*common, "--through", through, "--json", str(out)])) == 0
        records[through] = json.loads(out.read_text())
    for name in ("single", "mode"):
        node = records["node"]["pusht"][name]["per_episode"][0]
        local = records["process"]["pusht"][name]["per_episode"][0]
        assert node["steps"] == local["steps"] == 12
        assert node["actions"] == local["actions"], name


def test_openloop_measures_a_state_policy_on_state_only_episodes(episodes, state_checkpoint, tmp_path):
    import json

    from trajectory_ensemble_lab.pusht.openloop import main

    folder, _ = episodes
    out = tmp_path / "openloop.json"
    assert main(["--policy", str(state_checkpoint), "--states", str(folder), "--episodes", "2", "--every", "16",
                 "--steps", "2", "--json", str(out)]) == 0
    record = json.loads(out.read_text())["train"]
    played = [read_episode(path) for path in pusht_train.state_episode_files([folder])[:2]]
    assert record["episodes"] == 2 and record["chunks"] == sum(-(-len(ep.labels) // 16) for ep in played)
    assert record["error_px_median"] > 0 and record["hold_still_px_median"] > 0


# The perception diagnostic: a lab policy handed the T's true pose beside the agent's position (never shipped).


def test_the_pose_state_input_carries_the_ts_pose_and_reuses_the_frames_encoded_for_another(encoded, tmp_path):
    agent_pipe, files, agent_data, work = encoded
    pipe = copy.deepcopy(agent_pipe)  # the same VAE and normalization: the frames' latents are the same
    pusht_train.declare_state_input(pipe, pusht_train.state_input(POSE_STATE_NAMES))
    declared = declared_state_input(pipe)
    assert declared.names == POSE_STATE_NAMES
    assert declared.entry()["min"] == [0, 0, 0, 0, -1, -1] and declared.entry()["max"] == [512] * 4 + [1, 1]
    fresh = pusht_train.build_state_dataset(pipe, files, stride=STRIDE, cache_dir=tmp_path / "fresh",
                                            log=lambda m: None)
    kept = [read_episode(path) for path in files]
    kept = [kept[0], kept[2]]  # as test_examples_are_the_kept_episodes...: the clean failure is left out
    rows = [(ep, t) for ep in kept for t in range(0, len(ep.labels), STRIDE)]
    assert fresh.num_states == len(rows)
    for row, (ep, t) in enumerate(rows):
        x, y, angle = ep.states[t, 2:5]
        normalized, clipped = declared.normalize((*ep.states[t, :2], x, y, np.cos(angle), np.sin(angle)))
        assert clipped == 0
        assert torch.equal(fresh.condition[row, :, 1], build_state_frame(normalized.float(), 16, 6, 6))
    assert torch.equal(fresh.condition[:, :, 0], agent_data.condition[:, :, 0])
    # A cache that holds the part under the agent's state input lends its frames: no VAE call, the same data.
    shared = tmp_path / "shared"
    shutil.copytree(work / "pusht_data", shared / "pusht_data")
    calls = []
    encode = pipe.vae.encode
    pipe.vae.encode = lambda *a, **k: calls.append(1) or encode(*a, **k)
    restated = pusht_train.build_state_dataset(pipe, files, stride=STRIDE, cache_dir=shared, log=lambda m: None)
    assert calls == []
    assert torch.equal(restated.condition, fresh.condition) and torch.equal(restated.actions, fresh.actions)
    assert len(list((shared / "pusht_data").glob("*.pt"))) == 2  # the pose part is cached beside the agent's


def test_a_checkpoint_is_given_another_state_input_only_when_asked(state_checkpoint):
    images: list = []  # a saved checkpoint keeps its own latent normalization
    with pytest.raises(TrainingError, match=r"declares the state input .*agent_x.*--redeclare-state"):
        pusht_train.load_for_training(state_checkpoint, 0, images, state_names=POSE_STATE_NAMES)
    pipe = pusht_train.load_for_training(state_checkpoint, 0, images, state_names=POSE_STATE_NAMES, redeclare=True)
    assert declared_state_input(pipe).names == POSE_STATE_NAMES
    same = pusht_train.load_for_training(state_checkpoint, 0, images, state_names=AGENT_STATE_NAMES)
    assert declared_state_input(same).names == AGENT_STATE_NAMES


def test_a_fresh_policy_whose_tokenizer_learned_the_caption_trains_on_parts_cached_under_the_byte_level_one(
        encoded, tmp_path, capsys):
    agent_pipe, files, agent_data, work = encoded
    images = pusht_train.state_normalization_images(files, count=4)
    pipe = pusht_train.load_for_training(None, 0, images, state_names=AGENT_STATE_NAMES, prompt_merges=512)
    assert "the caption, which is now" in capsys.readouterr().out
    assert len(pipe.text_tokenizer) > len(agent_pipe.text_tokenizer) == 260
    tables = pipe.transformer
    assert tables.embed_tokens.num_embeddings == tables.config.vocab_size == len(pipe.text_tokenizer)
    # Only the token tables are new: the VAE, and so the cache key of every part, is the byte-level pipeline's.
    vae = agent_pipe.vae.state_dict()
    assert all(torch.equal(value, vae[key]) for key, value in pipe.vae.state_dict().items())
    shared = tmp_path / "shared"
    shutil.copytree(work / "pusht_data", shared / "pusht_data")
    encoded_frames = []
    encode = pipe.vae.encode
    pipe.vae.encode = lambda x, *a, **k: encoded_frames.append(x.shape[0]) or encode(x, *a, **k)
    data = pusht_train.build_state_dataset(pipe, files, stride=STRIDE, cache_dir=shared, log=lambda m: None)
    pipe.vae.encode = encode
    # The cached part is read, not encoded again: one frame went through the VAE, for the new prefix's branch.
    assert encoded_frames == [1] and len(list((shared / "pusht_data").glob("*.pt"))) == 1
    assert torch.equal(data.condition, agent_data.condition) and torch.equal(data.actions, agent_data.actions)
    assert agent_data.branch.prefix.input_ids.numel() > 250 and data.branch.prefix.input_ids.numel() <= 16
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["--steps", "1", "--batch", "4", "--checkpoint-every", "0", "--log-every", "1"])
    result = fit(pipe, data, args, tmp_path / "policy", tmp_path / "work")
    assert np.isfinite(result["loss_history"][-1]["loss"])
    # A saved policy keeps the init's tokenizer: merges are learned for a fresh one only.
    with pytest.raises(TrainingError, match="--prompt-merges 512 builds a fresh tokenizer"):
        pusht_train.load_for_training(tmp_path / "policy", 0, images, prompt_merges=512)
    with pytest.raises(TrainingError, match="--prompt-merges must be >= 0, got -1"):
        pusht_train.load_for_training(None, 0, images, prompt_merges=-1)


def test_the_evaluators_send_the_ts_true_pose_to_a_pose_model(encoded, tmp_path, recorded_policy):
    from trajectory_ensemble_lab.pusht import evaluate as ev
    from trajectory_ensemble_lab.pusht.bench import Drawer
    from trajectory_ensemble_lab.pusht.sim import read_state

    from trajectory_ensemble_lab.training.pipeline import save_pipeline

    pose = copy.deepcopy(encoded[0])
    pusht_train.declare_state_input(pose, pusht_train.state_input(POSE_STATE_NAMES))
    out = tmp_path / "pose_policy"
    save_pipeline(pose, out, torch.float32)
    pusht_train.write_stats(out, declared_state_input(pose))
    policy = recorded_policy(out)
    assert policy.metadata["state"]["names"] == list(POSE_STATE_NAMES)
    ev.run_episode(policy, 100_000, count=2, reducer="mode", max_steps=8)
    env = make_env(pixels=True)
    obs, _ = env.reset(seed=100_000)
    x, y, angle = read_state(env).block
    first = next(sent for sent in policy.sent if "observation/image" in sent)
    assert np.allclose(first["observation/state"], [*obs["agent_pos"], x, y, np.cos(angle), np.sin(angle)])
    Drawer(policy, 2)(obs["pixels"], seed=1, step=0, session="s", count=2, reducer="mode",
                      agent_pos=np.array([300.0, 40.0]), block=np.array([200.0, 100.0, 0.0]))
    assert np.array_equal(policy.sent[-1]["observation/state"], [300.0, 40.0, 200.0, 100.0, 1.0, 0.0])
    with pytest.raises(ev.PushTError, match=r"takes the T's pose \['block_x', 'block_y', 'block_cos', 'block_sin'\]"):
        request_state(policy.metadata, [1.0, 2.0])
    from trajectory_ensemble_lab.pusht.sensitivity import sensitivity

    before = len(policy.sent)
    probed = sensitivity(policy, np.array([[300.0, 40.0, 200.0, 100.0, 0.0], [100.0, 400.0, 300.0, 250.0, 1.0]]))
    # A pose model is probed on its pose too: five requests per state, and a state_T figure.
    assert probed["states"] == 2 and "state_T" in probed and len(policy.sent) - before == 5 * 2


def test_the_sensitivity_probe_moves_only_the_input_it_changes(state_checkpoint, episodes, recorded_policy):
    from trajectory_ensemble_lab.pusht.sensitivity import sensitivity

    policy = recorded_policy(state_checkpoint)
    _, played = episodes
    states = played[0].states
    # One state is paired with itself: every changed input is the same input, so only the seed moves the chunk.
    alone = sensitivity(policy, states[:1])
    assert alone["states"] == 1 and "state_T" not in alone  # the agent's model takes no T in its state
    assert alone["frame_T"]["mean_px"] == alone["state_agent"]["mean_px"] == 0.0 and alone["seed"]["mean_px"] > 0
    probed = sensitivity(policy, states[::10])
    assert probed["states"] == len(states[::10]) and probed["state_agent"]["mean_px"] > 0
    sent = [obs for obs in policy.sent if "observation/image" in obs]
    assert len(sent) == 4 * (1 + len(states[::10]))  # per state: as it is, frame_T, state_agent, seed
