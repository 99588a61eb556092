"""PushT demonstrations as bags: they round-trip through the project's own bag reader (the reference actions are
the expert's, the frames the env's), the replay tool takes them as it takes the toy's, the committed bag is what the
expert does today, and ``pusht-demos`` keeps successes only."""

from __future__ import annotations

import json

import numpy as np

from trajectory_ensemble_node.replay import bags
from trajectory_ensemble_node.replay.playback import ReplayOptions, resolve_inputs
from trajectory_ensemble_node.replay.reference import read_reference
from trajectory_ensemble_lab.pusht import cli
from trajectory_ensemble_lab.pusht.recording import (CLOCK_TOPIC, JOINT_NAMES, PERIOD_NS, TEST_BAG, read_demo_bag,
                                                     write_demo_bag)


def _same(recorded, ep):
    np.testing.assert_array_equal(recorded.frames, ep.frames)
    np.testing.assert_array_equal(recorded.actions, ep.actions.astype(np.float64))
    np.testing.assert_array_equal(recorded.agent, ep.agent_path)
    assert (recorded.meta["env_seed"], recorded.meta["expert_seed"]) == (ep.env_seed, ep.expert_seed)
    assert recorded.meta["route"] == ep.route.as_dict() and recorded.meta["success"] is True


def test_a_demonstration_bag_round_trips_through_the_project_bag_reader(pusht_pair, tmp_path):
    info = write_demo_bag(tmp_path / "bag", pusht_pair)
    episodes = read_demo_bag(tmp_path / "bag")
    assert len(episodes) == 2
    for recorded, ep in zip(episodes, pusht_pair):
        _same(recorded, ep)
        assert recorded.frames.shape[1:] == (96, 96, 3) and recorded.frames.dtype == np.uint8
    counts = {t.name: (t.msgtype, t.count) for t in info.topics}
    frames = sum(len(ep.frames) for ep in pusht_pair)
    assert counts == {bags.DEMO_IMAGE_TOPIC: (bags.IMAGE_TYPE, frames),
                      bags.DEMO_STATE_TOPIC: (bags.STATE_TYPE, frames),
                      CLOCK_TOPIC: ("rosgraph_msgs/msg/Clock", frames),
                      bags.DEMO_INSTRUCTION_TOPIC: (bags.STRING_TYPE, 2),
                      bags.DEMO_REFERENCE_TOPIC: (bags.JOINT_TRAJECTORY_TYPE, 2)}
    # The replay tool maps it as it maps the toy demonstrations, and reads the reference with its own reader:
    # action k of an episode stands at (k + 1) / 10 s after the episode's first frame.
    inputs = resolve_inputs(bags.bag_info(tmp_path / "bag"), ReplayOptions(bag=tmp_path / "bag"))
    assert set(inputs) == {bags.DEMO_IMAGE_TOPIC, bags.DEMO_STATE_TOPIC, bags.DEMO_INSTRUCTION_TOPIC}
    reference = read_reference(tmp_path / "bag", bags.DEMO_REFERENCE_TOPIC)
    assert reference.names == JOINT_NAMES
    second = episodes[1]
    times = second.first_frame_ns + (np.arange(len(second.actions)) + 1) * PERIOD_NS
    np.testing.assert_allclose(reference.sample([0, 1], times), second.actions, atol=1e-9)


def test_the_committed_bag_is_what_the_expert_does_today(pusht_pair):
    episodes = read_demo_bag(TEST_BAG)
    assert len(episodes) == 2
    for recorded, ep in zip(episodes, pusht_pair):
        _same(recorded, ep)
    size = sum(f.stat().st_size for f in TEST_BAG.iterdir())
    assert size < 1_000_000


def test_pusht_demos_keeps_only_the_successes(tmp_path, capsys):
    # Start 14 with the step cap at 60: expert seed 1 succeeds in 55 steps, expert seed 0 needs 75 and fails.
    out = tmp_path / "demos"
    assert cli.main(["--episodes", "1", "--seed", "14", "--max-steps", "60", "--out", str(out),
                     "--json", str(tmp_path / "record.json")]) == 0
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["kept"] == [[14, 1]] and [f[:2] for f in record["failed"]] == [[14, 0]]
    assert record["episodes_tried"] == 2 and record["successes"] == 1 and record["success_rate"] == 0.5
    assert record["multimodality"]["starts"] == 1
    assert sorted(p.name for p in (out / "bags").iterdir()) == ["pusht_000014_1"]
    (kept,) = read_demo_bag(out / "bags" / "pusht_000014_1")
    assert kept.meta["success"] and kept.meta["coverage"] > 0.95 and len(kept.actions) == 55
    lines = [json.loads(line) for line in (out / "demos.jsonl").read_text().splitlines()]
    assert [(line["expert_seed"], line["success"]) for line in lines] == [(0, False), (1, True)]
    assert json.loads((out / "results.json").read_text())["kept"] == [[14, 1]]
    assert "success 1/2" in capsys.readouterr().out


def test_pusht_demos_refuses_bad_settings_with_a_code(tmp_path, capsys):
    assert cli.main(["--episodes", "0", "--out", str(tmp_path / "x")]) == 1
    assert "INVALID_PARAMETERS (52): --episodes must be >= 1" in capsys.readouterr().err
    (tmp_path / "full" / "bags" / "old").mkdir(parents=True)
    assert cli.main(["--episodes", "1", "--out", str(tmp_path / "full")]) == 1
    assert "holds bags already" in capsys.readouterr().err
