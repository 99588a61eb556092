"""rosbag2 helpers: custom types in the typestore, bag round trips, the demo bag, plots, the playback clock."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from trajectory_ensemble_node.replay import bags
from trajectory_ensemble_node.replay.playback import GoalOutcome, PlaybackClock, ReplayOptions, goal_times, resolve_inputs
from trajectory_ensemble_node.replay.plots import GoalPlot, candidate_spread, plot_channels, plot_toy_scenes

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BUNDLED_BAG_MAX_BYTES = 300 * 1024


def _trajectory(stamp: int, horizon: int = 4, dim: int = 3) -> object:
    types = bags.typestore().types
    data = np.arange(horizon * dim, dtype=np.float32) / 7.0
    return types[bags.TRAJECTORY_TYPE](
        header=bags.make_header(stamp, "cam"), domain_name="droid_lerobot", horizon=horizon, action_dim=dim,
        dt=1 / 15, data=data, reducer="medoid", candidate_count=5, base_seed=2**63 + 5, normalized=True,
    )


def _candidates(stamp: int, count: int = 5, horizon: int = 4, dim: int = 3) -> object:
    types = bags.typestore().types
    return types[bags.CANDIDATES_TYPE](
        header=bags.make_header(stamp, "cam"), candidate_ids=np.arange(count, dtype=np.uint32),
        seeds=np.arange(count, dtype=np.uint64) + 2**40, horizon=horizon, action_dim=dim,
        data=np.linspace(-1, 1, count * horizon * dim, dtype=np.float32), domain_name="droid_lerobot", dt=1 / 15,
        normalized=False, valid=np.array([i != 1 for i in range(count)], dtype=np.bool_),
    )


def _rosidl_hash(name: str) -> str:
    path = Path(sys.prefix) / "share" / bags.MSGS_PACKAGE / "msg" / f"{name}.json"
    if not path.is_file():
        pytest.skip(f"{path} not built (make interfaces)")
    hashes = json.loads(path.read_text())["type_hashes"]
    return next(h["hash_string"] for h in hashes if h["type_name"] == f"{bags.MSGS_PACKAGE}/msg/{name}")


@pytest.mark.parametrize("name", bags.CUSTOM_TYPES)
def test_typestore_hash_matches_rosidl(name: str) -> None:
    """The RIHS01 hash written into bags equals rosidl's, so ROS 2 tools accept the recorded topics."""
    assert bags.typestore().hash_rihs01(f"{bags.MSGS_PACKAGE}/msg/{name}") == _rosidl_hash(name)


def test_cdr_matches_rclpy_serialization() -> None:
    """rosbags and rclpy produce and read the same CDR bytes for both custom types."""
    pytest.importorskip("trajectory_ensemble_msgs")
    from rclpy.serialization import deserialize_message, serialize_message
    from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateArray

    stamp = 1_700_000_000_123_456_789
    traj = deserialize_message(bags.serialize(_trajectory(stamp)), ActionTrajectory)
    assert (traj.header.stamp.sec, traj.header.stamp.nanosec) == (1_700_000_000, 123_456_789)
    assert traj.reducer == "medoid" and traj.base_seed == 2**63 + 5 and traj.horizon == 4
    np.testing.assert_array_equal(bags.trajectory_array(traj), np.arange(12, dtype=np.float32).reshape(4, 3) / 7.0)
    cands = deserialize_message(bags.serialize(_candidates(stamp)), CandidateArray)
    assert list(cands.seeds) == [2**40 + i for i in range(5)] and cands.normalized is False
    # And back: rclpy's bytes read by rosbags.
    back = bags.deserialize(serialize_message(cands), bags.CANDIDATES_TYPE)
    np.testing.assert_array_equal(bags.candidates_array(back), bags.candidates_array(cands))
    # Not byte-equal: CDR alignment padding is unspecified and Fast CDR leaves it uninitialized.
    again = bags.deserialize(serialize_message(traj), bags.TRAJECTORY_TYPE)
    assert bags.stamp_ns(again) == stamp and again.base_seed == 2**63 + 5 and again.reducer == "medoid"


@pytest.mark.parametrize("storage", sorted(bags.STORAGES))
def test_bag_round_trip_custom_types(tmp_path: Path, storage: str) -> None:
    """Custom messages written with BagRecorder read back equal, with rosidl's type hash in metadata.yaml."""
    path = tmp_path / "bag"
    stamps = [1_000_000_000 + i * 250_000_000 for i in range(3)]
    with bags.BagRecorder(path, storage, custom_data={"k": "v"}) as recorder:
        for stamp in stamps:
            recorder.write_msg("/te/trajectory", stamp, _trajectory(stamp))
            recorder.write_msg("/te/candidates", stamp + 1, _candidates(stamp))
    info = bags.bag_info(path)
    assert info.storage == storage and info.custom_data == {"k": "v"}
    assert {(t.name, t.msgtype, t.count) for t in info.topics} == {
        ("/te/trajectory", bags.TRAJECTORY_TYPE, 3), ("/te/candidates", bags.CANDIDATES_TYPE, 3)}
    trajectories = bags.read_messages(path, "/te/trajectory")
    assert [t for t, _ in trajectories] == stamps
    assert [bags.stamp_ns(m) for _, m in trajectories] == stamps
    np.testing.assert_array_equal(bags.trajectory_array(trajectories[0][1]), bags.trajectory_array(_trajectory(0)))
    candidates = bags.read_messages(path, "/te/candidates")
    np.testing.assert_array_equal(bags.candidates_array(candidates[2][1]), bags.candidates_array(_candidates(0)))
    meta = yaml.safe_load((path / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    hashes = {t["topic_metadata"]["type"]: t["topic_metadata"]["type_description_hash"]
              for t in meta["topics_with_message_count"]}
    try:
        assert hashes[bags.TRAJECTORY_TYPE] == _rosidl_hash("ActionTrajectory")
    except pytest.skip.Exception:
        pass
    with pytest.raises(bags.BagError, match="exists"):
        bags.BagRecorder(path, storage)


def test_make_demo_bag(tmp_path: Path) -> None:
    """The demo bag: one image + joint state per frame sharing a stamp, the rendered scene, the instruction."""
    from trajectory_ensemble_node.toy import HELDOUT_SEED_BASE, INSTRUCTION, make_scene, render

    info = bags.make_demo_bag(tmp_path / "demo", scene_offsets=(3, 4), frames_per_scene=2, scene_period_s=1.0)
    counts = {t.name: t.count for t in info.topics}
    assert counts == {bags.DEMO_IMAGE_TOPIC: 4, bags.DEMO_STATE_TOPIC: 4, bags.DEMO_INSTRUCTION_TOPIC: 2}
    images = bags.read_messages(info.path, bags.DEMO_IMAGE_TOPIC)
    assert [t - info.start_ns for t, _ in images] == [0, 500_000_000, 1_000_000_000, 1_500_000_000]
    assert all(bags.stamp_ns(m) == t for t, m in images)
    states = bags.read_messages(info.path, bags.DEMO_STATE_TOPIC)
    assert [bags.stamp_ns(m) for _, m in states] == [t for t, _ in images]
    scene = make_scene(HELDOUT_SEED_BASE + 4)
    np.testing.assert_array_equal(bags.image_rgb(images[2][1]), render(scene))
    np.testing.assert_allclose(states[2][1].position, scene.robot)
    assert bags.toy_scene_seeds(info)[images[3][0]] == HELDOUT_SEED_BASE + 4
    assert {m.data for _, m in bags.read_messages(info.path, bags.DEMO_INSTRUCTION_TOPIC)} == {INSTRUCTION}


def test_bundled_bag_is_small_and_reproducible(tmp_path: Path) -> None:
    """The committed bag is what `make-demo-bag` writes today, and stays small."""
    assert bags.BUNDLED_BAG.is_dir(), "run: python -m trajectory_ensemble_node.replay.bags make-demo-bag " + str(
        bags.BUNDLED_BAG.relative_to(ROOT))
    size = sum(f.stat().st_size for f in bags.BUNDLED_BAG.iterdir())
    assert size < BUNDLED_BAG_MAX_BYTES
    fresh = bags.make_demo_bag(tmp_path / "toy_obstacle")
    bundled = bags.bag_info(bags.BUNDLED_BAG)
    assert bundled.topics == fresh.topics and bundled.custom_data == fresh.custom_data
    topics = [t.name for t in bundled.topics]
    assert list(bags.iter_raw(bundled.path, topics)) == list(bags.iter_raw(fresh.path, topics))


def test_image_rgb_encodings() -> None:
    """Plots can show bgr8/mono8/rgba8 frames, with row padding (step > width * channels)."""
    types = bags.typestore().types
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)

    def msg(encoding: str, pixels: np.ndarray) -> object:
        channels = pixels.shape[2] if pixels.ndim == 3 else 1
        rows = np.zeros((2, 3 * channels + 2), np.uint8)
        rows[:, : 3 * channels] = pixels.reshape(2, -1)
        return types[bags.IMAGE_TYPE](header=bags.make_header(0, ""), height=2, width=3, encoding=encoding,
                                      is_bigendian=0, step=rows.shape[1], data=rows.reshape(-1))

    np.testing.assert_array_equal(bags.image_rgb(msg("bgr8", rgb[..., ::-1])), rgb)
    np.testing.assert_array_equal(bags.image_rgb(msg("rgba8", np.concatenate([rgb, rgb[..., :1]], 2))), rgb)
    np.testing.assert_array_equal(bags.image_rgb(msg("mono8", rgb[..., 0])), np.repeat(rgb[..., :1], 3, 2))
    with pytest.raises(bags.BagError, match="16UC1"):
        bags.image_rgb(msg("16UC1", rgb[..., 0]))


def test_resolve_inputs_and_goal_times(tmp_path: Path) -> None:
    """Bag topics map onto the node's inputs; goals start after the first image and stay inside the bag."""
    info = bags.make_demo_bag(tmp_path / "demo", scene_offsets=(0, 1, 2), frames_per_scene=2)
    opts = ReplayOptions(bag=info.path, node_namespace="/robot/te", goal_every_s=0.75, goal_offset_s=0.1)
    assert resolve_inputs(info, opts) == {
        bags.DEMO_IMAGE_TOPIC: ("/robot/te/observation/image", bags.IMAGE_TYPE),
        bags.DEMO_STATE_TOPIC: ("/robot/te/observation/state", bags.STATE_TYPE),
        bags.DEMO_INSTRUCTION_TOPIC: ("/robot/te/instruction", bags.STRING_TYPE),
    }
    assert [t - info.start_ns for t in goal_times(info, bags.DEMO_IMAGE_TOPIC, opts)] == [
        100_000_000, 850_000_000, 1_600_000_000, 2_350_000_000]
    with pytest.raises(bags.BagError, match="--image-topic"):
        resolve_inputs(info, ReplayOptions(bag=info.path, image_topic="/nope"))
    with pytest.raises(ValueError, match="absolute"):
        ReplayOptions(bag=info.path, node_namespace="te")


class _WallClock:
    """Stands in for the ``time`` module inside ``tools.playback``: wall time that passes only when slept through, so
    the playback clock's arithmetic is checked exactly, whatever the host's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_playback_clock_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bag time scales with the rate and stands still while paused."""
    from trajectory_ensemble_node.replay import playback

    wall = _WallClock()
    monkeypatch.setattr(playback, "time", wall)
    clock = PlaybackClock(start_ns=5_000_000_000, rate=2.0)
    clock.start()
    clock.wait_until(5_000_000_000 + 100_000_000)  # 0.1 bag s = 0.05 wall s at rate 2
    assert wall.now == pytest.approx(0.05)
    clock.pause()
    frozen = clock.now_ns()
    wall.sleep(0.1)
    assert clock.now_ns() == frozen
    clock.resume()
    assert 0 <= clock.now_ns() - frozen < 60_000_000
    assert frozen - 5_000_000_000 >= 100_000_000
    # Paused at a time it has already run past: it stops exactly there, and resumes from there.
    clock.wait_until(frozen + 50_000_000)
    clock.pause(at_ns=frozen + 20_000_000)
    assert clock.now_ns() == frozen + 20_000_000
    clock.resume()
    assert 0 <= clock.now_ns() - (frozen + 20_000_000) < 60_000_000


def test_plots_written(tmp_path: Path) -> None:
    """Both figures are written: the channel timeline (any width) and the toy scene panels."""
    from trajectory_ensemble_node.toy.task import expert_path, make_scene, render

    rng = np.random.default_rng(0)
    goals = []
    for i in range(2):
        scene = make_scene(1_000_000 + i)
        cands = np.stack([expert_path(scene, 1 if k % 2 else -1) for k in range(4)]).astype(np.float32)
        goals.append(GoalPlot(f"goal {i + 1}", i * 1.0, 0.125, cands.mean(0), "mean", cands, True, render(scene),
                              scene))
    wide = [GoalPlot("goal 1", 0.0, 1 / 15, rng.normal(size=(16, 20)), "mean", rng.normal(size=(3, 16, 20)))]
    for path in (plot_channels(goals, tmp_path / "a.png"), plot_toy_scenes(goals, tmp_path / "b.png"),
                 plot_channels(wide, tmp_path / "c.png")):
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000
    assert candidate_spread(np.ones((3, 2, 2))) == 0.0


def test_goal_outcome_summary_line() -> None:
    """The per-goal line names status, stamp check, latency against engine time, forwards and spread."""
    cands = np.zeros((2, 3, 1), np.float32)
    cands[1] += 2.0
    ok = GoalOutcome(2, 1.25, 7_000_000_001, "SUCCEEDED", latency_ms=120.0, metrics={
        "total_ms": 100.0, "physical_forwards": 4.0, "candidate_count": 2.0}, stamp_ns=7_000_000_001,
        trajectory=cands.mean(0), candidates=cands, reducer="mean")
    line = ok.summary_line(6)
    for part in ("goal 2/6", "SUCCEEDED", "7.000000001 ok", "latency   120.0 ms", "engine   100.0 ms",
                 "forwards 4", "2x mean", "spread 1.000"):
        assert part in line, line
    failed = GoalOutcome(3, 2.25, None, "ABORTED", error_code=21, error_message="too old")
    assert "code 21 STALE_OBSERVATION: too old" in failed.summary_line(6)


def test_bag_and_plot_modules_import_without_rclpy() -> None:
    """Bags, plots, playback, the launcher and bench --ros import with rclpy blocked (rclpy only at run time)."""
    import subprocess

    code = (
        "import sys\n"
        "class B:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'rclpy': raise ImportError('rclpy blocked')\n"
        "sys.meta_path.insert(0, B())\n"
        "import trajectory_ensemble_node.replay.bags, trajectory_ensemble_node.replay.plots\n"
        "import trajectory_ensemble_node.replay.playback, trajectory_ensemble_node.cli.launcher\n"
        "import trajectory_ensemble_lab.bench.ros_overhead, trajectory_ensemble_lab.bench.ros_floor\n"
        "assert 'rclpy' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_make_demo_bag_with_reference(tmp_path: Path) -> None:
    """Demonstrations: the robot moves along the expert's path in the frames, and the commanded path is a
    JointTrajectory per scene whose point k stands where the node's row k from the scene's first frame does."""
    from trajectory_ensemble_node.toy import HELDOUT_SEED_BASE, make_scene, render
    from trajectory_ensemble_node.toy.task import FPS, HORIZON, expert_path, expert_sides

    info = bags.make_demo_bag(tmp_path / "demo", scene_offsets=(3, 4), reference=True)
    assert {t.name: t.count for t in info.topics}[bags.DEMO_REFERENCE_TOPIC] == 2
    assert info.custom_data[bags.REFERENCE_TOPIC_KEY] == bags.DEMO_REFERENCE_TOPIC
    sides = {int(k): v for k, v in json.loads(info.custom_data[bags.SIDES_KEY]).items()}
    paths = bags.read_messages(info.path, bags.DEMO_REFERENCE_TOPIC)
    images = bags.read_messages(info.path, bags.DEMO_IMAGE_TOPIC)
    states = bags.read_messages(info.path, bags.DEMO_STATE_TOPIC)
    for i, (log_ns, msg) in enumerate(paths):
        scene = make_scene(HELDOUT_SEED_BASE + 3 + i)
        assert sides[scene.seed] in expert_sides(scene)
        assert bags.stamp_ns(msg) == log_ns == bags.stamp_ns(images[2 * i][1])
        assert list(msg.joint_names) == list(bags.DEMO_JOINT_NAMES) and len(msg.points) == HORIZON
        times = [p.time_from_start.sec * 10**9 + p.time_from_start.nanosec for p in msg.points]
        assert times == [round((k + 1) / FPS * 1e9) for k in range(HORIZON)]
        path = np.array([p.positions for p in msg.points])
        np.testing.assert_allclose(path, expert_path(scene, sides[scene.seed]))
        # Frame 0 shows the scene as it starts; frame 1 (0.5 s = 4 steps in) the robot on the path.
        np.testing.assert_array_equal(bags.image_rgb(images[2 * i][1]), render(scene))
        np.testing.assert_allclose(states[2 * i + 1][1].position, path[3])
        np.testing.assert_array_equal(bags.image_rgb(images[2 * i + 1][1]), render(scene.with_robot(path[3])))
    # Only the first frame of a scene shows it as the plots redraw it.
    assert sorted(bags.toy_scene_seeds(info)) == [bags.stamp_ns(images[0][1]), bags.stamp_ns(images[2][1])]
    # Both modes appear among the bundled demonstrations.
    bundled = json.loads(bags.bag_info(bags.DEMONSTRATION_BAG).custom_data[bags.SIDES_KEY])
    assert set(bundled.values()) == {1, -1}


def test_bundled_demonstration_bag_is_small_and_reproducible(tmp_path: Path) -> None:
    """The committed demonstration bag is what `bags make-demo-bag DIR --reference` writes today."""
    from trajectory_ensemble_node.cli import main

    assert bags.DEMONSTRATION_BAG.is_dir(), "run: trajectory-ensemble bags make-demo-bag " + str(
        bags.DEMONSTRATION_BAG.relative_to(ROOT)) + " --reference"
    assert sum(f.stat().st_size for f in bags.DEMONSTRATION_BAG.iterdir()) < BUNDLED_BAG_MAX_BYTES
    assert main(["bags", "make-demo-bag", str(tmp_path / "fresh"), "--reference"]) == 0
    fresh, bundled = bags.bag_info(tmp_path / "fresh"), bags.bag_info(bags.DEMONSTRATION_BAG)
    assert bundled.topics == fresh.topics and bundled.custom_data == fresh.custom_data
    topics = [t.name for t in bundled.topics]
    assert list(bags.iter_raw(bundled.path, topics)) == list(bags.iter_raw(fresh.path, topics))
    assert main(["bags", "make-demo-bag", str(tmp_path / "other"), "--reference", "--scenes", "2",
                 "--scene-seed", "40"]) == 0
    assert sorted(bags.toy_scene_seeds(bags.bag_info(tmp_path / "other")).values()) == [1_000_040, 1_000_041]
