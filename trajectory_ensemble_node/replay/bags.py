"""rosbag2 helpers built on ``rosbags`` (no rclpy, no rosbag2): reading, recording, the demo bag.

Messages stay in CDR form end to end, so the output bag is what ``ros2 bag record`` would have stored. The message
codec is :mod:`trajectory_ensemble_node.cli.messages`. How the bundled bags are made (``bags make-demo-bag``):
docs/replay.md, "The bundled bags".
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rosbags.rosbag2 import CompressionFormat, CompressionMode, Reader, StoragePlugin, Writer

from ..cli.exits import fail
from ..errors import TrajectoryEnsembleError
# The message codec is shared with the operator commands; bag callers keep reading it through this module.
from ..cli.messages import (  # noqa: F401
    CANDIDATES_TYPE,
    CUSTOM_TYPES,
    IMAGE_TYPE,
    JOINT_TRAJECTORY_TYPE,
    MSGS_PACKAGE,
    STATE_TYPE,
    STRING_TYPE,
    TRAJECTORY_TYPE,
    BagError,
    InterfaceDefinitionError,
    candidates_array,
    deserialize,
    image_msg,
    image_rgb,
    joint_state_msg,
    make_header,
    msg_definition_dirs,
    serialize,
    stamp_ns,
    string_msg,
    trajectory_array,
    typestore,
)

STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
"""Storage plugins a bag may be written with; mcap is the rosbag2 default since Iron."""
BAG_VERSION = 9
"""rosbag2 metadata version written (9 = Jazzy and later)."""

# The demo bag: topics as a robot would name them; replay maps them onto the node's ~/observation/* inputs.
DEMO_IMAGE_TOPIC = "/camera/image_raw"
DEMO_STATE_TOPIC = "/joint_states"
DEMO_INSTRUCTION_TOPIC = "/instruction"
DEMO_FRAME_ID = "toy_camera"
DEMO_JOINT_NAMES = ("robot_x", "robot_y")
DEMO_START_NS = 1_767_225_600 * 1_000_000_000
"""2026-01-01T00:00:00Z: a fixed start so the generated bag is byte-for-byte reproducible."""
DEMO_SCENE_OFFSETS = (0, 1, 2, 3, 4, 5)
"""Held-out toy scenes ``HELDOUT_SEED_BASE + offset`` shown in the demo bag, one after another."""
DEMO_SCENE_PERIOD_S = 1.0
DEMO_FRAMES_PER_SCENE = 2
SCENES_KEY = "trajectory_ensemble.toy_scenes"
"""``custom_data`` key of the demo bag: JSON ``{image stamp ns: toy scene seed}`` (lets plots redraw the scene)."""
BUNDLED_BAG = Path(__file__).resolve().parent.parent / "assets" / "bags" / "toy_obstacle"
DEMO_REFERENCE_TOPIC = "/reference/actions"
"""Where a demonstration bag (``make-demo-bag --reference``) records the expert's commanded path."""
REFERENCE_TOPIC_KEY = "trajectory_ensemble.reference_topic"
SIDES_KEY = "trajectory_ensemble.demonstrated_sides"
"""``custom_data`` key of a demonstration bag: JSON ``{toy scene seed: side the expert took (+1 above, -1 below)}``."""
DEMONSTRATION_BAG = BUNDLED_BAG.parent / "toy_demonstrations"


# --- reading --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BagTopic:
    """One topic of a bag.

    Args:
        name (`str`): Topic name.
        msgtype (`str`): ``pkg/msg/Type``.
        count (`int`): Messages on it.
    """

    name: str
    msgtype: str
    count: int


@dataclass(frozen=True)
class BagInfo:
    """What a bag holds.

    Args:
        path (`Path`): The bag folder.
        storage (`str`): ``mcap`` or ``sqlite3``.
        start_ns (`int`), end_ns (`int`): First and last log time.
        topics (`tuple[BagTopic, ...]`): Its topics.
        custom_data (`dict[str, str]`): ``custom_data`` of metadata.yaml.
    """

    path: Path
    storage: str
    start_ns: int
    end_ns: int
    topics: tuple[BagTopic, ...]
    custom_data: dict[str, str]

    def topics_of_type(self, msgtype: str) -> list[str]:
        """Names of the topics carrying ``msgtype``."""
        return [t.name for t in self.topics if t.msgtype == msgtype]


def _check_bag(path: Path) -> None:
    if not (path / "metadata.yaml").is_file():
        raise BagError(f"{path} is not a rosbag2 folder (no metadata.yaml)")


def bag_info(path: str | Path) -> BagInfo:
    """Read a bag's topics, time span and custom data.

    Raises:
        BagError: ``path`` is not a readable rosbag2 folder, or the bag is empty.
    """
    path = Path(path)
    _check_bag(path)
    try:
        with Reader(path) as reader:
            topics = tuple(BagTopic(c.topic, c.msgtype, c.msgcount) for c in reader.connections)
            start, end, count = reader.start_time, reader.end_time, reader.message_count
        meta = yaml.safe_load((path / "metadata.yaml").read_text(encoding="utf-8"))["rosbag2_bagfile_information"]
        custom = dict(meta.get("custom_data") or {})
    except BagError:
        raise
    except Exception as error:  # noqa: BLE001 - rosbags raises several types; callers need one, with the reason
        raise BagError(f"cannot read bag {path}: {type(error).__name__}: {error}") from error
    # rosbags takes an mcap bag's topic names from metadata.yaml as written: anything but text is a damaged file.
    bad = next((t for t in topics if not (isinstance(t.name, str) and isinstance(t.msgtype, str))), None)
    if bad is not None or count == 0:
        raise BagError(f"bag {path} holds no messages" if bad is None else
                       f"bag {path}: metadata.yaml names a topic {bad.name!r} of type {bad.msgtype!r}; both must be text")
    return BagInfo(path, str(meta.get("storage_identifier", "")), int(start), int(end), topics, custom)


def iter_raw(path: str | Path, topics: Sequence[str]) -> Iterator[tuple[str, str, int, bytes]]:
    """Yield ``(topic, msgtype, log_time_ns, cdr_bytes)`` of ``topics`` in log-time order."""
    path = Path(path)
    _check_bag(path)
    with Reader(path) as reader:
        connections = [c for c in reader.connections if c.topic in set(topics)]
        for connection, timestamp, data in reader.messages(connections=connections):
            yield connection.topic, connection.msgtype, int(timestamp), bytes(data)


def read_messages(path: str | Path, topic: str) -> list[tuple[int, Any]]:
    """Every message on ``topic`` as ``(log_time_ns, rosbags message)``."""
    return [(t, deserialize(data, msgtype)) for _, msgtype, t, data in iter_raw(path, [topic])]


# --- writing --------------------------------------------------------------------------------------------------------


class BagRecorder:
    """Write CDR messages into a new rosbag2 folder; topics are added on their first message.

    Args:
        path (`str` or `Path`): The bag folder to create (must not exist).
        storage (`str`): ``mcap`` (zstd-compressed chunks) or ``sqlite3`` (uncompressed, readable by any rosbag2).
        custom_data (`dict[str, str]`, *optional*): Written into metadata.yaml.

    Raises:
        BagError: ``path`` exists or ``storage`` is unknown.
    """

    def __init__(self, path: str | Path, storage: str = "mcap", custom_data: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        if storage not in STORAGES:
            raise BagError(f"unknown bag storage {storage!r}; expected one of {sorted(STORAGES)}")
        if self.path.exists():
            raise BagError(f"{self.path} exists already; rosbag2 writers never overwrite a bag")
        self.storage = storage
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = Writer(self.path, version=BAG_VERSION, storage_plugin=STORAGES[storage])
        if storage == "mcap":
            # Chunk compression inside the mcap file: every rosbag2 mcap reader decompresses it transparently.
            self._writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
        for key, value in (custom_data or {}).items():
            self._writer.set_custom_data(key, value)
        self._writer.open()
        self._connections: dict[tuple[str, str], Any] = {}
        self.counts: dict[str, int] = {}

    def write(self, topic: str, msgtype: str, log_time_ns: int, data: bytes | memoryview) -> None:
        """Append one CDR message; ``msgtype`` must be known to :func:`typestore`."""
        key = (topic, msgtype)
        if key not in self._connections:
            self._connections[key] = self._writer.add_connection(topic, msgtype, typestore=typestore())
        self._writer.write(self._connections[key], int(log_time_ns), bytes(data))
        self.counts[topic] = self.counts.get(topic, 0) + 1

    def write_msg(self, topic: str, log_time_ns: int, msg: Any) -> None:
        """Append one ``rosbags`` message."""
        self.write(topic, msg.__msgtype__, log_time_ns, serialize(msg))

    def close(self) -> None:
        """Finish the bag (writes the mcap summary and metadata.yaml)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None  # type: ignore[assignment]

    def __enter__(self) -> BagRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the bundled demo bag -------------------------------------------------------------------------------------------


def demonstrated_side(scene: Any) -> int:
    """The side the demonstration bag's expert takes in ``scene``: one of :func:`~..toy.task.expert_sides`, drawn
    from the scene's seed (so both modes appear, and the bag is reproducible)."""
    from ..toy.task import expert_sides

    sides = expert_sides(scene)
    return int(sides[int(np.random.default_rng([int(scene.seed), 0xDE40]).integers(len(sides)))])


def joint_trajectory_msg(names: Sequence[str], positions: np.ndarray, dt: float, stamp_ns: int,
                         frame_id: str = "") -> Any:
    """``trajectory_msgs/JointTrajectory``: row ``k`` of ``positions`` ``[K, len(names)]`` at ``(k + 1) * dt``."""
    types, empty = typestore().types, np.zeros(0, dtype=np.float64)
    times = [int(round((k + 1) * dt * 1e9)) for k in range(len(positions))]
    points = [types["trajectory_msgs/msg/JointTrajectoryPoint"](
        positions=row, velocities=empty, accelerations=empty, effort=empty,
        time_from_start=types["builtin_interfaces/msg/Duration"](sec=ns // 10**9, nanosec=ns % 10**9))
        for ns, row in zip(times, np.asarray(positions, dtype=np.float64))]
    return types[JOINT_TRAJECTORY_TYPE](header=make_header(stamp_ns, frame_id), joint_names=list(names), points=points)


def make_demo_bag(
    out: str | Path,
    scene_offsets: Sequence[int] = DEMO_SCENE_OFFSETS,
    frames_per_scene: int = DEMO_FRAMES_PER_SCENE,
    scene_period_s: float = DEMO_SCENE_PERIOD_S,
    storage: str = "mcap",
    reference: bool = False,
) -> BagInfo:
    """Write the demo bag: toy scenes as a camera stream, the robot position as a joint state, the instruction.

    Each scene ``HELDOUT_SEED_BASE + offset`` is shown for ``scene_period_s`` at ``frames_per_scene`` frames;
    image and joint state of one frame share a header stamp (= log time). The instruction is sent with every new
    scene, so a node that starts listening late still hears it.

    With ``reference`` each scene is a demonstration instead: the expert takes :func:`demonstrated_side` and
    follows its path (:func:`~..toy.task.expert_continuation`, one waypoint per control step ``1 / FPS``, then
    holding the target until the scene ends), each frame and joint state showing the robot where it is at that
    time, and the commanded path is one ``JointTrajectory`` per scene on :data:`DEMO_REFERENCE_TOPIC`, stamped at
    the scene's first frame with point ``k`` at ``(k + 1) / FPS``: where the node's chunk served from that frame
    puts its row ``k``.

    Args:
        out (`str` or `Path`): Bag folder to create.
        scene_offsets (`Sequence[int]`): Held-out scene offsets, in playback order.
        frames_per_scene (`int`): Frames per scene (>= 1).
        scene_period_s (`float`): Seconds each scene is shown (> 0).
        storage (`str`): ``mcap`` or ``sqlite3``.
        reference (`bool`): Write demonstrations and their commanded paths (see above).
    """
    from ..toy import HELDOUT_SEED_BASE, INSTRUCTION, make_scene, render
    from ..toy.task import FPS, HORIZON, expert_continuation, expert_curve

    if frames_per_scene < 1 or scene_period_s <= 0 or not scene_offsets:
        raise BagError("make_demo_bag needs frames_per_scene >= 1, scene_period_s > 0 and at least one scene")
    frame_ns = int(round(scene_period_s * 1e9 / frames_per_scene))
    scenes: dict[str, int] = {}
    sides: dict[str, int] = {}
    frames = []
    paths = []
    for k, offset in enumerate(scene_offsets):
        scene = make_scene(HELDOUT_SEED_BASE + int(offset))
        image = render(scene)
        scene_start = DEMO_START_NS + k * int(round(scene_period_s * 1e9))
        if reference:
            side_sign = demonstrated_side(scene)
            sides[str(scene.seed)] = side_sign
            steps = max(1, int(round(scene_period_s * FPS)))
            paths.append((scene_start, expert_continuation(scene, side_sign, 0.0, horizon=steps)))
        for j in range(frames_per_scene):
            stamp = scene_start + j * frame_ns
            shown = scene
            if reference and j > 0:
                # Where the robot is j frames in: along the path, at control step (time * FPS) of HORIZON.
                progress = j * frame_ns / 1e9 * FPS
                shown = scene.with_robot(expert_curve(scene, side_sign, np.array([progress / HORIZON]))[0])
                image = render(shown)
            else:
                scenes[str(stamp)] = scene.seed  # plots redraw the scene as it starts
            frames.append((stamp, image, shown, j == 0))
    custom = {SCENES_KEY: json.dumps(scenes), "trajectory_ensemble.generator": "make-demo-bag"}
    if reference:
        custom.update({"trajectory_ensemble.generator": "make-demo-bag --reference",
                       REFERENCE_TOPIC_KEY: DEMO_REFERENCE_TOPIC, SIDES_KEY: json.dumps(sides)})
    with BagRecorder(out, storage, custom_data=custom) as bag:
        for stamp, image, scene, first in frames:
            if first:
                bag.write_msg(DEMO_INSTRUCTION_TOPIC, stamp, string_msg(INSTRUCTION))
                if reference:
                    start, path = paths.pop(0)
                    bag.write_msg(DEMO_REFERENCE_TOPIC, stamp,
                                  joint_trajectory_msg(DEMO_JOINT_NAMES, path, 1.0 / FPS, start, DEMO_FRAME_ID))
            bag.write_msg(DEMO_IMAGE_TOPIC, stamp, image_msg(image, stamp, DEMO_FRAME_ID))
            bag.write_msg(DEMO_STATE_TOPIC, stamp, joint_state_msg(DEMO_JOINT_NAMES, scene.robot, stamp, DEMO_FRAME_ID))
    return bag_info(out)


def toy_scene_seeds(info: BagInfo) -> dict[int, int]:
    """``{image stamp ns: toy scene seed}`` of a demo bag; empty for any other bag."""
    try:
        return {int(k): int(v) for k, v in json.loads(info.custom_data.get(SCENES_KEY, "{}")).items()}
    except (ValueError, AttributeError):
        return {}


def _describe(info: BagInfo) -> str:
    size = sum(f.stat().st_size for f in info.path.iterdir() if f.is_file())
    lines = [f"{info.path}: {info.storage}, {size / 1024:.0f} KiB, {(info.end_ns - info.start_ns) / 1e9:.2f} s"]
    lines += [f"  {t.name}  {t.msgtype}  {t.count}" for t in info.topics]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bags`` actions (``make-demo-bag``, ``info``) to ``parser``."""
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    make = sub.add_parser("make-demo-bag", help="write the toy-scene demo bag (the bundled ones are made by this)")
    make.add_argument("out", type=Path, help="bag folder to create (must not exist)")
    make.add_argument("--storage", choices=sorted(STORAGES), default="mcap", help="storage plugin (default mcap)")
    make.add_argument("--scenes", type=int, default=len(DEMO_SCENE_OFFSETS), metavar="K",
                      help=f"number of scenes (default {len(DEMO_SCENE_OFFSETS)})")
    make.add_argument("--scene-seed", type=int, default=0, metavar="S",
                      help="first held-out scene offset: scenes HELDOUT_SEED_BASE + S .. + S + K - 1 (default 0)")
    make.add_argument("--frames-per-scene", type=int, default=DEMO_FRAMES_PER_SCENE, help="frames per scene (2)")
    make.add_argument("--reference", action="store_true",
                      help=f"demonstrations: the robot follows the expert's path, commanded on "
                           f"{DEMO_REFERENCE_TOPIC} (trajectory_msgs/JointTrajectory)")
    info = sub.add_parser("info", help="print a bag's storage, size, duration and topics")
    info.add_argument("bag", type=Path)


def run(args: argparse.Namespace) -> int:
    """Run ``trajectory-ensemble bags``; 0 done, 1 the bag could not be written or read."""
    try:
        if args.action == "make-demo-bag":
            if args.scenes < 1 or args.scene_seed < 0:
                raise BagError(f"--scenes must be >= 1 and --scene-seed >= 0, got {args.scenes} and "
                               f"{args.scene_seed}")
            offsets = tuple(range(args.scene_seed, args.scene_seed + args.scenes))
            print(_describe(make_demo_bag(args.out, offsets, args.frames_per_scene, storage=args.storage,
                                          reference=args.reference)))
        else:
            print(_describe(bag_info(args.bag)))
    except TrajectoryEnsembleError as error:
        return fail(error, 1)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trajectory_ensemble_node.replay.bags ...``, the same as ``trajectory-ensemble bags ...``."""
    parser = argparse.ArgumentParser(prog="trajectory-ensemble bags", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
