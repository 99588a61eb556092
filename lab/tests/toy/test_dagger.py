"""DAgger for the toy policy (``train-toy --dagger-rounds``): the expert's relabelling of visited states, rollouts
through the bench's serving path on training scenes, aggregation, and one whole round end to end."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

from trajectory_ensemble_node.toy import load_toy_pipeline, task, toy_pipeline_dir
from trajectory_ensemble_node.toy.episodes import Episode
from trajectory_ensemble_lab.toy import dagger
from trajectory_ensemble_lab.toy import train as toy_train
from trajectory_ensemble_lab.toy.data import build_dataset, concat_datasets


@pytest.mark.parametrize("seed", [0, 3, 11])
def test_on_a_detour_the_relabel_is_the_expert_continuation(seed):
    scene = task.make_scene(seed)
    for side_sign in (1, -1):
        for progress in (1.0, 2.5, 5.0, 8.0, 9.5):
            position = task.expert_curve(scene, side_sign, np.array([progress / task.HORIZON]))[0]
            chunks = dagger.relabel(scene, position)
            expected = task.expert_continuation(scene, side_sign, min(progress, task.HORIZON))
            assert len(chunks) == 1
            assert np.abs(chunks[0] - expected).max() < 0.02  # the progress grid is 1/50 of a step


def test_at_the_start_both_detours_are_kept_and_they_pass_on_opposite_sides():
    for seed in range(5):
        scene = task.make_scene(seed)
        chunks = dagger.relabel(scene, scene.robot)
        assert len(chunks) == 2
        assert {task.side(scene, chunk) for chunk in chunks} == {1, -1}
        assert all(not task.collides(scene, chunk) for chunk in chunks)


def test_off_the_detour_the_relabel_rejoins_it_and_is_time_consistent():
    scene = task.make_scene(4)
    on = task.expert_curve(scene, 1, np.array([3.0 / task.HORIZON]))[0]
    position = on + np.array([0.0, 0.08])
    chunk = dagger.relabel(scene, position)[0]
    state = scene.with_robot(position)
    assert not task.collides(state, chunk)
    assert np.linalg.norm(chunk[0] - position) < 0.4
    # Executing s actions and relabelling from there continues the same chunk (up to the progress grid).
    s = task.HORIZON // 2
    again = dagger.relabel(scene, chunk[s - 1])[0]
    assert np.abs(again[: task.HORIZON - s] - chunk[s:]).max() < 0.03
    # The robot's offset is gone by the time the chunk ends: it ends at the target.
    assert task.final_error(state, chunk) < 1e-6


def test_near_the_target_the_relabel_goes_to_it_and_stays():
    scene = task.make_scene(2)
    for offset in ([0.0, 0.2], [0.15, -0.1], [-0.12, 0.0]):
        position = scene.target + np.array(offset)
        chunks = dagger.relabel(scene, position)
        assert len(chunks) == 1
        assert np.linalg.norm(chunks[0][-1] - scene.target) < 1e-6
        steps = np.linalg.norm(np.diff(task.polyline(position, chunks[0]), axis=0), axis=1)
        assert steps.max() < 0.35  # the detour's speed plus the return speed, no jump


def test_a_robot_in_collision_gets_no_label_and_no_label_leads_closer_to_the_obstacle():
    scene = task.make_scene(6)
    inside = scene.obstacle + np.array([scene.radius, 0.0])
    assert dagger.relabel(scene, inside) == []
    rng = np.random.default_rng(0)
    for _ in range(200):
        position = rng.uniform(-0.9, 0.9, size=2)
        own = np.linalg.norm(position - scene.obstacle) - scene.radius
        for chunk in dagger.relabel(scene, position):
            assert task.clearance(scene.with_robot(position), chunk) >= min(task.EXPERT_CLEARANCE, own) - 0.01


def test_visited_keeps_every_stride_steps_without_the_start():
    episode = Episode(positions=[np.array([0.1 * t, 0.0]) for t in range(7)])
    assert [t for t, _ in dagger.visited(episode, 2)] == [2, 4, 6]
    assert [t for t, _ in dagger.visited(episode, 1)] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--dagger-methods", "guided_mode,teleport", "must name closed-loop methods"),
    ("--dagger-delays", "0,9", "must be delays in [0, 4], got '0,9'"),
    ("--dagger-delays", "x", "must be delays in [0, 4], got 'x'"),
    ("--dagger-scenes", "0", "must be an integer >= 1, got '0'"),
    ("--dagger-stride", "0", "must be an integer >= 1, got '0'"),
])
def test_bad_dagger_options_are_refused_with_the_value(option, value, message, capsys):
    parser = argparse.ArgumentParser()
    toy_train.add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([option, value])
    assert message in capsys.readouterr().err


def test_rollouts_visit_training_scenes_through_the_serving_path():
    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel

    torch.set_num_threads(1)
    model = Cosmos3ActionModel(load_toy_pipeline(), max_batch_candidates=64)
    visits, episodes = dagger.rollout(model, [5], ["naive_async"], [2], round_index=1, stride=2, log=lambda m: None)
    episode = episodes["naive_async"][2][0]
    assert len(episodes["naive_async"][2]) == 1 and episode.steps >= 1
    assert visits and all(v.seed == 5 and v.method == "naive_async" and v.delay == 2 for v in visits)
    for visit in visits:
        assert visit.step % 2 == 0 and np.array_equal(visit.position, episode.positions[visit.step])
    kept = [v.position for v in visits]
    assert all(np.linalg.norm(a - b) >= dagger.DEDUP_DISTANCE for i, a in enumerate(kept) for b in kept[:i])
    labelled = dagger.label_visits(visits)
    assert labelled and all(state.seed == task.TRAIN_SEED_BASE + 5 for state, _ in labelled)


def test_concat_datasets_keeps_each_state_with_its_own_examples():
    pipe = load_toy_pipeline()
    one = build_dataset(pipe, 1, mid_probability=0.0, log=lambda m: None)
    both = concat_datasets([one, one])
    assert both.num_states == 2 and len(both.actions) == 2 * len(one.actions)
    assert both.options == [[0, 1], [2, 3]]
    assert torch.equal(both.state_of, torch.tensor([0, 0, 1, 1]))
    assert torch.equal(both.clips[2:], one.clips) and torch.equal(both.condition[1:], one.condition)
    with pytest.raises(ValueError, match="needs at least one dataset"):
        concat_datasets([])


def test_one_dagger_round_end_to_end_and_a_rerun_resumes(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    toy_train.add_arguments(parser)
    out = tmp_path / "policy"
    argv = ["--init", str(toy_pipeline_dir()), "--scenes", "1",
            "--mid-probability", "0", "--steps", "0", "--batch", "2", "--log-every", "1", "--checkpoint-every", "0",
            "--dagger-rounds", "1", "--dagger-scenes", "1", "--dagger-methods", "naive_async", "--dagger-delays", "2",
            "--dagger-steps", "2", "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    assert toy_train.run(parser.parse_args(argv)) == 0
    report = json.loads((tmp_path / "work" / "dagger.json").read_text())
    first = report["rounds"][1]
    assert [r["round"] for r in report["rounds"]] == [0, 1]
    assert first["scenes"] == [0, 0] and first["visits"] >= first["new_states"] > 0
    assert set(first["rollouts"]) == {"naive_async"} and "success_rate" in first["rollouts"]["naive_async"]["2"]
    assert first["states"] == 1 + first["new_states"]  # aggregated with the base dataset
    assert len(first["loss_history"]) == 2
    pipe = load_toy_pipeline(path=out)  # the last round's policy, saved where --out says
    assert pipe.transformer.config.action_dim == 8
    capsys.readouterr()
    assert toy_train.run(parser.parse_args(argv)) == 0
    assert "round 1 already done" in capsys.readouterr().out
