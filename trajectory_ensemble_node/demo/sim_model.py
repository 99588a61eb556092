"""The simulated robot of ``trajectory-ensemble sim``: the toy task's point robot, its clock and its records.

The sim owns time (``/clock`` at ``--real-time-factor``), splices each chunk into its plan as a
JointTrajectoryController does, triggers goals by ``--execute`` and ends episodes by :mod:`..toy.episodes`' rules
(docs/closed-loop.md, "The simulated robot"). This module holds the pure parts (no ROS); the node is
:class:`.sim_robot.SimRobot`, the report :mod:`.sim_report`, the command :mod:`.sim`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..toy import task
from ..toy.episodes import EXECUTE, STEP_BUDGET, Episode

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


class SimClock:
    """Sim time advancing at ``rtf`` times wall time, pausable, and able to jump (a reset, a seek).

    Thread-safe: a :class:`~.clock_publisher.ClockPublisher` thread may read it while another thread moves it.

    Args:
        rtf (`float`): Real-time factor, sim seconds per wall second, ``> 0``.
        start_ns (`int`): Sim time at construction.
        wall (`Callable[[], float]`): Monotonic wall seconds (a test passes a fake one).
    """

    def __init__(self, rtf: float, start_ns: int = START_NS, wall: Callable[[], float] = time.monotonic) -> None:
        if not (math.isfinite(rtf) and rtf > 0):
            raise ValueError(f"real-time factor must be finite and > 0, got {rtf!r}")
        self.rtf, self._wall = float(rtf), wall
        self._lock = threading.RLock()
        self._base_ns, self._since = int(start_ns), wall()
        self.paused = False
        self.held = False
        """Paused because time reached the stop set by :meth:`stop_at` (not by :meth:`pause`)."""
        self._stop_ns: int | None = None

    def now_ns(self) -> int:
        with self._lock:
            if self.paused:
                return self._base_ns
            now = self._base_ns + int(round((self._wall() - self._since) * self.rtf * NS_PER_S))
            if self._stop_ns is not None and now >= self._stop_ns:
                # Reached the stop set by stop_at: time holds there, exactly, until resume().
                self._base_ns, self.paused, self.held, self._stop_ns = self._stop_ns, True, True, None
                return self._base_ns
            return now

    def jump(self, ns: int) -> None:
        """Move sim time by ``ns`` at once, paused or running (negative: back, as a simulator reset does)."""
        with self._lock:
            self._base_ns, self._since = self.now_ns() + int(ns), self._wall()

    def stop_at(self, ns: int | None) -> None:
        """Hold sim time once it reaches ``ns`` (it then reads exactly ``ns`` and ``paused`` is true until
        :meth:`resume`); ``None`` cancels a stop not yet reached."""
        self._stop_ns = None if ns is None else int(ns)

    def pause(self) -> None:
        """Stop sim time where it is (a no-op when paused); cancels a stop not yet reached."""
        with self._lock:
            self._base_ns, self.paused, self.held, self._stop_ns = self.now_ns(), True, False, None

    def resume(self) -> None:
        """Let sim time run again from where it stopped."""
        with self._lock:
            if self.paused:
                self._since, self.paused, self.held = self._wall(), False, False

    def skip(self, ns: int) -> None:
        """Jump ``ns`` ahead while paused (a new episode starts strictly after the last frame of the previous one)."""
        if not self.paused:
            raise ValueError("skip() needs a paused clock")
        self._base_ns += int(ns)


def row_period_ns(dt: float, own_ns: int) -> int:
    """The period (ns) between a served chunk's rows, from its message's ``dt`` (seconds, a float32 on the wire).

    The float32 of 0.1 s reads back as 100 000 001.49 ns: rounded, every row of a 10 Hz chunk would fall 1 ns later
    per row than the sim's ticks, and the robot would hold (or interpolate) at the ticks meant to be rows. So a ``dt``
    that is the float32 of the sim's own period ``own_ns`` is that period; any other is rounded to the nanosecond.
    """
    if np.float32(own_ns / NS_PER_S) == np.float32(dt):
        return int(own_ns)
    return int(round(dt * NS_PER_S))


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
        fixed_delay (`int`, *optional*): Every chunk takes over exactly this many control steps after its goal was
            sent, as in the in-process bench: the sim holds a chunk that comes earlier, and stops its clock while one
            that comes later is still computing. Runs then repeat exactly, whatever the CPU's load. Asynchronous goals
            whose ``inference_delay`` is 0 ask for this many frozen actions. ``None``: chunks take over on arrival.
        horizon (`int`): Rows per served chunk (the toy policy's 8; the world's ``horizon``).
        hold_for_goals (`bool`): With ``fixed_delay``: the clock also stops on the step each goal is due, until it is
            sent, so that goals go out on exactly their step at any real-time factor and load (without it, a loop that
            runs late sends a goal a step later), and ``/clock`` goes out before every frame. A high real-time factor
            then costs the run nothing.
        return_candidates (`bool`): Goals ask for every candidate, and each episode keeps them with the served chunk
            (:attr:`EpisodeRecord.candidates`), for a picture of what the reducer chose from.
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
    fixed_delay: int | None = None
    horizon: int = task.HORIZON
    return_candidates: bool = False
    hold_for_goals: bool = False

    def __post_init__(self) -> None:
        if self.hold_for_goals and self.fixed_delay is None:
            raise ValueError("hold_for_goals needs a fixed_delay (chunks that take over on arrival are not held for)")
        if self.execute is not None and not 1 <= self.execute <= self.horizon:
            raise ValueError(f"execute must be in [1, {self.horizon}] or sync, got {self.execute!r}")
        for name in ("real_time_factor", "fps", "image_rate"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        # Asynchronous: the chunk must take over before the executing one runs out.
        most = self.horizon if self.execute is None else self.horizon - self.execute
        if self.fixed_delay is not None and not 0 <= self.fixed_delay <= most:
            raise ValueError(f"fixed_delay must be in [0, {most}] (with s = {self.execute}), got {self.fixed_delay!r}")
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
    """One episode: the path ``[T + 1, 2]``, chunk switches and goals (what ``--json`` writes per episode).

    ``candidates`` (filled only with :attr:`SimSettings.return_candidates`): goal index to that goal's candidates
    ``[N, H, D]`` and its served chunk ``[H, D]``, as the node answered. Arrays, so ``--json`` leaves them out.
    """

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
    candidates: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def episode(self) -> Episode:
        """The :class:`~..toy.episodes.Episode` of this run, for ``summarize`` (seams as the sim measured them)."""
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
        del data["candidates"]
        data["positions"] = np.round(np.asarray(self.positions), 6).tolist()
        data["reached"], data["collided"] = self.outcome == "target", self.outcome == "collision"
        return data


def episode_line(record: EpisodeRecord) -> str:
    """One printed line per episode."""
    seams = [s["seam_jump_sim"] for s in record.switches if s["seam_jump_sim"] is not None]
    latency = [g.latency_steps for g in record.goals if g.latency_steps is not None and not g.clock_paused]
    return (f"scene {record.scene_seed}: {record.outcome} after {len(record.positions) - 1} steps, "
            f"{len(record.switches)} chunks, mean seam {np.mean(seams) if seams else float('nan'):.3f}, "
            f"latency {np.mean(latency) if latency else float('nan'):.2f} steps, {record.wall_s:.0f} s wall")
