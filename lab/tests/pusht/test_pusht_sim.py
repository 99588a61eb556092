"""``trajectory-ensemble sim --env pusht`` against a real node serving a tiny untrained PushT checkpoint (the trainer's
own builder, 0 steps; as ``test_pusht_eval.py``), over DDS on sim time: one short episode, every goal succeeds, every
goal after the first continues the executing chunk, each chunk takes over exactly 2 steps after its goal (the fixed
delay: counts and events, never wall time), the executed targets are env pixels and the coverage is the env's own.
Without the lab, ``--env pusht`` exits 2 and says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gym_pusht")

from trajectory_ensemble_lab.pusht import VALIDATION_SEED_BASE
from trajectory_ensemble_lab.pusht import ros_world
from trajectory_ensemble_lab.pusht.sim import make_env
from trajectory_ensemble_node.cli.dispatch import main
from trajectory_ensemble_node.demo import sim

STEPS = 30
DELAY = 2
EXECUTE = 8


def _flags(out: Path) -> list[str]:
    # Real time with a fixed delay: the sim stops its clock while a chunk is computed, so the run does not depend on
    # how loaded the machine is.
    return ["sim", "--env", "pusht", "--episodes", "1", "--step-budget", str(STEPS), "--execute", str(EXECUTE),
            "--fixed-delay", str(DELAY), "--real-time-factor", "1.0", "--candidates", "2", "--json", str(out)]


@pytest.mark.ros
@pytest.mark.slow
def test_one_pusht_episode_through_the_node_continues_its_chunks_in_env_pixels(checkpoint, tmp_path, ros_domain_id,
                                                                                capsys):
    pytest.importorskip("rclpy")
    pytest.importorskip("trajectory_ensemble_msgs")
    from _node_harness import serve_node

    flags = _flags(tmp_path / "sim.json")
    settings = ros_world.settings_from(sim_args(flags))
    overrides = {**ros_world.node_params(checkpoint, settings, num_inference_steps=2, candidate_count=2),
                 "max_observation_age_s": 30.0}  # frame age is not what this test measures; the machine is loaded
    for _node, _client in serve_node(tmp_path, ros_domain_id, overrides):
        assert main(flags) == 0
    assert "sim --env pusht: success" in capsys.readouterr().out
    doc = json.loads((tmp_path / "sim.json").read_text())
    assert {"date", "commit", "settings", "summary", "episodes"} <= set(doc)
    assert doc["settings"]["fps"] == 10.0 and doc["settings"]["horizon"] == 16
    (episode,) = doc["episodes"]
    assert episode["env_seed"] == VALIDATION_SEED_BASE
    assert episode["steps"] == len(episode["actions"]) == STEPS or episode["success"]
    # Every goal succeeded (the warm-up's is not the episode's); each after the first continued the executing chunk.
    goals = episode["goals"]
    assert len(goals) >= 3 and all(g["status"] == "SUCCEEDED" for g in goals), goals
    assert goals[0]["reset_context"] and not any(g["reset_context"] for g in goals[1:])
    assert episode["continuity"][1:] == ["continued"] * (len(goals) - 1)
    assert all(g["continued"] and g["frozen_actions"] == DELAY for g in goals[1:])
    # Each later chunk took over exactly DELAY steps after its goal, at its row DELAY.
    later = [s for s in episode["switches"] if s["chunk"] > 0]
    assert len(later) == len(goals) - 1
    for s in later:
        goal = goals[s["chunk"]]
        assert s["arrival_s"] == pytest.approx(goal["sent_s"] + DELAY * 0.1, abs=1e-9)
        assert s["first_row"] == DELAY
    # Targets in env pixels (denormalized by action_stats.json), not the model's [-1, 1].
    actions = np.asarray(episode["actions"])
    assert actions.shape == (episode["steps"], 2) and np.abs(actions).max() > 2.0
    # The coverage is the env's own: the executed targets replayed in a fresh env give it again, and the same poses.
    env = make_env(pixels=True)
    env.reset(seed=episode["env_seed"])
    replay = [env.step(np.asarray(a, dtype=np.float32)) for a in episode["actions"]]
    assert episode["coverage"] == pytest.approx([float(r[4]["coverage"]) for r in replay], abs=1e-12)
    assert episode["max_coverage"] == max(episode["coverage"])
    summary = doc["summary"]
    assert summary["episodes"] == 1 and summary["goals_failed"] == 0 and summary["continued_fraction"] == 1.0
    low, high = summary["success_rate_ci95"]
    assert 0.0 <= low <= summary["success_rate"] <= high <= 1.0


def sim_args(flags: list[str]):
    import argparse

    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    return parser.parse_args(flags[1:])


def test_sim_env_pusht_without_the_lab_exits_2_and_says_so(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, sim.PUSHT_MODULE, None)  # the import fails as it does without the lab
    assert main(_flags(tmp_path / "sim.json")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: sim --env pusht plays gym_pusht/PushT-v0 through the lab") and "--env toy" in err


@pytest.mark.parametrize(("flags", "says"), [
    (["--step-budget", "301"], "--step-budget must be in 1..300"),
    (["--scene-seed", "99999", "--episodes", "2"], "leaves the validation starts"),
    (["--start-node"], "--start-node starts the toy model"),
])
def test_a_refused_pusht_setting_exits_2_quoting_it(flags, says, tmp_path, capsys):
    assert main(["sim", "--env", "pusht", *flags, "--json", str(tmp_path / "x.json")]) == 2
    assert says in capsys.readouterr().err
