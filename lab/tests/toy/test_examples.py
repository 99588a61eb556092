"""The toy's training states and their labels: initial, mid-episode, closed-loop and recovery states."""

from __future__ import annotations

import numpy as np

from trajectory_ensemble_lab.toy import examples
from trajectory_ensemble_node.toy import task


def test_training_states_mix_initial_and_mid_episode_states():
    states = [s for seed in range(60) for s in examples.training_states(seed)]
    initial = [s for s in states if np.array_equal(s.robot, s.start)]
    mid = [s for s in states if not np.array_equal(s.robot, s.start)]
    assert len(initial) == 60 and 5 < len(mid) < 40
    assert all(len(task.expert_sides(s)) == 2 for s in initial)
    assert all(len(task.expert_sides(s)) == 1 for s in mid)
    for state in mid:
        for side in task.expert_sides(state):
            assert not task.collides(state, task.expert_path(state, side))


def test_training_examples_default_is_the_original_dataset():
    for seed in range(40):
        labelled = examples.training_examples(seed)
        states = examples.training_states(seed)
        assert [s.robot.tolist() for s, _ in labelled] == [s.robot.tolist() for s in states]
        for (state, chunks), original in zip(labelled, states):
            expected = [task.expert_path(original, side) for side in task.expert_sides(original)]
            assert all(np.array_equal(a, b) for a, b in zip(chunks, expected, strict=True))


def test_closed_loop_states_reach_the_target_with_continuation_labels():
    labelled = [e for seed in range(60) for e in examples.training_examples(seed, closed_loop_states=2)]
    initial = [(s, c) for s, c in labelled if np.array_equal(s.robot, s.start)]
    later = [(s, c) for s, c in labelled if not np.array_equal(s.robot, s.start)]
    assert len(initial) == 60 and all(len(c) == 2 for _, c in initial)
    assert len(later) >= 120 and all(len(c) == 1 for _, c in later)
    progress = [np.dot(s.robot - s.start, s.target - s.start) / np.sum((s.target - s.start) ** 2) for s, _ in later]
    assert max(progress) > 0.97  # at the target, not only partway
    at_target = [c[0] for s, c in later if np.linalg.norm(s.robot - s.target) < 0.05]
    assert at_target and all(np.allclose(c, c[-1]) for c in at_target)
    for state, chunks in later:
        assert not task.collides(state, chunks[0])
        assert np.allclose(chunks[0][-1], state.target)


def test_approach_is_time_consistent_and_stays_at_the_target():
    scene = task.make_scene(7).with_robot(task.make_scene(7).target + np.array([0.3, 0.0]))
    chunk = examples.approach(scene, speed=0.1)
    assert np.allclose(chunk[0], scene.target + [0.2, 0.0]) and np.allclose(chunk[2:], scene.target)
    # Planning again after one executed action gives the rest of the same approach.
    again = examples.approach(scene.with_robot(chunk[0]), speed=0.1)
    assert np.allclose(again[:-1], chunk[1:])


def test_recovery_states_surround_the_target_with_straight_approach_labels():
    recovery = []
    for seed in range(60):
        base = examples.training_examples(seed, closed_loop_states=1)
        both = examples.training_examples(seed, closed_loop_states=1, recovery_states=1)
        # Recovery states come on top of the others, which are unchanged.
        assert all(np.array_equal(a.robot, b.robot) for (a, _), (b, _) in zip(base, both[: len(base)], strict=True))
        recovery.extend(both[len(base):])
    assert len(recovery) >= 55
    distances = np.array([np.linalg.norm(s.robot - s.target) for s, _ in recovery])
    assert distances.min() >= examples.RECOVERY_DISTANCE[0] and distances.max() <= examples.RECOVERY_DISTANCE[1]
    # Off any expert path: positions all around the target, not only on the side the robot comes from.
    angles = [np.arctan2(*(s.robot - s.target)[::-1]) for s, _ in recovery]
    assert np.histogram(angles, bins=4, range=(-np.pi, np.pi))[0].min() > 0
    for state, chunks in recovery:
        (chunk,) = chunks
        assert not task.collides(state, chunk)
        assert np.allclose(chunk[-1], state.target)
        steps = np.linalg.norm(np.diff(np.vstack([state.robot, chunk]), axis=0), axis=1)
        assert np.all(steps <= np.linalg.norm(state.target - state.start) / task.HORIZON + 1e-9)
