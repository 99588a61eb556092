"""A corrupt message inside a bag is a bad bag, not a regression (issue 45, row 5).

Before: the replay gate met a message it could not deserialize mid-run, printed a ``rosbags`` ``SerdeError``
traceback and exited 1, which its docs define as "a goal failed or a limit was exceeded". Now every message the run
reads is deserialized up front (``replay/bag_check.py``), before the node is contacted: exit 2, the topic and the
message's index named, no traceback, no goal sent. ``calibrate --bag`` checks its bags the same way.

The bags are real rosbag2 folders written with the ``rosbags`` writer (``bags.BagRecorder``); one image's CDR bytes
are cut short, as a recorder killed mid-write or a damaged disk leaves them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from trajectory_ensemble_node.replay import bags
from trajectory_ensemble_node.replay.bag_check import CorruptMessageError, check_messages, check_replay_bag
from trajectory_ensemble_node.replay.playback import ReplayOptions

IMAGE_TOPIC = "/camera/image_raw"
REFERENCE_TOPIC = "/reference/actions"
BAD_INDEX = 3
FRAMES = 6
START_NS = 1_000_000_000
STEP_NS = 200_000_000


def write_bag(path: Path, *, corrupt_index: int | None = BAD_INDEX, storage: str = "mcap") -> Path:
    """Six 32x32 frames and a reference action per frame; frame ``corrupt_index`` truncated to 40 bytes."""
    rgb = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    with bags.BagRecorder(path, storage) as recorder:
        for i in range(FRAMES):
            t = START_NS + i * STEP_NS
            data = bags.serialize(bags.image_msg(rgb, t, "camera"))
            recorder.write(IMAGE_TOPIC, bags.IMAGE_TYPE, t, data[:40] if i == corrupt_index else data)
            recorder.write_msg(REFERENCE_TOPIC, t, bags.joint_trajectory_msg(["x", "y"], np.zeros((4, 2)), 0.1, t))
    return path


def test_the_check_names_the_topic_and_the_index_of_the_first_bad_message(tmp_path):
    bag = write_bag(tmp_path / "bag")
    with pytest.raises(CorruptMessageError) as info:
        check_messages(bag, [IMAGE_TOPIC, REFERENCE_TOPIC])
    message = str(info.value)
    assert f"message {BAD_INDEX} on '{IMAGE_TOPIC}' (sensor_msgs/msg/Image, 40 bytes" in message
    assert f"logged at {START_NS + BAD_INDEX * STEP_NS} ns" in message and str(bag) in message
    assert isinstance(info.value, bags.BagError)  # what replay and calibrate turn into exit 2


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_sound_bag_passes_with_every_message_counted(tmp_path, storage):
    bag = write_bag(tmp_path / "bag", corrupt_index=None, storage=storage)
    assert check_messages(bag, [IMAGE_TOPIC, REFERENCE_TOPIC]) == {IMAGE_TOPIC: FRAMES, REFERENCE_TOPIC: FRAMES}
    # A replay without --reference-topic reads only its inputs: the image topic.
    assert check_replay_bag(ReplayOptions(bag=bag)) == {IMAGE_TOPIC: FRAMES}


def test_a_bad_message_on_a_topic_the_run_does_not_read_is_not_its_concern(tmp_path):
    bag = write_bag(tmp_path / "bag")
    assert check_messages(bag, [REFERENCE_TOPIC]) == {REFERENCE_TOPIC: FRAMES}


def _cli(*args: str) -> subprocess.CompletedProcess:
    # ``--wait 3600`` and no node anywhere: a tool that contacted the node before checking the bag would wait an hour
    # (and the subprocess timeout would fail this test); one that checks first exits at once.
    env = {**os.environ, "ROS_DOMAIN_ID": "231"}
    return subprocess.run([sys.executable, "-m", "trajectory_ensemble_node.cli", *args], capture_output=True,
                          text=True, timeout=300, check=False, env=env)


def _assert_bad_bag(proc: subprocess.CompletedProcess) -> None:
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert f"message {BAD_INDEX} on '{IMAGE_TOPIC}'" in proc.stderr and "cannot be deserialized" in proc.stderr
    assert "Traceback" not in output and "SerdeError" in proc.stderr  # the reason, not a crash
    assert "waiting for" not in output and "goal 1" not in output  # the node was never waited for, no goal sent


@pytest.mark.slow
def test_the_replay_gate_exits_2_on_a_corrupt_message_before_any_goal(tmp_path):
    bag = write_bag(tmp_path / "bag")
    out = tmp_path / "out"
    proc = _cli("replay", str(bag), "--out", str(out), "--wait", "3600", "--reference-topic", REFERENCE_TOPIC,
                "--max-rmse", "0.5")
    _assert_bad_bag(proc)
    assert not (out / "bag").exists() and not (out / "summary.json").exists()


@pytest.mark.slow
def test_calibrate_from_bags_exits_2_on_the_same_bag_before_any_node(tmp_path):
    bag = write_bag(tmp_path / "bag")
    good = write_bag(tmp_path / "good", corrupt_index=None)
    out = tmp_path / "cal.json"
    proc = _cli("calibrate", "--bag", str(good), "--heldout-bag", str(bag), "--json", str(out), "--wait", "3600",
                "--replay-out", str(tmp_path / "replays"))
    _assert_bad_bag(proc)
    assert not out.exists() and not (tmp_path / "replays").exists()


def test_an_image_topic_declared_but_never_written_is_a_bad_bag(tmp_path):
    # Found by the bag fuzzer (tests/fuzz/test_fuzz_bags.py): 0 messages checked, then a bare StopIteration.
    from rosbags.rosbag2 import StoragePlugin, Writer

    from trajectory_ensemble_node.replay.playback import goal_times

    path = tmp_path / "bag"
    writer = Writer(path, version=bags.BAG_VERSION, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    writer.add_connection(IMAGE_TOPIC, bags.IMAGE_TYPE, typestore=bags.typestore())  # declared, never written
    reference = writer.add_connection(REFERENCE_TOPIC, bags.JOINT_TRAJECTORY_TYPE, typestore=bags.typestore())
    writer.write(reference, START_NS, bags.serialize(bags.joint_trajectory_msg(["x"], np.zeros((2, 1)), 0.1, START_NS)))
    writer.close()
    with pytest.raises(bags.BagError, match=f"the image topic '{IMAGE_TOPIC}' holds no message"):
        check_replay_bag(ReplayOptions(bag=path))
    with pytest.raises(bags.BagError, match="holds no message"):
        goal_times(bags.bag_info(path), IMAGE_TOPIC, ReplayOptions(bag=path))


@pytest.mark.parametrize("field", ["name", "type"])
def test_a_topic_whose_metadata_is_not_text_is_a_bad_bag(tmp_path, field):
    # Found by the bag fuzzer's soak run: an mcap bag's metadata.yaml naming a topic by a list reached a dict key in
    # resolve_inputs as a TypeError instead of exit 2.
    bag = write_bag(tmp_path / "bag", corrupt_index=None)
    meta_path = bag / "metadata.yaml"
    meta = yaml.safe_load(meta_path.read_text(encoding="utf-8"))
    meta["rosbag2_bagfile_information"]["topics_with_message_count"][0]["topic_metadata"][field] = []
    meta_path.write_text(yaml.safe_dump(meta), encoding="utf-8")
    with pytest.raises(bags.BagError, match="must be text"):
        check_replay_bag(ReplayOptions(bag=bag, reference_topic=REFERENCE_TOPIC))
