"""``trajectory-ensemble sim``: the toy task's point robot as a ROS node, a real client of the serving node.

The sim owns time. It publishes ``/clock`` advancing at ``--real-time-factor`` (the node runs with
``use_sim_time: true``), so a group that takes seconds on a CPU costs the robot what it would cost on a GPU that is
that much faster: the same delay in control steps. Every control step (``dt = 1 / fps`` of sim time) the robot
moves to the position its spliced plan has for that time and a camera frame of the scene (rgb8, 256 x 256, stamp =
sim time) goes out on the node's image topic.

- **Execution.** ``~/trajectory`` row ``k`` is the robot position target at ``header.stamp + (k + 1) * dt``. A new
  chunk replaces the plan from the first of its rows whose time is still ahead when it arrives (how ros2_control's
  JointTrajectoryController splices); the rows before are what the robot executed meanwhile: the frozen actions.
- **Goals.** ``--execute s``: the next goal is sent once ``s`` actions of the current chunk have executed (``H - s``
  still ahead: 4 of 8, as ``bench --closed-loop`` and LeRobot's half-queue threshold); ``--execute sync``: after the
  whole chunk, the robot standing still until the next one arrives, which then starts at the next step. Goals carry
  ``continue_previous``, ``inference_delay`` and, first in an episode, ``reset_context``.
- **Episodes** (:mod:`..toy.closed_loop`'s definitions) end at the target, on a collision or at the step budget. The
  world waits for an episode's first chunk (the clock is paused), as the in-process bench starts it at once.

The pure parts (clock, plan splicing, trigger, end conditions) are at the top and import no ROS.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..toy import task
from ..toy.closed_loop import EXECUTE, STEP_BUDGET, Episode, scene_seed

NS_PER_S = 1_000_000_000
START_NS = 100 * NS_PER_S
"""Sim time of the first episode: well after 0, which ROS reads as "no time yet"."""
DEFAULT_RTF = 0.05
CLOCK_PERIOD_S = 0.02
"""Wall seconds between ``/clock`` messages."""
FIRST_GOAL_TRIES = 3
"""An episode's first goal is sent again when its answer shows an older frame (the node had not seen the new scene)."""
GOAL_TIMEOUT_S = 300.0
"""Wall seconds an episode may wait for an answer before the sim gives up on the node."""


# --- pure parts ------------------------------------------------------------------------------------------------------


class SimClock:
    """Sim time advancing at ``rtf`` times wall time, pausable.

    Args:
        rtf (`float`): Real-time factor, sim seconds per wall second, ``> 0``.
        start_ns (`int`): Sim time at construction.
        wall (`Callable[[], float]`): Monotonic wall seconds (a test passes a fake one).
    """

    def __init__(self, rtf: float, start_ns: int = START_NS, wall: Callable[[], float] = time.monotonic) -> None:
        if not (math.isfinite(rtf) and rtf > 0):
            raise ValueError(f"real-time factor must be finite and > 0, got {rtf!r}")
        self.rtf, self._wall = float(rtf), wall
        self._base_ns, self._since = int(start_ns), wall()
        self.paused = False

    def now_ns(self) -> int:
        if self.paused:
            return self._base_ns
        return self._base_ns + int(round((self._wall() - self._since) * self.rtf * NS_PER_S))

    def pause(self) -> None:
        """Stop sim time where it is (a no-op when paused)."""
        self._base_ns, self.paused = self.now_ns(), True

    def resume(self) -> None:
        """Let sim time run again from where it stopped."""
        if self.paused:
            self._since, self.paused = self._wall(), False

    def skip(self, ns: int) -> None:
        """Jump ``ns`` ahead while paused (a new episode starts strictly after the last frame of the previous one)."""
        if not self.paused:
            raise ValueError("skip() needs a paused clock")
        self._base_ns += int(ns)


def row_times(stamp_ns: int, dt_ns: int, horizon: int) -> np.ndarray:
    """Times ``[H]`` (ns) of a chunk's rows: row ``k`` at ``stamp + (k + 1) * dt``."""
    return int(stamp_ns) + int(dt_ns) * np.arange(1, horizon + 1, dtype=np.int64)


@dataclass(frozen=True)
class Switch:
    """Where a new chunk took over.

    Args:
        time_ns (`int`): Time of its first executed row.
        first_row (`int`): That row's index (``d``: rows before it were in the past on arrival).
        seam (`float`, *optional*): Distance from that row to what the old plan had for the same time (``None`` for
            the first chunk of an episode).
    """

    time_ns: int
    first_row: int
    seam: float | None


class Plan:
    """Timed position targets, the chunks spliced by time."""

    def __init__(self) -> None:
        self.times: np.ndarray = np.zeros(0, dtype=np.int64)
        self.rows: np.ndarray = np.zeros((0, 2))

    def target(self, t_ns: int, hold: np.ndarray) -> np.ndarray:
        """The position target at ``t_ns``: ``hold`` before the first row, the last row after it, linear between.

        Args:
            t_ns (`int`): Sim time.
            hold (`np.ndarray` of shape `[D]`): Where the robot is (returned when the plan has nothing yet).
        """
        if len(self.times) == 0 or t_ns < self.times[0]:
            return np.asarray(hold, dtype=np.float64).copy()
        if t_ns >= self.times[-1]:
            return self.rows[-1].copy()
        i = int(np.searchsorted(self.times, t_ns, side="right")) - 1
        t0, t1 = self.times[i], self.times[i + 1]
        w = (t_ns - t0) / (t1 - t0)
        return (1 - w) * self.rows[i] + w * self.rows[i + 1]

    def deviation(self, times: np.ndarray, rows: np.ndarray, hold: np.ndarray) -> list[float] | None:
        """Per row ``[H]``, the distance from ``rows`` to this plan's targets at ``times`` (``None``: empty plan)."""
        if len(self.times) == 0:
            return None
        return [float(np.linalg.norm(row - self.target(int(t), hold))) for t, row in zip(times, rows)]

    def splice(self, times: np.ndarray, rows: np.ndarray, now_ns: int, hold: np.ndarray) -> Switch | None:
        """Replace the plan from the first of the new rows whose time is after ``now_ns``.

        Args:
            times (`np.ndarray` of shape `[H]`): The new rows' times (ns), increasing.
            rows (`np.ndarray` of shape `[H, D]`): The new rows.
            now_ns (`int`): Arrival time.
            hold (`np.ndarray` of shape `[D]`): The robot's position (the old target where the plan is empty).

        Returns:
            `Switch` or `None`: ``None`` when every row is already in the past (nothing changes).
        """
        ahead = np.nonzero(np.asarray(times) > now_ns)[0]
        if len(ahead) == 0:
            return None
        k0 = int(ahead[0])
        t0 = int(times[k0])
        seam = None if len(self.times) == 0 else float(np.linalg.norm(rows[k0] - self.target(t0, hold)))
        keep = self.times < t0
        self.times = np.concatenate([self.times[keep], np.asarray(times[k0:], dtype=np.int64)])
        self.rows = np.concatenate([self.rows[keep], np.asarray(rows[k0:], dtype=np.float64)], 0)
        return Switch(t0, k0, seam)


def handover_seam(deviation: list[float] | None, first_row: int | None, frozen: int) -> float | None:
    """The seam a switch puts in the executed path: the new chunk's deviation from the old plan at the row where it
    takes over, ``max(first_row, frozen)``.

    Why not always ``first_row``: when the chunk arrives before its ``frozen`` actions are over (the node's delay
    estimate ran high), the robot first executes frozen rows, equal to the old plan, and the jump comes at row
    ``frozen``. Without continuity ``frozen`` is 0 and this is the deviation at the first row executed.

    Args:
        deviation (`list[float]`, *optional*): ``[H]``: per row, distance from the old plan at the same time.
        first_row (`int`, *optional*): First row executed (``None``: the chunk came too late for any).
        frozen (`int`): The node's frozen count for the chunk (0 when it did not continue).
    """
    if deviation is None or first_row is None:
        return None
    row = max(first_row, frozen)
    return float(deviation[row]) if row < len(deviation) else None


def should_request(now_ns: int, chunk_start_ns: int, dt_ns: int, horizon: int, execute: int | None) -> bool:
    """Whether the next goal is due: ``execute`` (``s``) actions of the current chunk, or all of them (``None``:
    synchronous), have executed by ``now_ns``.

    Args:
        chunk_start_ns (`int`): The current chunk's row 0 time minus ``dt`` (its stamp, unless it was re-timed).
    """
    needed = horizon if execute is None else execute
    return now_ns - chunk_start_ns >= needed * dt_ns


def episode_end(scene: task.Scene, previous: np.ndarray, position: np.ndarray, steps: int,
                budget: int = STEP_BUDGET) -> str | None:
    """``"collision"``, ``"target"``, ``"budget"`` or ``None`` after a step from ``previous`` to ``position``.

    The definitions of :mod:`..toy.closed_loop`: the executed segment within ``COLLISION_CLEARANCE`` of the
    obstacle edge collides (checked first), the robot centre within ``TARGET_RADIUS`` of the target has arrived.
    """
    if task.collides(scene, np.asarray(position)[None], start=previous):
        return "collision"
    if np.linalg.norm(np.asarray(position) - scene.target) <= task.TARGET_RADIUS:
        return "target"
    if steps >= budget:
        return "budget"
    return None


@dataclass(frozen=True)
class SimSettings:
    """How the sim drives the node.

    Args:
        execute (`int`, *optional*): ``s``, actions executed before the next goal; ``None`` = synchronous.
        real_time_factor (`float`): Sim seconds per wall second.
        fps (`float`): Control rate (``dt = 1 / fps``); the toy policy's 8.
        image_rate (`float`): Camera frames per sim second (default: one per control step).
        continue_previous (`bool`): Goals ask the node to continue the executing chunk; when false every goal also
            sets ``reset_context`` (naive switching, whatever the node's own default).
        inference_delay (`int`): Goal field (0 = the node's latency estimate).
        candidates (`int`): Goal ``candidate_count`` (0 = node default).
        reducer (`str`): Goal reducer ("" = node default).
        guidance (`str`): Goal guidance ("" = node default).
        step_budget (`int`): Steps per episode.
        base_seed (`int`): Candidate seeds: held-out scene ``i``, chunk ``c`` uses ``base_seed + 1000 i + c``.
    """

    execute: int | None = EXECUTE
    real_time_factor: float = DEFAULT_RTF
    fps: float = task.FPS
    image_rate: float = task.FPS
    continue_previous: bool = True
    inference_delay: int = 0
    candidates: int = 0
    reducer: str = ""
    guidance: str = ""
    step_budget: int = STEP_BUDGET
    base_seed: int = 0

    def __post_init__(self) -> None:
        if self.execute is not None and not 1 <= self.execute <= task.HORIZON:
            raise ValueError(f"execute must be in [1, {task.HORIZON}] or sync, got {self.execute!r}")
        for name in ("real_time_factor", "fps", "image_rate"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if self.step_budget < 1 or self.inference_delay < 0 or self.candidates < 0:
            raise ValueError(f"step_budget must be >= 1, inference_delay and candidates >= 0; got {self.step_budget}, "
                             f"{self.inference_delay}, {self.candidates}")

    @property
    def dt_ns(self) -> int:
        return int(round(NS_PER_S / self.fps))

    @property
    def mode(self) -> str:
        return "sync" if self.execute is None else f"s={self.execute}"


@dataclass
class GoalRecord:
    """One goal as the sim saw it (times in sim seconds unless ``_wall``)."""

    index: int
    seed: int
    reset_context: bool
    sent_s: float
    sent_wall: float
    stamp_s: float | None = None
    result_s: float | None = None
    latency_s: float | None = None
    latency_steps: float | None = None
    latency_wall_s: float | None = None
    status: str = "pending"
    error_code: int = 0
    error_message: str = ""
    continued: bool | None = None
    continuity_status: str = ""
    frozen_actions: int | None = None
    shift: int | None = None
    seam_jump_node: float | None = None
    clock_paused: bool = False


@dataclass
class EpisodeRecord:
    """One episode: the path ``[T + 1, 2]``, chunk switches and goals (what ``--json`` writes per episode)."""

    scene_seed: int
    mode: str
    continue_previous: bool
    positions: list[list[float]] = field(default_factory=list)
    switches: list[dict[str, Any]] = field(default_factory=list)
    goals: list[GoalRecord] = field(default_factory=list)
    sides: list[int] = field(default_factory=list)
    outcome: str = ""
    start_s: float = 0.0
    wall_s: float = 0.0

    def episode(self) -> Episode:
        """The :class:`~..toy.closed_loop.Episode` of this run, for ``summarize`` (seams as the sim measured them)."""
        seams = [s["seam_jump_sim"] for s in self.switches if s["seam_jump_sim"] is not None]
        return Episode(positions=[np.asarray(p) for p in self.positions],
                       switches=[s["step"] for s in self.switches if s["seam_jump_sim"] is not None], seams=seams,
                       sides=list(self.sides), reached=self.outcome == "target", collided=self.outcome == "collision")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeRecord:
        """Rebuild a record from :meth:`to_json` (e.g. to redraw a picture without running the node again)."""
        fields = {k: v for k, v in data.items() if k not in ("reached", "collided", "goals")}
        return cls(**fields, goals=[GoalRecord(**g) for g in data.get("goals", [])])

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form (positions rounded to 1e-6; NaN left for the writer to turn into null)."""
        data = asdict(self)
        data["positions"] = np.round(np.asarray(self.positions), 6).tolist()
        data["reached"], data["collided"] = self.outcome == "target", self.outcome == "collision"
        return data


# --- the ROS node ----------------------------------------------------------------------------------------------------


def stamp_ns(msg: Any) -> int:
    """A message's ``header.stamp`` in ns."""
    return int(msg.header.stamp.sec) * NS_PER_S + int(msg.header.stamp.nanosec)


class SimRobot:
    """The simulated robot on the ROS graph: ``/clock``, camera frames, goals, and ``~/trajectory`` executed.

    Everything runs on the calling thread (callbacks included, from :meth:`pump`), so no lock is needed.

    Args:
        session (`ClientSession`): rclpy context, node and executor (:mod:`.ros_client`).
        settings (`SimSettings`): How to drive the node.
        node (`str`): The serving node's fully qualified name.
        image_topic (`str`, *optional*): Camera topic (default ``<node>/observation/image``).
        log (`Callable[[str], None]`): Progress lines.
    """

    def __init__(self, session: Any, settings: SimSettings, node: str = "/trajectory_ensemble",
                 image_topic: str | None = None, log: Callable[[str], None] = print) -> None:
        from rclpy.action import ActionClient
        from rclpy.qos import QoSProfile
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import Image
        from trajectory_ensemble_msgs.action import GenerateTrajectory
        from trajectory_ensemble_msgs.msg import ActionTrajectory

        from ..ros.lifecycle import ACTION_SERVICE_QOS

        self.session, self.settings, self.node_name, self.log = session, settings, node, log
        self.image_topic = image_topic or f"{node}/observation/image"
        self.clock = SimClock(settings.real_time_factor)
        self.clock.pause()
        self._Clock, self._Image, self._Goal = Clock, Image, GenerateTrajectory.Goal
        n = session.node
        self.clock_pub = n.create_publisher(Clock, "/clock", QoSProfile(depth=10))
        self.image_pub = n.create_publisher(Image, self.image_topic, QoSProfile(depth=10))
        n.create_subscription(ActionTrajectory, f"{node}/trajectory",
                              lambda msg: self._offer(msg, self.clock.now_ns()), QoSProfile(depth=10))
        # Deep service queues, as the node's own: a goal response must not be dropped while the node is busy.
        self.action = ActionClient(n, GenerateTrajectory, f"{node}/generate_trajectory",
                                   goal_service_qos_profile=ACTION_SERVICE_QOS,
                                   result_service_qos_profile=ACTION_SERVICE_QOS,
                                   cancel_service_qos_profile=ACTION_SERVICE_QOS)
        self._last_clock_wall = -1.0
        self._last_frame_ns = 0
        self._min_stamp_ns = 0
        self._goals: dict[int, GoalRecord] = {}  # seed -> goal of the running episode
        self._arrivals: list[tuple[int, Any, GoalRecord]] = []
        self._seen: set[tuple[int, int]] = set()
        self._in_flight: GoalRecord | None = None
        self._handle: Any = None
        self._positions_at: dict[int, np.ndarray] = {}

    # --- plumbing ------------------------------------------------------------------------------------------------

    def pump(self, seconds: float) -> None:
        """Serve callbacks for ``seconds`` of wall time, publishing ``/clock`` every :data:`CLOCK_PERIOD_S`."""
        deadline = time.monotonic() + max(seconds, 0.0)
        while True:
            wall = time.monotonic()
            if wall - self._last_clock_wall >= CLOCK_PERIOD_S:
                now = self.clock.now_ns()
                msg = self._Clock()
                msg.clock.sec, msg.clock.nanosec = now // NS_PER_S, now % NS_PER_S
                self.clock_pub.publish(msg)
                self._last_clock_wall = wall
            self.session.executor.spin_once(timeout_sec=max(0.0, min(0.005, deadline - wall)))
            if time.monotonic() >= deadline:
                return

    def wait_for_node(self, timeout_s: float) -> None:
        """Wait for the action server and the node's camera subscription (publishing ``/clock`` meanwhile).

        Raises:
            NodeUnreachableError: Either is missing after ``timeout_s``; the message names what.
        """
        from ..errors import NodeUnreachableError
        from .ros_client import domain_text, wait_with_progress

        ready = lambda: self.action.server_is_ready() and self.image_pub.get_subscription_count() > 0  # noqa: E731
        if not wait_with_progress(ready, self.pump, timeout_s, f"the node {self.node_name}", self.log):
            raise NodeUnreachableError(
                f"no action server {self.node_name}/generate_trajectory or no subscriber on {self.image_topic!r} "
                f"after {timeout_s:g} s on {domain_text()}")
        if self._node_sim_time() is False:
            self.log(f"warning: {self.node_name} has use_sim_time false: its latency estimate (the frozen count when "
                     "inference_delay is 0) and staleness checks run on wall time, not the sim's; serve it with "
                     "-p use_sim_time:=true")

    def _node_sim_time(self) -> bool | None:
        # The node's use_sim_time, or None when its parameter service does not answer within a few seconds.
        from rclpy.parameter_client import AsyncParameterClient

        client = AsyncParameterClient(self.session.node, self.node_name)
        if not client.wait_for_services(timeout_sec=5.0):
            return None
        future = client.get_parameters(["use_sim_time"])
        deadline = time.monotonic() + 5.0
        while not future.done() and time.monotonic() < deadline:
            self.pump(0.02)
        values = future.result().values if future.done() and future.result() is not None else []
        return bool(values[0].bool_value) if values else None

    def _publish_frame(self, scene: task.Scene, position: np.ndarray, t_ns: int, repeats: int = 1) -> None:
        rgb = task.render(scene, robot=position)
        msg = self._Image(height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8", step=rgb.shape[1] * 3)
        msg.header.stamp.sec, msg.header.stamp.nanosec = t_ns // NS_PER_S, t_ns % NS_PER_S
        msg.header.frame_id = "toy_camera"
        msg.data = np.ascontiguousarray(rgb).tobytes()
        for _ in range(repeats):
            self.image_pub.publish(msg)
        self._last_frame_ns = t_ns
        self._positions_at[t_ns] = np.asarray(position, dtype=np.float64).copy()

    def _send(self, record: EpisodeRecord, index: int, seed: int, reset: bool) -> None:
        s = self.settings
        # A goal continues or starts fresh, never both (the node refuses that). Without continuity every goal
        # resets: the node's own continue_previous default must not continue for it.
        fresh = reset or not s.continue_previous
        goal = self._Goal(candidate_count=s.candidates, reducer=s.reducer, use_seed=True, seed=seed,
                          continue_previous=not fresh, reset_context=fresh,
                          inference_delay=s.inference_delay, guidance=s.guidance)
        now = self.clock.now_ns()
        goal_record = GoalRecord(index, seed, bool(goal.reset_context), now / NS_PER_S, time.monotonic(),
                                 clock_paused=self.clock.paused)
        record.goals.append(goal_record)
        self._goals[seed] = goal_record
        self._in_flight, self._handle = goal_record, None
        self.action.send_goal_async(goal).add_done_callback(lambda f: self._on_response(goal_record, f))

    def _on_response(self, goal: GoalRecord, future: Any) -> None:
        handle = future.result()
        if not handle.accepted:
            goal.status = "rejected"
            self._in_flight = None
            return
        self._handle = handle
        handle.get_result_async().add_done_callback(lambda f: self._on_result(goal, f))

    def _on_result(self, goal: GoalRecord, future: Any) -> None:
        from action_msgs.msg import GoalStatus

        now, response = self.clock.now_ns(), future.result()
        names = {v: k[len("STATUS_"):] for k, v in vars(GoalStatus).items() if k.startswith("STATUS_")}
        result = response.result
        goal.status = names.get(response.status, str(response.status))
        goal.result_s = now / NS_PER_S
        goal.latency_s = goal.result_s - goal.sent_s
        goal.latency_steps = goal.latency_s * self.settings.fps
        goal.latency_wall_s = time.monotonic() - goal.sent_wall
        goal.error_code, goal.error_message = int(result.error_code), str(result.error_message)
        c = result.continuity
        goal.continued, goal.continuity_status = bool(c.continued), str(c.status)
        goal.frozen_actions, goal.shift, goal.seam_jump_node = int(c.frozen_actions), int(c.shift), float(c.seam_jump)
        if goal.status == "SUCCEEDED" and int(result.trajectory.horizon) > 0:
            goal.stamp_s = stamp_ns(result.trajectory) / NS_PER_S
            self._offer(result.trajectory, now)
        if self._in_flight is goal:
            self._in_flight = None

    def _offer(self, msg: Any, arrival_ns: int) -> None:
        # The topic and the result carry the same chunk: the first to arrive counts. Chunks of goals this episode
        # did not send (another client, a canceled goal of the previous episode) and frames older than the
        # episode (the node answered before it saw the new scene) are not executed.
        key = (stamp_ns(msg), int(msg.base_seed))
        goal = self._goals.get(int(msg.base_seed))
        if key in self._seen or goal is None or key[0] < self._min_stamp_ns:
            return
        self._seen.add(key)
        self._arrivals.append((arrival_ns, msg, goal))

    # --- an episode ----------------------------------------------------------------------------------------------

    def run_episode(self, scene: task.Scene) -> EpisodeRecord:
        """Run one episode on ``scene``; the clock is paused again when it returns.

        Raises:
            TimeoutError: The episode's first chunk did not come within :data:`GOAL_TIMEOUT_S` wall seconds.
        """
        s, wall0 = self.settings, time.monotonic()
        self.clock.pause()
        # Start on the next multiple of dt strictly after the previous episode's last frame: stamps read cleanly,
        # and an answer computed from an older frame is told apart by its stamp alone.
        now = max(self.clock.now_ns(), self._last_frame_ns + 1)
        self.clock.skip(-(-now // s.dt_ns) * s.dt_ns - self.clock.now_ns())
        origin = self.clock.now_ns()
        record = EpisodeRecord(scene.seed, s.mode, s.continue_previous, start_s=origin / NS_PER_S)
        self._goals, self._arrivals, self._seen, self._positions_at = {}, [], set(), {}
        self._min_stamp_ns = origin
        position = np.asarray(scene.robot, dtype=np.float64).copy()
        seed0 = scene_seed(s.base_seed, scene)
        plan, steps, chunk_index = Plan(), 0, 0
        first = self._first_chunk(record, scene, position, origin, seed0)
        self.clock.resume()
        record.positions.append(position.tolist())
        frame_ns = int(round(NS_PER_S / s.image_rate))
        next_tick, next_frame = origin + s.dt_ns, origin + frame_ns
        arrivals = [first]
        chunk_start, retry_after = origin, 0

        def splice(arrival_ns: int, msg: Any, goal: GoalRecord) -> int:
            horizon, width = int(msg.horizon), int(msg.action_dim)
            rows = np.asarray(msg.data, dtype=np.float64).reshape(horizon, width)
            dt_ns, stamp = int(round(float(msg.dt) * NS_PER_S)), stamp_ns(msg)
            if s.execute is None and goal.index > 0:  # synchronous: the robot waited; the chunk starts next step
                times, start = next_tick + dt_ns * np.arange(horizon, dtype=np.int64), next_tick - dt_ns
            else:
                times, start = row_times(stamp, dt_ns, horizon), stamp
            deviation = plan.deviation(times, rows, hold=position)
            switch = plan.splice(times, rows, arrival_ns, hold=position)
            planned_from = self._positions_at.get(stamp, position)
            record.sides.append(task.side(scene, rows, start=planned_from))
            record.switches.append({
                "chunk": goal.index, "seed": goal.seed, "stamp_s": stamp / NS_PER_S, "arrival_s": arrival_ns / NS_PER_S,
                "step": steps, "time_s": None if switch is None else switch.time_ns / NS_PER_S,
                "first_row": None if switch is None else switch.first_row,
                "seam_first_row": None if switch is None else switch.seam, "seam_jump_sim": None,
                "deviation_by_row": None if deviation is None else np.round(deviation, 6).tolist(),
                "position": planned_from.tolist()})
            return start

        while True:
            self.pump(0.005)
            now = self.clock.now_ns()
            arrivals += self._arrivals
            self._arrivals = []
            arrivals.sort(key=lambda a: a[0])
            ended = False
            while not ended:
                due = min(next_tick, next_frame, arrivals[0][0] if arrivals else now + 1)
                if due > now:
                    break
                if next_tick == due:
                    previous, steps = position, steps + 1
                    position = plan.target(next_tick, hold=position)
                    record.positions.append(position.tolist())
                    next_tick += s.dt_ns
                    record.outcome = episode_end(scene, previous, position, steps, s.step_budget) or ""
                    ended = bool(record.outcome)
                elif next_frame == due:
                    self._publish_frame(scene, position, next_frame)
                    next_frame += frame_ns
                else:
                    chunk_start = splice(*arrivals.pop(0))
            if ended:
                break
            if (self._in_flight is None and not arrivals and now >= retry_after
                    and should_request(now, chunk_start, s.dt_ns, task.HORIZON, s.execute)):
                chunk_index += 1
                self.pump(0.02)  # frames and goals travel on separate readers: let the newest frame land first
                self._send(record, chunk_index, seed0 + chunk_index, reset=False)
                retry_after = now + s.dt_ns  # a refused goal is sent again one step later, not in a tight loop
        self.clock.pause()
        self._drain()
        # The frozen counts come with the results, which may land after their chunk came in on ~/trajectory.
        frozen = {g.index: int(g.frozen_actions or 0) if g.continued else 0 for g in record.goals}
        for switch in record.switches:
            switch["seam_jump_sim"] = handover_seam(switch["deviation_by_row"], switch["first_row"],
                                                    frozen.get(switch["chunk"], 0))
        record.wall_s = time.monotonic() - wall0
        return record

    def _first_chunk(self, record: EpisodeRecord, scene: task.Scene, position: np.ndarray, origin: int,
                     seed: int) -> tuple[int, Any, GoalRecord]:
        # The world waits for an episode's first chunk (paused clock): it then starts at once, with rows at their
        # stamped times, so the node's alignment of the next chunk by stamps holds from the first switch on.
        for _ in range(FIRST_GOAL_TRIES):
            self._publish_frame(scene, position, origin, repeats=3)
            self.pump(0.1)
            self._send(record, 0, seed, reset=True)
            deadline = time.monotonic() + GOAL_TIMEOUT_S
            while time.monotonic() < deadline and not self._arrivals and self._in_flight is not None:
                self.pump(0.01)
            if self._arrivals:
                first = self._arrivals.pop(0)
                return first
            if self._in_flight is not None:
                break
        last = record.goals[-1]
        raise TimeoutError(f"scene {scene.seed}: no first chunk from {self.node_name} (last goal: {last.status}, "
                           f"error {last.error_code} {last.error_message!r})")

    def warm_up(self, scene: task.Scene) -> None:
        """One goal on running sim time before the first episode, its answer discarded.

        Why: an episode's first goal runs on a paused clock, so the node measures 0 s for it; without one real
        sample first, the node's latency estimate (its frozen count when ``inference_delay`` is 0) would start at 0.
        """
        self.clock.pause()
        t_ns = self.clock.now_ns()
        record = EpisodeRecord(scene.seed, self.settings.mode, self.settings.continue_previous)
        self._goals, self._min_stamp_ns = {}, t_ns
        self._publish_frame(scene, scene.robot, t_ns, repeats=3)
        self.pump(0.1)
        self.clock.resume()
        self._send(record, 0, 0, reset=True)
        deadline = time.monotonic() + GOAL_TIMEOUT_S
        while self._in_flight is not None and time.monotonic() < deadline:
            self.pump(0.01)
        self.clock.pause()
        self._drain()

    def _drain(self) -> None:
        # A goal still running when the episode ends is canceled, and its answer awaited, so that it cannot land in
        # the next episode (whose first goal also resets the node's remembered chunk).
        deadline = time.monotonic() + 60.0
        canceled = False
        while self._in_flight is not None and time.monotonic() < deadline:
            if self._handle is not None and not canceled:
                self._handle.cancel_goal_async()
                canceled = True
            self.pump(0.01)
        self._arrivals = []
        self._goals = {}


# --- command line ----------------------------------------------------------------------------------------------------


def _execute(text: str) -> int | None:
    if text == "sync":
        return None
    if text.isdigit() and 1 <= int(text) <= task.HORIZON:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected sync or an integer in [1, {task.HORIZON}], got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``sim`` flags to ``parser``."""
    from .ros_client import DEFAULT_NODE

    parser.add_argument("--episodes", type=int, default=3, help="episodes, one held-out scene each (3)")
    parser.add_argument("--scene-seed", type=int, default=0, help="first held-out scene offset (0)")
    parser.add_argument("--real-time-factor", type=float, default=DEFAULT_RTF, metavar="R",
                        help=f"sim seconds per wall second ({DEFAULT_RTF}); the node needs use_sim_time:=true")
    parser.add_argument("--execute", type=_execute, default=EXECUTE, metavar="s|sync",
                        help=f"actions executed before the next goal, or sync: after the whole chunk ({EXECUTE})")
    parser.add_argument("--no-continue", action="store_true",
                        help="goals do not continue the executing chunk (continue_previous false, reset_context)")
    parser.add_argument("--inference-delay", type=int, default=0, help="goal inference_delay (0 = node's estimate)")
    parser.add_argument("--candidates", type=int, default=0, help="goal candidate_count (0 = node default)")
    parser.add_argument("--image-rate", type=float, default=task.FPS, help=f"camera frames per sim second ({task.FPS:g})")
    parser.add_argument("--step-budget", type=int, default=STEP_BUDGET, help=f"steps per episode ({STEP_BUDGET})")
    parser.add_argument("--base-seed", type=int, default=0, help="candidate seeds: base + 1000 scene + chunk (0)")
    parser.add_argument("--json", type=Path, default=Path("out/sim/episodes.json"), help="output (out/sim/episodes.json)")
    parser.add_argument("--node", "--node-name", dest="node", default=DEFAULT_NODE,
                        help=f"the serving node's fully qualified name ({DEFAULT_NODE})")
    parser.add_argument("--image-topic", default=None, help="camera topic (default <node>/observation/image)")
    parser.add_argument("--start-node", action="store_true",
                        help="start the node as a child process (toy model, use_sim_time) instead of using a running one")
    parser.add_argument("--device", default="cpu", help="--start-node: torch device of the node (cpu)")
    parser.add_argument("--wait", type=float, default=60.0, metavar="S", help="seconds to wait for the node (60)")


def settings_from(args: argparse.Namespace) -> SimSettings:
    return SimSettings(execute=args.execute, real_time_factor=args.real_time_factor, image_rate=args.image_rate,
                       continue_previous=not args.no_continue, inference_delay=args.inference_delay,
                       candidates=args.candidates, step_budget=args.step_budget, base_seed=args.base_seed)


def episode_line(record: EpisodeRecord) -> str:
    """One printed line per episode."""
    seams = [s["seam_jump_sim"] for s in record.switches if s["seam_jump_sim"] is not None]
    latency = [g.latency_steps for g in record.goals if g.latency_steps is not None and not g.clock_paused]
    return (f"scene {record.scene_seed}: {record.outcome} after {len(record.positions) - 1} steps, "
            f"{len(record.switches)} chunks, mean seam {np.mean(seams) if seams else float('nan'):.3f}, "
            f"latency {np.mean(latency) if latency else float('nan'):.2f} steps, {record.wall_s:.0f} s wall")


def run(args: argparse.Namespace) -> int:
    """Run ``trajectory-ensemble sim``; 0 when every episode ran to its end."""
    from ..errors import NodeStartError, NodeUnreachableError
    from .ros_client import check_node_name
    from .sim_report import report, simulate

    try:
        check_node_name(args.node)
        settings = settings_from(args)
        if args.episodes < 1:
            raise ValueError(f"--episodes must be >= 1, got {args.episodes}")
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    scenes = task.heldout_scenes(args.episodes, seed=args.scene_seed)
    try:
        records = simulate(scenes, settings, node=args.node, image_topic=args.image_topic,
                           start_node=args.start_node, device=args.device, wait_s=args.wait,
                           log_dir=args.json.parent, log=lambda m: print(m, flush=True))
    except (NodeStartError, NodeUnreachableError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 3
    args.json.parent.mkdir(parents=True, exist_ok=True)
    document = report(records, settings)
    args.json.write_text(json.dumps(document, indent=1))
    summary = document["summary"]
    print(f"sim: success {summary['success_rate']:.2f}, collisions {summary['collision_rate']:.2f}, mean seam "
          f"{summary['seam_jump_mean']:.3f}, continued {summary['continued_fraction']}")
    print(f"wrote {args.json}")
    return 0

