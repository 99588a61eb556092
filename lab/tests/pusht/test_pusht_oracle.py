"""The PushT state oracle: its state-only data (DART labels are the expert's clean targets, not what was sent), a
few training steps on tiny data that resume, and one closed-loop episode through the product's reducers."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

from trajectory_ensemble_lab.pusht import cli
from trajectory_ensemble_lab.pusht.demos import DartNoise, run_episode
from trajectory_ensemble_lab.pusht.expert import PushTExpert
from trajectory_ensemble_lab.pusht.oracle import (CHUNK, OracleConfig, TrainSettings, build_examples, load_oracle,
                                                  normalize_actions, train)
from trajectory_ensemble_lab.pusht.mode_core import rules as mode_core_rules
from trajectory_ensemble_lab.pusht.oracle_cli import main as oracle_main
from trajectory_ensemble_lab.pusht.oracle_eval import Execution, evaluate, paired_versus, reduce_group
from trajectory_ensemble_lab.pusht.sim import PushTError, make_env, read_state
from trajectory_ensemble_lab.pusht.state_demos import read_episode, read_episodes, write_episode
from trajectory_ensemble_lab.training import TrainingError
from trajectory_ensemble_node.errors import UnknownReducerError
from trajectory_ensemble_node.reducers import configured_reducer, get_reducer

START, EXPERT, STEPS = 10, 2, 40


@pytest.fixture(scope="module")
def tiny_episodes():
    """A clean and a DART episode of start 10, 40 steps each."""
    return [run_episode(START, 0, max_steps=STEPS), run_episode(START, EXPERT, max_steps=STEPS, dart=DartNoise(6.0))]


def test_dart_labels_are_the_experts_clean_targets_while_the_sent_actions_differ(tiny_episodes):
    noisy = tiny_episodes[1]
    assert noisy.dart_sigma == 6.0 and noisy.labels.shape == noisy.actions.shape == (STEPS, 2)
    sent_off = np.linalg.norm(noisy.actions - noisy.labels, axis=1)
    assert (sent_off > 0).all() and 2.0 < sent_off.mean() < 30.0
    # Replay the sent actions in a fresh env beside a fresh expert: at every visited state the expert's own target
    # is the recorded label (the noise never reaches the expert), and the states are the recorded ones.
    env = make_env()
    env.reset(seed=START)
    expert = PushTExpert([EXPERT, START], max_steps=STEPS)
    for k in range(STEPS):
        state = read_state(env)
        np.testing.assert_allclose(np.concatenate([state.agent, state.block]), noisy.states[k], atol=1e-9)
        np.testing.assert_array_equal(expert.act(state), noisy.labels[k])
        env.step(noisy.actions[k])
    clean = run_episode(START, EXPERT, max_steps=STEPS)
    np.testing.assert_array_equal(clean.labels, clean.actions)
    np.testing.assert_array_equal(clean.actions[0], noisy.labels[0])  # same state, same expert seed: same plan
    assert clean.dart_sigma == 0.0


def test_state_only_episodes_round_trip_and_the_cli_resumes(tiny_episodes, tmp_path, capsys):
    for ep in tiny_episodes:
        back = read_episode(write_episode(tmp_path / "eps", ep))
        for name in ("states", "actions", "labels"):
            np.testing.assert_allclose(getattr(back, name), getattr(ep, name), atol=1e-3)
        assert (back.env_seed, back.expert_seed, back.success, back.route, back.dart_sigma) == \
            (ep.env_seed, ep.expert_seed, ep.success, ep.route, ep.dart_sigma)
    argv = ["--states-only", "--episodes", "1", "--seed", "11", "--expert-seeds", "0,2", "--dart-seeds", "2",
            "--dart-sigma", "6", "--max-steps", "12", "--out", str(tmp_path / "demos")]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out
    assert "[2/2]" in first and "dart 6 px" in first
    assert [(e.env_seed, e.expert_seed) for e in read_episodes(tmp_path / "demos" / "states")] == [(11, 0), (11, 2)]
    assert cli.main(argv) == 0  # resumed: both written, none played again; the record still covers them
    assert "[1/2]" not in capsys.readouterr().out
    assert json.loads((tmp_path / "demos" / "results.json").read_text())["episodes_tried"] == 2
    assert cli.main(argv[:-2] + ["--one-bag", "--out", str(tmp_path / "x")]) == 1  # no bags in state-only mode


def test_examples_pad_the_tail_and_refuse_validation_starts(tiny_episodes):
    ex = build_examples(tiny_episodes, OracleConfig(obs_steps=2, width=32, blocks=1))
    used = [ep for ep in tiny_episodes if ep.success or ep.dart_sigma > 0]
    assert len(ex.chunks) == sum(len(ep.labels) for ep in used) and ex.obs.shape[1] == 12
    assert ex.dart_episodes == 1 and ex.dart_examples == STEPS
    last = ex.chunks[-1]
    np.testing.assert_allclose(last, normalize_actions(np.repeat(tiny_episodes[1].labels[-1:], CHUNK, 0)), atol=1e-6)
    np.testing.assert_allclose(ex.obs[-STEPS][:6], ex.obs[-STEPS][6:])  # the first state, repeated as its history
    import dataclasses
    with pytest.raises(TrainingError, match="100000"):
        build_examples([dataclasses.replace(tiny_episodes[0], env_seed=100_000)], OracleConfig())


def test_the_oracle_trains_resumes_and_plays_an_episode_through_the_reducers(tiny_episodes, tmp_path):
    config = OracleConfig(width=64, blocks=1)
    settings = TrainSettings(steps=30, batch=16, warmup=5, checkpoint_every=20)
    examples = build_examples(tiny_episodes, config)
    first = train(examples, config, TrainSettings(**{**settings.__dict__, "steps": 20}), tmp_path,
                  log=lambda line: None)
    assert first["step"] == 20
    with pytest.raises(TrainingError, match="another shape"):
        train(examples, config, TrainSettings(**{**settings.__dict__, "lr": 5e-4}), tmp_path, log=lambda line: None)
    lines: list[str] = []
    record = train(examples, OracleConfig(width=64, blocks=1), settings, tmp_path, log=lines.append)
    assert lines[0] == "the run's end moves from step 20 to 30" and lines[1].startswith("resumed from")
    assert record["step"] == 30 and [h["from_step"] for h in record["data_history"]] == [0, 20]
    net, saved = load_oracle(tmp_path)
    assert saved["examples"] == len(examples.chunks) and np.isfinite(saved["loss"])
    # One short episode per method, paired: every method's first group is the same draw.
    result = evaluate(net, [100_000], [0], ("single", "mode"), Execution(count=4, max_steps=16), log=lambda line: None)
    for method, eps in result.episodes.items():
        assert len(eps) == 1 and eps[0].steps == 16 and eps[0].requests == 2 and 0.0 <= eps[0].max_coverage <= 1.0
    versus = result.figures()["versus_single"]["mode"]
    assert versus["episodes"] == 1
    # A rule being measured plays under its own label, paired with the same draws; named rules are checked first.
    table = mode_core_rules([0.35])
    ruled = evaluate(net, [100_000], [0], ("single", "core 0.35", "mode"), Execution(count=4, max_steps=16),
                     log=lambda line: None, rules=table)
    ruled_ep, named_ep = asdict(ruled.episodes["core 0.35"][0]), asdict(result.episodes["mode"][0])
    # The shipped fraction plays the same episode; gym-pusht's coverage of one pose can differ by an ulp between envs.
    assert ruled_ep.pop("max_coverage") == pytest.approx(named_ep.pop("max_coverage"), abs=1e-9)
    assert ruled_ep == named_ep
    with pytest.raises(UnknownReducerError):
        evaluate(net, [100_000], [0], ("single", "core 0.2"), Execution(count=4, max_steps=16), rules=table)
    with pytest.raises(ValueError, match="share no"):
        paired_versus(result.episodes["single"], [])


def test_reducers_are_the_products_by_name_on_normalized_candidates():
    group = torch.tensor([[[0.1, 0.1]] * 4, [[0.12, 0.1]] * 4, [[-0.9, 0.5]] * 4])
    torch.testing.assert_close(reduce_group("mode", group), get_reducer("mode")(group))
    torch.testing.assert_close(reduce_group("single", group), group[0])
    torch.testing.assert_close(reduce_group("mode@0.05", group), configured_reducer("mode", 0.05)(group))
    torch.testing.assert_close(reduce_group("mode@0.05", group), group[:2].mean(0))  # the two close ones
    with pytest.raises(PushTError, match="previous chunk"):
        reduce_group("mode_continuity", group)


def test_eval_refuses_training_starts(tmp_path):
    assert oracle_main(["eval", "--checkpoint", str(tmp_path), "--seed", "5"]) == 1
    assert oracle_main(["eval", "--checkpoint", str(tmp_path)]) == 1  # no oracle there: named, not a traceback


def test_eval_split_by_method_merges_into_one_record(tiny_episodes, tmp_path):
    config = OracleConfig(width=32, blocks=1)
    train(build_examples(tiny_episodes, config), config, TrainSettings(steps=5, batch=8, warmup=2), tmp_path / "run",
          log=lambda line: None)
    common = ["eval", "--checkpoint", str(tmp_path / "run"), "--starts", "1", "--noise-seeds", "3", "--count", "2",
              "--max-steps", "8"]
    assert oracle_main(common + ["--reducers", "single", "--json", str(tmp_path / "a.json")]) == 0
    assert oracle_main(common + ["--reducers", "mean,mode", "--json", str(tmp_path / "b.json")]) == 0
    assert oracle_main(["merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json",
                    str(tmp_path / "m.json")]) == 0
    merged = json.loads((tmp_path / "m.json").read_text())
    assert list(merged["methods"]) == ["single", "mean", "mode"] and set(merged["versus_single"]) == {"mean", "mode"}
    assert merged["commit"] and merged["date"] and "| `mode`@2 |" in (tmp_path / "m.md").read_text()
    assert oracle_main(["merge", str(tmp_path / "a.json"), str(tmp_path / "a.json"), "--json",
                    str(tmp_path / "x.json")]) == 1  # one method twice: refused
    assert oracle_main(["compare", str(tmp_path / "a.json"), str(tmp_path / "m.json"), "--json",
                        str(tmp_path / "c.json")]) == 0  # the same episodes: no difference
    compared = json.loads((tmp_path / "c.json").read_text())["methods"]
    assert list(compared) == ["single"] and compared["single"]["coverage_diff_mean"] == 0.0
