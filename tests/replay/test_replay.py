"""``trajectory-ensemble replay``: a bag made here is played into a node; goals, stamps and the output bag.

Three levels: a stand-in node in this process (fast: checks timing, remapping and recording with no model), the real
node in a subprocess on the tiny model (the end-to-end contract), and no node at all (the failure must be clear).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trajectory_ensemble_node.replay import bags

pytestmark = pytest.mark.ros

FRAME_PERIOD_NS = 250_000_000
CAMERA_EPOCH_NS = 1_600_000_000 * 1_000_000_000
"""Header stamps come from another clock than the log times, so a test can tell the two apart."""
LOG_START_NS = 1_700_000_000 * 1_000_000_000
GOAL_EVERY_S = 0.5
GOAL_OFFSET_S = 0.2
"""Goals fall 0.2 s after a frame and 0.05 s before the next: well clear of both at rate 1 (see replay.SETTLE_S)."""


def _write_bag(path: Path, frames: int = 6, size: int = 256,
               joints: tuple[str, ...] = ("j0", "j1")) -> list[tuple[int, int]]:
    """A bag of ``frames`` images (and joint states of ``joints``, stamped as the frame) 4 Hz apart; returns
    ``(log time, header stamp)`` per frame. Joint k of frame i is at ``0.1 * i * (-1) ** k``."""
    rng = np.random.default_rng(0)
    frames_out = []
    with bags.BagRecorder(path, "sqlite3") as recorder:
        recorder.write_msg("/cam/instruction", LOG_START_NS, bags.string_msg("reach the target"))
        for i in range(frames):
            log_ns = LOG_START_NS + i * FRAME_PERIOD_NS
            # Camera stamps 30 ms before logging, as a real driver's would be.
            stamp = CAMERA_EPOCH_NS + i * FRAME_PERIOD_NS - 30_000_000
            image = rng.integers(0, 255, size=(size, size, 3), dtype=np.uint8)
            recorder.write_msg("/cam/image_raw", log_ns, bags.image_msg(image, stamp, "cam"))
            positions = tuple(0.1 * i * (-1) ** k for k in range(len(joints)))
            recorder.write_msg("/joint_states", log_ns, bags.joint_state_msg(joints, positions, stamp))
            frames_out.append((log_ns, stamp))
    return frames_out


def _expected_stamps(frames: list[tuple[int, int]]) -> list[int]:
    """The observation stamp current at each goal: the last frame logged before the goal's bag time."""
    end = frames[-1][0]
    expected, t = [], frames[0][0] + int(GOAL_OFFSET_S * 1e9)
    while t <= end:
        expected.append(max(stamp for log_ns, stamp in frames if log_ns <= t))
        t += int(GOAL_EVERY_S * 1e9)
    return expected


# --- a stand-in node: no model, same interface --------------------------------------------------------------------


class _StandIn:
    """Serves GenerateTrajectory under ``/standin`` from the latest image stamp, publishing like the node does; records
    the joint states it receives, and refuses the goals listed in ``refuse`` (goal index -> error code) once each."""

    def __init__(self) -> None:
        import rclpy
        from rclpy.action import ActionServer
        from rclpy.callback_groups import ReentrantCallbackGroup
        from rclpy.executors import MultiThreadedExecutor
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image, JointState
        from trajectory_ensemble_msgs.action import GenerateTrajectory
        from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateArray

        self.Result = GenerateTrajectory.Result
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        self.node = rclpy.create_node("standin", namespace="/", context=self.context)
        self.latest: Any = None
        self.goals: list[Any] = []
        self.states: list[tuple[int, list[str], list[float]]] = []
        self.refuse: dict[int, int] = {}
        group = ReentrantCallbackGroup()
        self.node.create_subscription(Image, "/standin/observation/image", self._on_image, qos_profile_sensor_data)
        self.node.create_subscription(
            JointState, "/standin/observation/state",
            lambda m: self.states.append((bags.stamp_ns(m), list(m.name), list(m.position))), qos_profile_sensor_data)
        self.traj_pub = self.node.create_publisher(ActionTrajectory, "/standin/trajectory", 10)
        self.cand_pub = self.node.create_publisher(CandidateArray, "/standin/candidates", 10)
        self.msgs = (ActionTrajectory, CandidateArray)
        ActionServer(self.node, GenerateTrajectory, "/standin/generate_trajectory", self._execute,
                     callback_group=group)
        self.executor = MultiThreadedExecutor(num_threads=3, context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _on_image(self, msg: Any) -> None:
        self.latest = msg

    def _execute(self, handle: Any) -> Any:
        ActionTrajectory, CandidateArray = self.msgs
        goal = handle.request
        self.goals.append((goal.candidate_count, goal.seed, goal.return_candidates))
        code = self.refuse.pop(len(self.goals) - 1, None)
        if code is not None:
            handle.abort()
            return self.Result(error_code=code, error_message="refused by the stand-in")
        time.sleep(0.3)  # "model time": longer than the frame period, so the bag clock must pause
        n, horizon, dim = max(goal.candidate_count, 1), 4, 2
        cands = np.random.default_rng(goal.seed).normal(size=(n, horizon, dim)).astype(np.float32)
        traj = ActionTrajectory(header=self.latest.header, domain_name="pusht", horizon=horizon, action_dim=dim,
                                dt=0.125, data=cands.mean(0).reshape(-1).tolist(), reducer="mean",
                                candidate_count=n, base_seed=goal.seed, normalized=True)
        cand_msg = CandidateArray(header=self.latest.header, candidate_ids=list(range(n)), seeds=[goal.seed] * n,
                                  horizon=horizon, action_dim=dim, data=cands.reshape(-1).tolist(),
                                  domain_name="pusht", dt=0.125, normalized=True)
        self.traj_pub.publish(traj)
        self.cand_pub.publish(cand_msg)
        handle.succeed()
        result = self.Result(trajectory=traj, base_seed=goal.seed)
        if goal.return_candidates:
            result.candidates = cand_msg
        return result

    def close(self) -> None:
        import rclpy

        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture
def standin(ros_domain_id: int) -> Iterator[_StandIn]:
    pytest.importorskip("trajectory_ensemble_msgs")
    node = _StandIn()
    try:
        yield node
    finally:
        node.close()


def test_replay_into_stand_in(tmp_path: Path, standin: _StandIn) -> None:
    """Remapping, original stamps, paused bag clock, recorded outputs, plots: against a model-free stand-in."""
    from trajectory_ensemble_node.replay.playback import ReplayOptions
    from trajectory_ensemble_node.replay.replay import finish, replay

    frames = _write_bag(tmp_path / "in", size=32)
    opts = ReplayOptions(bag=tmp_path / "in", out=tmp_path / "out", rate=2.0, goal_every_s=GOAL_EVERY_S,
                         goal_offset_s=GOAL_OFFSET_S, candidates=3, return_candidates=True, seed=40,
                         node_namespace="/standin", storage="sqlite3")
    lines: list[str] = []
    report = replay(opts, log=lines.append)
    assert finish(report, opts, log=lines.append) == 0, lines
    expected = _expected_stamps(frames)
    assert [g.expected_stamp_ns for g in report.goals] == expected
    assert [g.stamp_ns for g in report.goals] == expected
    assert standin.goals == [(3, 40 + i, True) for i in range(len(expected))]
    recorded = bags.read_messages(report.bag_path, "/standin/trajectory")
    assert [bags.stamp_ns(m) for _, m in recorded] == expected
    # Log times are bag times: inside the input bag's span, not the wall clock.
    # Even when a trajectory arrives after its goal's result: the bag clock waits for it.
    assert all(LOG_START_NS <= t <= frames[-1][0] for t, _ in recorded), (
        [t - LOG_START_NS for t, _ in recorded], frames[-1][0] - LOG_START_NS)
    # Each output is logged at its goal's scheduled bag time, whatever the goal took.
    assert [round((t - LOG_START_NS) / 1e9, 6) for t, _ in recorded] == [g.bag_time_s for g in report.goals]
    images = bags.read_messages(report.bag_path, "/standin/observation/image")
    assert [bags.stamp_ns(m) for _, m in images] == [stamp for _, stamp in frames]
    assert len(bags.read_messages(report.bag_path, "/standin/candidates")) == len(expected)
    assert (tmp_path / "out" / "trajectories.png").stat().st_size > 10_000
    assert (tmp_path / "out" / "summary.json").is_file()
    assert sum("SUCCEEDED" in line and " ok " in line for line in lines) == len(expected)


def test_reading_a_frames_stamp_imports_no_model_code() -> None:
    """The replay reads a frame's stamp (``bags.stamp_ns``) right after publishing it and sends the goal a moment
    later: an import of the model stack there (diffusers, models.cosmos3: seconds on a loaded CPU) made the node
    refuse every replay's first frame as stale. Checked in a fresh interpreter, after what the replay imports."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from trajectory_ensemble_node.replay import bags, replay\n"
        "from trajectory_ensemble_node.ros.conversions import ns_to_time\n"
        "msg = bags.image_msg(np.zeros((4, 4, 3), np.uint8), 5, 'cam')\n"
        "assert bags.stamp_ns(msg) == 5 and bags.image_rgb(msg).shape == (4, 4, 3)\n"
        "print(sorted(m for m in ('diffusers', 'trajectory_ensemble_node.models.cosmos3') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_replay_fails_clearly_without_node(tmp_path: Path, ros_env: dict[str, str]) -> None:
    """No node: while it waits, replay says for what and since when; then exit status 3 and one error line."""
    _write_bag(tmp_path / "in", frames=2, size=8)
    proc = subprocess.run(
        [sys.executable, "-m", "trajectory_ensemble_node.cli", "replay", str(tmp_path / "in"), "--wait", "3",
         "--node-namespace", "/nobody_here", "--out", str(tmp_path / "out")],
        env=ros_env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert re.fullmatch(r"waiting for the action server /nobody_here/generate_trajectory \(since \d\d:\d\d:\d\d, "
                        r"up to 3 s\)", proc.stdout.splitlines()[0]), proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and lines[0].startswith("error: node not reachable: no action server "
                                                       "/nobody_here/generate_trajectory after 3 s"), proc.stderr


def test_replay_feeds_the_bags_joint_states_and_sends_them_again_when_a_goal_lacked_one(
        tmp_path: Path, standin: _StandIn) -> None:
    """The bag's ``/joint_states`` reach the node's ``~/observation/state`` with their own stamps and values; a goal
    refused for want of its frame's state (``STATE_SKEW``) gets the frame and state published again, then served."""
    from trajectory_ensemble_node.errors import ErrorCode
    from trajectory_ensemble_node.replay.playback import ReplayOptions
    from trajectory_ensemble_node.replay.replay import finish, replay

    frames = _write_bag(tmp_path / "in", frames=4, size=32)
    standin.refuse = {1: int(ErrorCode.STATE_SKEW)}
    opts = ReplayOptions(bag=tmp_path / "in", out=tmp_path / "out", rate=2.0, goal_every_s=GOAL_EVERY_S,
                         goal_offset_s=GOAL_OFFSET_S, candidates=2, seed=3, node_namespace="/standin",
                         storage="sqlite3")
    lines: list[str] = []
    report = replay(opts, log=lines.append)
    assert finish(report, opts, log=lines.append) == 0, lines
    expected = _expected_stamps(frames)
    assert [g.status for g in report.goals] == ["SUCCEEDED"] * len(expected)
    # Goal 2 ran twice (refused, then served from its frame): one goal more than scheduled, the same seed again.
    assert [seed for _, seed, _ in standin.goals] == [3, 4, 4] + [3 + i for i in range(2, len(expected))]
    resent = [line for line in lines if "publishing it again" in line]
    assert len(resent) == 1 and "the joint state of the frame stamped" in resent[0], lines
    received = {stamp: (names, positions) for stamp, names, positions in standin.states}
    assert sorted(received) == [stamp for _, stamp in frames]
    for i, (_, stamp) in enumerate(frames):
        assert received[stamp][0] == ["j0", "j1"]
        np.testing.assert_allclose(received[stamp][1], [0.1 * i, -0.1 * i])
    # The state of goal 2's frame arrived twice; the output bag records the states as played.
    assert [s for s, _, _ in standin.states].count(expected[1]) == 2
    recorded = bags.read_messages(report.bag_path, "/standin/observation/state")
    assert [bags.stamp_ns(m) for _, m in recorded] == [stamp for _, stamp in frames]


@pytest.mark.slow
def test_replay_into_real_node(tmp_path: Path, ros_env: dict[str, str]) -> None:
    """A generated bag replayed into the node (tiny model): one trajectory per goal, stamped with its observation."""
    from trajectory_ensemble_node.cli.launcher import NodeProcess

    frames = _write_bag(tmp_path / "in")
    expected = _expected_stamps(frames)
    params = {"model": "tiny", "device": "cpu", "domain_name": "droid_lerobot", "chunk_size": 8,
              "num_inference_steps": 2, "candidate_count": 2, "max_observation_age_s": 30.0}
    # Its own namespace: no other node of this test session can answer these goals.
    with NodeProcess(params, ros_env, log_path=tmp_path / "node.log", namespace="/replay_test") as node:
        node.start(ready_timeout_s=300)
        proc = subprocess.run(
            [sys.executable, "-m", "trajectory_ensemble_node.cli", "replay", str(tmp_path / "in"),
             "--out", str(tmp_path / "out"), "--goal-every", str(GOAL_EVERY_S), "--goal-offset", str(GOAL_OFFSET_S),
             "--candidates", "3", "--return-candidates", "--rate", "1", "--wait", "30",
             "--node-namespace", "/replay_test/trajectory_ensemble"],
            env=ros_env, capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, f"replay exit status {proc.returncode}:\n{proc.stdout}{proc.stderr}{node.tail()}"
    assert node.proc is not None
    assert node.proc.returncode == 0, f"node exit status {node.proc.returncode}:\n{node.tail()}"
    summary_lines = [line for line in proc.stdout.splitlines() if line.startswith("goal ")]
    assert len(summary_lines) == len(expected) and all(" ok " in line for line in summary_lines), proc.stdout
    out_bag = tmp_path / "out" / "bag"
    trajectories = bags.read_messages(out_bag, "/replay_test/trajectory_ensemble/trajectory")
    assert [bags.stamp_ns(m) for _, m in trajectories] == expected
    assert all(m.candidate_count == 3 and m.horizon == 8 and m.action_dim == 10 for _, m in trajectories)
    candidates = bags.read_messages(out_bag, "/replay_test/trajectory_ensemble/candidates")
    assert [bags.stamp_ns(m) for _, m in candidates] == expected
    assert bags.candidates_array(candidates[0][1]).shape == (3, 8, 10)
    assert (tmp_path / "out" / "trajectories.png").stat().st_size > 10_000


@pytest.mark.slow
def test_replay_serves_a_model_that_takes_state_from_the_bags_joint_states(tmp_path: Path,
                                                                          ros_env: dict[str, str]) -> None:
    """A bag replayed into the node serving a tiny checkpoint that takes state (issue 58): each frame is served with
    the bag's joint state of its stamp, picked by name from a message in another order (a goal would end
    NO_OBSERVATION, STATE_SKEW or OBSERVATION_SCHEMA otherwise, and replay exit 1)."""
    from _node_harness import write_state_checkpoint

    from trajectory_ensemble_node.cli.launcher import NodeProcess

    frames = _write_bag(tmp_path / "in", frames=4, joints=("gripper", "wrist", "elbow", "shoulder"))
    expected = _expected_stamps(frames)
    checkpoint = write_state_checkpoint(tmp_path / "state_model", ("shoulder", "elbow", "gripper"),
                                        [-1.0, -1.0, -1.0], [1.0, 1.0, 1.0])
    params = {"model": str(checkpoint), "device": "cpu", "domain_name": "droid_lerobot", "chunk_size": 8,
              "num_inference_steps": 2, "candidate_count": 2, "max_observation_age_s": 30.0}
    with NodeProcess(params, ros_env, log_path=tmp_path / "node.log", namespace="/replay_state_test") as node:
        node.start(ready_timeout_s=300)
        proc = subprocess.run(
            [sys.executable, "-m", "trajectory_ensemble_node.cli", "replay", str(tmp_path / "in"),
             "--out", str(tmp_path / "out"), "--goal-every", str(GOAL_EVERY_S), "--goal-offset", str(GOAL_OFFSET_S),
             "--candidates", "2", "--rate", "1", "--wait", "30", "--no-plot",
             "--node-namespace", "/replay_state_test/trajectory_ensemble"],
            env=ros_env, capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, f"replay exit status {proc.returncode}:\n{proc.stdout}{proc.stderr}{node.tail()}"
    summary_lines = [line for line in proc.stdout.splitlines() if line.startswith("goal ")]
    assert len(summary_lines) == len(expected) and all(" ok " in line for line in summary_lines), proc.stdout
    out_bag = tmp_path / "out" / "bag"
    trajectories = bags.read_messages(out_bag, "/replay_state_test/trajectory_ensemble/trajectory")
    assert [bags.stamp_ns(m) for _, m in trajectories] == expected
    states = bags.read_messages(out_bag, "/replay_state_test/trajectory_ensemble/observation/state")
    assert [bags.stamp_ns(m) for _, m in states] == [stamp for _, stamp in frames]
