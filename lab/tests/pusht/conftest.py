"""The PushT tests' shared fixtures: both expert seeds on start 10 (the committed bag's start), with the env's frames
(about 5 s on a loaded core), and a tiny untrained PushT checkpoint, each built once per session."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trajectory_ensemble_lab.pusht.recording import TEST_BAG_START


@pytest.fixture(scope="session")
def pusht_pair():
    """``[Episode(10, expert 0), Episode(10, expert 1)]`` with frames: two successes that go around the T in
    different ways."""
    from trajectory_ensemble_lab.pusht.demos import run_episode

    env_seed, expert_seeds = TEST_BAG_START
    return [run_episode(env_seed, e, frames=True) for e in expert_seeds]


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory) -> Path:
    """An untrained PushT checkpoint as train-pusht writes one (pipeline + action_stats.json), one layer of 64."""
    import torch

    from trajectory_ensemble_lab.pusht import train as pusht_train
    from trajectory_ensemble_lab.pusht.recording import TEST_BAG
    from trajectory_ensemble_lab.training.pipeline import fresh_pipeline, save_pipeline

    out = tmp_path_factory.mktemp("pusht_checkpoint") / "policy"
    config = dataclasses.replace(pusht_train.PUSHT_CONFIG, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=2,
                                 intermediate_size=128)
    pipe = fresh_pipeline(config, 0, pusht_train.normalization_images([TEST_BAG], count=2), pusht_train.PUSHT_FORMAT,
                          log=lambda message: None)
    save_pipeline(pipe, out, torch.float16)
    pusht_train.write_stats(out)
    return out


@pytest.fixture(scope="session")
def recorded_policy():
    """Open a PushT checkpoint in process (``OpenPIPolicy``: 2 denoising steps, 2 candidates) whose ``infer`` keeps
    every request it is sent in ``policy.sent``; every policy opened is closed at the end of the session."""
    from trajectory_ensemble_node.serving.params import validate
    from trajectory_ensemble_lab.pusht.evaluate import InProcessPolicy, serve_params

    opened = []

    def open_policy(checkpoint: Path):
        policy = InProcessPolicy(validate(serve_params(checkpoint, num_inference_steps=2, candidate_count=2)))
        sent: list = []
        infer = policy.infer

        def recording(obs):
            sent.append(obs)
            return infer(obs)

        policy.infer, policy.sent = recording, sent
        opened.append(policy)
        return policy

    yield open_policy
    for policy in opened:
        policy.close()
