"""``pusht-dagger``: the policy's episode is replayed into its full states, the expert takes over from the exact
state at every ``--every``-th step (its first state is the policy's), each takeover is a state-only episode that
``train-pusht --states`` keeps, a stopped round resumes without playing a start again, and only demonstration starts
are played."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trajectory_ensemble_lab.pusht import dagger
from trajectory_ensemble_lab.pusht.oracle import training_episodes
from trajectory_ensemble_lab.pusht.sim import PushTError
from trajectory_ensemble_lab.pusht.state_demos import read_episodes

START, EVERY, HORIZON = 10, 60, 5


@pytest.fixture(scope="module")
def policy(checkpoint, recorded_policy):
    return recorded_policy(checkpoint)


@pytest.fixture(scope="module")
def round_one(policy, tmp_path_factory):
    out = tmp_path_factory.mktemp("dagger")
    result = dagger.dagger_round(policy, [START], out, every=EVERY, horizon=HORIZON, count=2, log=lambda m: None)
    return out, result


def test_the_expert_takes_over_from_the_policys_own_states(round_one):
    out, result = round_one
    (entry,) = result["episodes"]
    steps = entry["steps"]
    expected = [s for s in range(0, min(steps, 300), EVERY)]
    assert [t["step"] for t in entry["takeovers"]] == expected and result["takeovers"] == len(expected) >= 2
    record = json.loads((out / "episodes" / f"{START:06d}.json").read_text())
    assert record == entry
    episodes = read_episodes(out / "states")
    assert [ep.takeover_step for ep in episodes] == expected
    assert [ep.expert_seed for ep in episodes] == [dagger.TAKEOVER_SEED_BASE + s for s in expected]
    assert training_episodes(episodes) == episodes  # every takeover trains, success or not


def test_a_takeover_starts_at_the_replayed_state_and_labels_are_the_experts_clean_targets(policy, round_one):
    out, _ = round_one
    from trajectory_ensemble_lab.pusht.evaluate import run_episode

    record = run_episode(policy, START, count=2, reducer="mode", max_steps=EVERY + 1)
    states = dagger.visited_states(START, record.actions)
    # The replay is the episode: the T's poses after each step are the ones the episode recorded, bit for bit.
    assert [s.block.tolist() for s in states[1:]] == record.poses
    episodes = read_episodes(out / "states")
    for ep in episodes[:2]:
        start_state = states[ep.takeover_step]
        assert np.allclose(ep.states[0], np.concatenate([start_state.agent, start_state.block]), atol=1e-4)
        assert np.array_equal(ep.labels, ep.actions) and ep.dart_sigma == 0.0
        assert 1 <= len(ep.labels) <= HORIZON and len(ep.states) == len(ep.labels) + 1


def test_a_stopped_round_resumes_without_playing_a_start_again(policy, round_one):
    out, first = round_one
    before = len(policy.sent)
    again = dagger.dagger_round(policy, [START], out, every=EVERY, horizon=HORIZON, count=2, log=lambda m: None)
    assert len(policy.sent) == before and again["episodes"] == first["episodes"]


def test_validation_starts_are_never_played(policy, tmp_path):
    with pytest.raises(PushTError, match="got start 100000"):
        dagger.dagger_round(policy, [100_000], tmp_path)
