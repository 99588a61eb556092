"""Fuzz the bag reader that ``replay`` and ``calibrate --bag`` use, on real rosbag2 folders that hypothesis damages.

Every bag is written with the ``rosbags`` writer (``bags.BagRecorder``, mcap or sqlite3): camera frames, joint
states, an instruction and a reference trajectory. Then either some messages' CDR bytes are damaged as they are
written (cut short, extended, bit-flipped, replaced by random bytes or by another type's message), or the finished
folder is (``metadata.yaml`` garbled or mutated field by field, the storage file truncated, overwritten in places or
removed). The bag is then read as ``replay`` reads it: the up-front check (``replay/bag_check.py``: ``bag_info``,
``resolve_inputs``, every message of the topics read), then the goal times, the scene seeds, and each message
deserialized, stamped and, for frames, converted. The outcome is that whole reading, with every message counted, or a
named error (``BagError`` and its ``CorruptMessageError``: exit 2 in both CLIs); never another exception.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from _fuzz import TIMEOUT_S, check_named, fuzz_settings, record
from hypothesis import event, given
from hypothesis import strategies as st

from trajectory_ensemble_node.errors import TrajectoryEnsembleError
from trajectory_ensemble_node.replay import bags
from trajectory_ensemble_node.replay import playback
from trajectory_ensemble_node.replay.playback import ReplayOptions

bag_check = pytest.importorskip("trajectory_ensemble_node.replay.bag_check")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S)]

IMAGE_TOPIC, STATE_TOPIC, TEXT_TOPIC, REFERENCE_TOPIC = ("/camera/image_raw", "/joint_states", "/instruction",
                                                         "/reference/actions")
START_NS, STEP_NS = 1_000_000_000, 250_000_000


def _messages(frames: int) -> list[tuple[str, str, int, bytes]]:
    """``(topic, msgtype, log time, CDR bytes)`` of a small sound recording, in log-time order."""
    rgb = np.arange(16 * 16 * 3, dtype=np.uint8).reshape(16, 16, 3)
    out = [(TEXT_TOPIC, bags.STRING_TYPE, START_NS, bags.serialize(bags.string_msg("push the block")))]
    for i in range(frames):
        t = START_NS + i * STEP_NS
        out += [
            (IMAGE_TOPIC, bags.IMAGE_TYPE, t, bags.serialize(bags.image_msg(rgb, t, "camera"))),
            (STATE_TOPIC, bags.STATE_TYPE, t, bags.serialize(bags.joint_state_msg(["x", "y"], [0.1 * i, 0.2], t))),
            (REFERENCE_TOPIC, bags.JOINT_TRAJECTORY_TYPE, t,
             bags.serialize(bags.joint_trajectory_msg(["x", "y"], np.zeros((4, 2)), 0.1, t))),
        ]
    return out


SOUND = _messages(3)


def _damage(data: bytes, how: str, rng: random.Random) -> bytes:
    if how == "truncate":
        return data[:rng.randrange(len(data))]
    if how == "extend":
        return data + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if how == "flip":
        buf = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return bytes(buf)
    if how == "random":
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 96)))
    if how == "other_type":
        return rng.choice([m for m in SOUND if m[3] != data])[3]
    if how == "huge_length":
        # A sequence length near 2**32 in the CDR header region: the payload claims far more than it holds.
        buf = bytearray(data)
        at = rng.randrange(4, max(5, len(buf) - 4)) & ~3
        buf[at:at + 4] = b"\xff\xff\xff\x7f"
        return bytes(buf)
    raise AssertionError(how)


DAMAGES = ("truncate", "extend", "flip", "random", "other_type", "huge_length")


def _write(path: Path, storage: str, damaged: dict[int, str], seed: int) -> None:
    rng = random.Random(seed)
    with bags.BagRecorder(path, storage) as recorder:
        for index, (topic, msgtype, t, data) in enumerate(SOUND):
            recorder.write(topic, msgtype, t, _damage(data, damaged[index], rng) if index in damaged else data)


def read_as_replay(path: Path) -> dict[str, int]:
    """Read a bag the way ``replay`` does before and while it plays it; messages read per topic.

    Raises:
        TrajectoryEnsembleError: the named refusal (``BagError``, ``CorruptMessageError``).
    """
    opts = ReplayOptions(bag=path, plot=False, reference_topic=REFERENCE_TOPIC)
    checked = bag_check.check_replay_bag(opts)
    info = bags.bag_info(path)
    inputs = playback.resolve_inputs(info, opts)
    image_topic = next(topic for topic, (_, msgtype) in inputs.items() if msgtype == bags.IMAGE_TYPE)
    times = playback.goal_times(info, image_topic, opts)
    # None when the bag (by its metadata) ends before the first goal; never outside it or out of order.
    assert times == sorted(times) and all(info.start_ns <= t <= info.end_ns for t in times), times
    bags.toy_scene_seeds(info)
    read: dict[str, int] = {}
    for topic, msgtype, _, data in bags.iter_raw(path, [*inputs, REFERENCE_TOPIC]):
        msg = bags.deserialize(data, msgtype)
        if hasattr(msg, "header"):
            bags.stamp_ns(msg)
        if msgtype == bags.IMAGE_TYPE:
            try:
                rgb = bags.image_rgb(msg)
                assert rgb.dtype == np.uint8 and rgb.shape == (msg.height, msg.width, 3)
            except bags.BagError:
                pass  # replay's _plottable: the node would refuse the frame; the plot shows none
        read[topic] = read.get(topic, 0) + 1
    assert read == {topic: count for topic, count in checked.items() if count}, (read, checked)
    return read


def _outcome(path: Path) -> None:
    try:
        read = read_as_replay(path)
    except Exception as error:  # noqa: BLE001 - the property: only named errors
        check_named(error)
        event(f"refused: {type(error).__name__}")
        return
    event("read")
    assert sum(read.values()) >= 1


@fuzz_settings("bag_payloads")
@given(storage=st.sampled_from(sorted(bags.STORAGES)),
       damaged=st.dictionaries(st.integers(0, len(SOUND) - 1), st.sampled_from(DAMAGES), max_size=3),
       seed=st.integers(0, 2**16))
def test_a_bag_with_damaged_messages_is_read_whole_or_refused_by_name(storage: str, damaged: dict[int, str],
                                                                     seed: int) -> None:
    record("bag_payloads")
    with tempfile.TemporaryDirectory(prefix="fuzz_bag_") as folder:
        path = Path(folder) / "bag"
        _write(path, storage, damaged, seed)
        _outcome(path)


# --- damaged folders -------------------------------------------------------------------------------------------------

_SOUND_BAGS: dict[str, Path] = {}
_SOUND_DIR = tempfile.TemporaryDirectory(prefix="fuzz_sound_bags_")  # removed at exit


def _sound_bag(storage: str) -> Path:
    if storage not in _SOUND_BAGS:
        _write(Path(_SOUND_DIR.name) / storage, storage, {}, 0)
        _SOUND_BAGS[storage] = Path(_SOUND_DIR.name) / storage
    return _SOUND_BAGS[storage]


junk = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=10),
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(tree, dict):
        for key, value in tree.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out += _paths(value, (*prefix, i))
    return out


def _set(tree: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    tree[path[0]] = _set(tree[path[0]], path[1:], value)
    return tree


@st.composite
def folder_damage(draw: st.DrawFn) -> tuple[str, str, Any]:
    kind = draw(st.sampled_from(["metadata_field", "metadata_field", "metadata_text", "truncate", "overwrite",
                                 "remove_storage", "remove_metadata_key"]))
    return draw(st.sampled_from(sorted(bags.STORAGES))), kind, draw(st.data())


@fuzz_settings("bag_files")
@given(folder_damage())
def test_a_bag_folder_with_damaged_files_is_read_whole_or_refused_by_name(damage: tuple[str, str, Any]) -> None:
    record("bag_files")
    storage, kind, data = damage
    with tempfile.TemporaryDirectory(prefix="fuzz_bag_") as folder:
        path = Path(folder) / "bag"
        shutil.copytree(_sound_bag(storage), path)
        metadata = path / "metadata.yaml"
        storage_file = next(f for f in path.iterdir() if f.name != "metadata.yaml")
        if kind in ("metadata_field", "remove_metadata_key"):
            tree = yaml.safe_load(metadata.read_text())
            where = data.draw(st.sampled_from(_paths(tree)[1:]))
            if kind == "metadata_field":
                tree = _set(tree, where, data.draw(junk))
            else:
                parent = tree
                for key in where[:-1]:
                    parent = parent[key]
                del parent[where[-1]]
            metadata.write_text(yaml.safe_dump(tree))
        elif kind == "metadata_text":
            text = metadata.read_text()
            cut = data.draw(st.integers(0, len(text)))
            metadata.write_bytes(text[:cut].encode() + data.draw(st.binary(max_size=40)))
        elif kind == "truncate":
            content = storage_file.read_bytes()
            storage_file.write_bytes(content[:data.draw(st.integers(0, len(content) - 1))])
        elif kind == "overwrite":
            content = bytearray(storage_file.read_bytes())
            for _ in range(data.draw(st.integers(1, 8))):
                at = data.draw(st.integers(0, len(content) - 1))
                chunk = data.draw(st.binary(min_size=1, max_size=16))
                content[at:at + len(chunk)] = chunk
            storage_file.write_bytes(bytes(content))
        else:
            storage_file.unlink()
        event(f"damage: {kind}")
        _outcome(path)


def test_the_sound_recording_is_read_whole() -> None:
    """The accepting side: undamaged bags of both storages are read with every message."""
    for storage in sorted(bags.STORAGES):
        read = read_as_replay(_sound_bag(storage))
        assert read == {IMAGE_TOPIC: 3, STATE_TOPIC: 3, TEXT_TOPIC: 1, REFERENCE_TOPIC: 3}, (storage, read)


def test_a_named_bag_error_is_what_both_clis_exit_2_on() -> None:
    assert issubclass(bag_check.CorruptMessageError, bags.BagError)
    assert issubclass(bags.BagError, TrajectoryEnsembleError)


def test_an_image_topic_without_messages_is_refused_by_name() -> None:
    """The defect test_a_bag_folder_with_damaged_files_is_read_whole_or_refused_by_name found (a bare StopIteration
    from ``playback.goal_times``), fixed in b01a045: kept as a fixed example."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    with tempfile.TemporaryDirectory(prefix="fuzz_bag_") as folder:
        path = Path(folder) / "bag"
        writer = Writer(path, version=bags.BAG_VERSION, storage_plugin=StoragePlugin.MCAP)
        writer.open()
        writer.add_connection(IMAGE_TOPIC, bags.IMAGE_TYPE, typestore=bags.typestore())  # declared, never written
        state = writer.add_connection(STATE_TOPIC, bags.STATE_TYPE, typestore=bags.typestore())
        writer.write(state, START_NS, SOUND[2][3])
        writer.close()
        opts = ReplayOptions(bag=path, plot=False)
        try:
            bag_check.check_replay_bag(opts)
            playback.goal_times(bags.bag_info(path), IMAGE_TOPIC, opts)
        except TrajectoryEnsembleError:
            return
        pytest.fail("a bag with no frame on its image topic was accepted")
