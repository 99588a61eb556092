"""The ROS-free half of replay: options, topic mapping, the goal schedule, the pausable bag clock, the outcomes.

Kept apart from :mod:`.replay` (which needs rclpy) so the timing and bookkeeping are unit-testable anywhere.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ErrorCode
from ..metrics import GroupCounters
from . import bags
from .open_loop import GoalComparison, compare_goal, match_channels, summarize
from .plots import (
    GoalPlot,
    ReferenceGoalPlot,
    candidate_spread,
    plot_channels,
    plot_error_by_step,
    plot_reference,
    plot_toy_scenes,
)
from .reference import ReferenceSeries

DEFAULT_WAIT_S = 300.0
"""How long replay waits for the node's action server by default. The server appears only once the model is loaded:
10-16 s for the 4.5 MB toy policy on a shared 2-core machine, minutes for a real checkpoint (Cosmos3-Nano is about
17 GiB in bf16, read from disk and moved to the device before the first goal can be served). Waiting costs nothing
when the node is already up, and the progress line says what is awaited."""


@dataclass
class ReplayOptions:
    """What ``replay`` does (the CLI flags; ``demo`` fills them itself).

    Args:
        bag (`Path`): Input rosbag2 folder.
        rate (`float`): Playback speed factor (> 0).
        goal_every_s (`float`): Bag seconds between goals (> 0).
        goal_offset_s (`float`): Bag seconds from the first image to the first goal (>= 0).
        out (`Path`): Output folder.
        overwrite (`bool`): Replace an existing ``<out>/bag``.
        storage (`str`): Output bag storage, ``mcap`` or ``sqlite3``.
        candidates (`int`): Goal ``candidate_count`` (0 = node default).
        reducer (`str`): Goal ``reducer`` ("" = node default).
        return_candidates (`bool`): Ask for the candidates, record ``<ns>/candidates``.
        seed (`int`, *optional*): Goal ``i`` (from 0) uses base seed ``seed + i``.
        instruction (`str`): Goal instruction ("" = the node's latest ``~/instruction``).
        node_namespace (`str`): The node's fully qualified name.
        image_topic (`str`, *optional*), state_topic (`str`, *optional*), instruction_topic (`str`, *optional*):
            Bag topics to play; default: the only topic of that type.
        wait_s (`float`): Seconds to wait for the node's action server (:data:`DEFAULT_WAIT_S`).
        goal_timeout_s (`float`): Seconds to wait for one goal.
        plot (`bool`): Write the PNG plots.
        reference_topic (`str`, *optional*): Bag topic of the recorded actions to compare the served chunks with
            (:mod:`.open_loop`); also recorded into the output bag.
        reference_channels (`tuple[str, ...]`, *optional*): Per served channel, the recorded channel it is
            compared with (a joint name, an index or ``-``).
        max_rmse (`float`, *optional*), max_rmse_channel (`dict[str, float]`): The gate's limits on the run's RMSE.
    """

    bag: Path
    rate: float = 1.0
    goal_every_s: float = 1.0
    goal_offset_s: float = 0.25
    out: Path = Path("out/replay")
    overwrite: bool = False
    storage: str = "mcap"
    candidates: int = 0
    reducer: str = ""
    return_candidates: bool = False
    seed: int | None = None
    instruction: str = ""
    node_namespace: str = "/trajectory_ensemble"
    image_topic: str | None = None
    state_topic: str | None = None
    instruction_topic: str | None = None
    wait_s: float = DEFAULT_WAIT_S
    goal_timeout_s: float = 300.0
    plot: bool = True
    reference_topic: str | None = None
    reference_channels: tuple[str, ...] | None = None
    max_rmse: float | None = None
    max_rmse_channel: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.bag, self.out = Path(self.bag), Path(self.out)
        if self.reference_topic is None and (self.reference_channels or self.max_rmse is not None
                                             or self.max_rmse_channel):
            raise ValueError("--reference-channels, --max-rmse and --max-rmse-channel need --reference-topic")
        if self.max_rmse is not None and not self.max_rmse >= 0:
            raise ValueError(f"--max-rmse must be a number >= 0, got {self.max_rmse!r}")
        if self.rate <= 0 or self.goal_every_s <= 0 or self.goal_offset_s < 0 or self.candidates < 0:
            raise ValueError("--rate and --goal-every must be > 0, --goal-offset and --candidates >= 0")
        if not self.node_namespace.startswith("/"):
            raise ValueError(f"--node-namespace must be absolute (start with /), got {self.node_namespace!r}")


def _pick(info: bags.BagInfo, msgtype: str, chosen: str | None, flag: str, required: bool) -> str | None:
    names = info.topics_of_type(msgtype)
    if chosen is not None:
        if chosen not in names:
            raise bags.BagError(f"{flag} {chosen!r}: no {msgtype} topic of that name in {info.path} (has {names})")
        return chosen
    if len(names) > 1:
        raise bags.BagError(f"{info.path} has several {msgtype} topics {names}; choose one with {flag}")
    if not names and required:
        raise bags.BagError(f"{info.path} has no {msgtype} topic to play as the observation")
    return names[0] if names else None


def resolve_inputs(info: bags.BagInfo, opts: ReplayOptions) -> dict[str, tuple[str, str]]:
    """Map bag topics onto the node's inputs: ``{bag topic: (node topic, msgtype)}``.

    Raises:
        BagError: No image topic, several of a type without the flag choosing one, or a chosen topic is missing.
    """
    ns = opts.node_namespace.rstrip("/")
    wanted = [
        (bags.IMAGE_TYPE, opts.image_topic, "--image-topic", True, f"{ns}/observation/image"),
        (bags.STATE_TYPE, opts.state_topic, "--state-topic", False, f"{ns}/observation/state"),
        (bags.STRING_TYPE, opts.instruction_topic, "--instruction-topic", False, f"{ns}/instruction"),
    ]
    inputs: dict[str, tuple[str, str]] = {}
    for msgtype, chosen, flag, required, node_topic in wanted:
        topic = _pick(info, msgtype, chosen, flag, required)
        if topic is not None:
            inputs[topic] = (node_topic, msgtype)
    return inputs


def goal_times(info: bags.BagInfo, image_topic: str, opts: ReplayOptions) -> list[int]:
    """Bag times (ns) of the goals: first image + offset, then every ``goal_every_s``, up to the bag's end.

    Raises:
        BagError: the image topic holds no message.
    """
    first_image = next((t for _, _, t, _ in bags.iter_raw(info.path, [image_topic])), None)
    if first_image is None:
        raise bags.BagError(f"bag {info.path}: the image topic {image_topic!r} holds no message; nothing to replay")
    step = int(round(opts.goal_every_s * 1e9))
    times = []
    t = first_image + int(round(opts.goal_offset_s * 1e9))
    while t <= info.end_ns:
        times.append(t)
        t += step
    return times


class PlaybackClock:
    """Bag time on the wall clock, scaled by ``rate`` and pausable (paused time does not advance the bag).

    Args:
        start_ns (`int`): Bag time that :meth:`start` maps to now.
        rate (`float`): Bag seconds per wall second.
    """

    def __init__(self, start_ns: int, rate: float) -> None:
        self.start_ns = start_ns
        self.rate = rate
        self._wall0 = time.monotonic()
        self._paused_ns: int | None = None

    def start(self) -> None:
        """Map bag ``start_ns`` to now."""
        self._wall0 = time.monotonic()
        self._paused_ns = None

    def now_ns(self) -> int:
        """Current bag time (frozen while paused)."""
        if self._paused_ns is not None:
            return self._paused_ns
        return self.start_ns + int((time.monotonic() - self._wall0) * self.rate * 1e9)

    def delay_until(self, bag_ns: int) -> float:
        """Wall seconds until bag time ``bag_ns`` (<= 0 when it has passed)."""
        return (bag_ns - self.now_ns()) / 1e9 / self.rate

    def wait_until(self, bag_ns: int) -> None:
        """Sleep until bag time ``bag_ns`` (returns at once if it has passed)."""
        delay = self.delay_until(bag_ns)
        if delay > 0:
            time.sleep(delay)

    def pause(self, at_ns: int | None = None) -> None:
        """Stop bag time; at ``at_ns`` when given and already passed (the clock may have run a little past it)."""
        if self._paused_ns is None:
            now = self.now_ns()
            self._paused_ns = min(now, at_ns) if at_ns is not None else now

    def resume(self) -> None:
        """Continue bag time from where it stopped."""
        if self._paused_ns is not None:
            self._wall0 = time.monotonic() - (self._paused_ns - self.start_ns) / 1e9 / self.rate
            self._paused_ns = None


def _metric(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value


@dataclass
class GoalOutcome:
    """One goal of a replay and what came back.

    Args:
        index (`int`): 1-based goal number.
        bag_time_s (`float`): When it was sent, bag seconds since the bag's first message.
        expected_stamp_ns (`int`, *optional*): Header stamp of the latest image published before it.
        status (`str`): Terminal status (SUCCEEDED, ABORTED, CANCELED, REJECTED, TIMEOUT).
        error_code (`int`), error_message (`str`): From the result.
        latency_ms (`float`): Send-goal to result, on this side.
        metrics (`dict[str, float | str]`): The result's metrics.
        stamp_ns (`int`, *optional*): The trajectory's header stamp.
        trajectory (`np.ndarray`, *optional*): ``[H, D]``.
        candidates (`np.ndarray`, *optional*): ``[N, H, D]`` when returned.
        dt (`float`), reducer (`str`), normalized (`bool`), base_seed (`int`), domain_name (`str`): From the result.
        image (`np.ndarray`, *optional*): The observation image (plots only, not serialized).
        scene_seed (`int`, *optional*): The toy scene of that image (demo bag only).
        uncertainty_score (`float`, *optional*), uncertainty_threshold (`float`, *optional*): The result's
            ``uncertainty.score`` and ``.threshold`` at full float32 precision (the metrics round to 3 decimals);
            for ``calibrate --bag``, not serialized.
    """

    index: int
    bag_time_s: float
    expected_stamp_ns: int | None
    status: str
    error_code: int = 0
    error_message: str = ""
    latency_ms: float = 0.0
    metrics: dict[str, float | str] = field(default_factory=dict)
    stamp_ns: int | None = None
    trajectory: np.ndarray | None = None
    candidates: np.ndarray | None = None
    dt: float = 0.0
    reducer: str = ""
    normalized: bool = True
    base_seed: int = 0
    domain_name: str = ""
    image: np.ndarray | None = None
    scene_seed: int | None = None
    uncertainty_score: float | None = None
    uncertainty_threshold: float | None = None

    @classmethod
    def from_result(cls, index: int, bag_time_s: float, expected_stamp_ns: int | None, status: str, result: Any,
                    latency_ms: float, image: np.ndarray | None = None, scene_seed: int | None = None) -> GoalOutcome:
        """Build from a ``GenerateTrajectory.Result`` (``None`` when no result came back)."""
        outcome = cls(index, bag_time_s, expected_stamp_ns, status, latency_ms=latency_ms, image=image,
                      scene_seed=scene_seed)
        if result is None:
            return outcome
        outcome.error_code, outcome.error_message = int(result.error_code), str(result.error_message)
        outcome.metrics = {kv.key: _metric(kv.value) for kv in result.metrics}
        outcome.base_seed = int(result.base_seed)
        traj = result.trajectory
        if status == "SUCCEEDED" and int(traj.horizon) > 0:
            outcome.trajectory = bags.trajectory_array(traj)
            outcome.stamp_ns = bags.stamp_ns(traj)
            outcome.dt, outcome.reducer = float(traj.dt), str(traj.reducer)
            outcome.normalized, outcome.domain_name = bool(traj.normalized), str(traj.domain_name)
            if int(result.candidates.horizon) > 0 and len(result.candidates.data):
                outcome.candidates = bags.candidates_array(result.candidates)
            outcome.uncertainty_score = float(result.uncertainty.score)
            outcome.uncertainty_threshold = float(result.uncertainty.threshold)
        return outcome

    @property
    def stamp_ok(self) -> bool:
        """The trajectory carries the stamp of the observation current when the goal was sent."""
        return self.stamp_ns is not None and self.stamp_ns == self.expected_stamp_ns

    @property
    def spread(self) -> float | None:
        """:func:`~.plots.candidate_spread` of the returned candidates."""
        return None if self.candidates is None else candidate_spread(self.candidates)

    def summary_line(self, total: int) -> str:
        """One line: status, stamp check, latency vs engine time, forwards, N x reducer, candidate spread."""
        head = f"goal {self.index}/{total} @ {self.bag_time_s:6.2f} s  {self.status:<9}"
        if self.status != "SUCCEEDED":
            try:
                name = ErrorCode(self.error_code).name
            except ValueError:
                name = str(self.error_code)
            return f"{head} code {self.error_code} {name}: {self.error_message}"
        stamp = f"{self.stamp_ns // 1_000_000_000}.{self.stamp_ns % 1_000_000_000:09d}" if self.stamp_ns else "-"
        counters = GroupCounters.from_metrics(self.metrics)
        engine, forwards = counters.total_ms, counters.physical_forwards
        count = counters.candidate_count
        count = (len(self.candidates) if self.candidates is not None else "?") if count is None else count
        spread = f"{self.spread:.3f}" if self.spread is not None else "-"
        engine_text = f"{engine:7.1f}" if isinstance(engine, float) else "      -"
        return (f"{head} stamp {stamp} {'ok' if self.stamp_ok else 'MISMATCH'}  latency {self.latency_ms:7.1f} ms "
                f"(engine {engine_text} ms)  forwards {int(forwards) if isinstance(forwards, float) else '-'}  "
                f"{int(count) if isinstance(count, (int, float)) else count}x {self.reducer}  spread {spread}")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary (arrays as nested lists)."""
        return {
            "index": self.index, "bag_time_s": self.bag_time_s, "status": self.status,
            "error_code": self.error_code, "error_message": self.error_message, "latency_ms": self.latency_ms,
            "expected_stamp_ns": self.expected_stamp_ns, "stamp_ns": self.stamp_ns, "stamp_ok": self.stamp_ok,
            "reducer": self.reducer, "base_seed": self.base_seed, "dt": self.dt, "normalized": self.normalized,
            "domain_name": self.domain_name, "candidate_spread": self.spread, "scene_seed": self.scene_seed,
            "metrics": self.metrics,
            "trajectory": None if self.trajectory is None else self.trajectory.tolist(),
            "candidates": None if self.candidates is None else self.candidates.tolist(),
        }

    def plot_data(self, start_ns: int) -> GoalPlot:
        """The :class:`~.plots.GoalPlot` of this goal (it must have succeeded)."""
        assert self.trajectory is not None and self.stamp_ns is not None
        scene = None
        if self.scene_seed is not None:
            from ..toy.task import make_scene

            scene = make_scene(self.scene_seed)
        return GoalPlot(f"goal {self.index}", (self.stamp_ns - start_ns) / 1e9, self.dt, self.trajectory,
                        self.reducer, self.candidates, self.normalized, self.image, scene)


@dataclass
class ReplayReport:
    """Everything a replay produced.

    Args:
        out_dir (`Path`): The output folder.
        bag_path (`Path`): The recorded bag.
        start_ns (`int`): First log time of the input bag (plots measure time from it).
        goals (`list[GoalOutcome]`): In order.
        recorded (`dict[str, int]`): Messages written per topic.
        received_stamps (`dict[str, list[int]]`): Header stamps of the node's outputs, per topic.
        trajectory_topic (`str`): The node's ``~/trajectory``.
        model_title (`str`): Shown in plot titles.
        reference_series (`ReferenceSeries`, *optional*): The recorded actions (``--reference-topic``).
        served_names (`tuple[str, ...]`, *optional*): The node's ``joint_names``, when it has them.
        reference (`dict`, *optional*): The ``reference`` section of ``summary.json``, once evaluated.
        comparisons (`list[GoalComparison]`): Each compared goal, once evaluated.
    """

    out_dir: Path
    bag_path: Path
    start_ns: int = 0
    goals: list[GoalOutcome] = field(default_factory=list)
    recorded: dict[str, int] = field(default_factory=dict)
    received_stamps: dict[str, list[int]] = field(default_factory=dict)
    trajectory_topic: str = ""
    model_title: str = ""
    reference_series: ReferenceSeries | None = None
    served_names: tuple[str, ...] | None = None
    reference: dict[str, Any] | None = None
    comparisons: list[GoalComparison] = field(default_factory=list)

    def problems(self) -> list[str]:
        """What went wrong, one line each (empty: every goal succeeded, stamped right, and was recorded)."""
        problems = [f"goal {g.index}: {g.status} (code {g.error_code}) {g.error_message}".rstrip()
                    for g in self.goals if g.status != "SUCCEEDED"]
        problems += [f"goal {g.index}: trajectory stamp {g.stamp_ns} != observation stamp {g.expected_stamp_ns}"
                     for g in self.goals if g.status == "SUCCEEDED" and not g.stamp_ok]
        succeeded = sum(g.status == "SUCCEEDED" for g in self.goals)
        recorded = len(self.received_stamps.get(self.trajectory_topic, []))
        if recorded != succeeded:
            problems.append(f"recorded {recorded} message(s) on {self.trajectory_topic} "
                            f"for {succeeded} successful goal(s)")
        if not self.goals:
            problems.append("no goal was sent (the bag is shorter than --goal-offset after its first image)")
        return problems

    def write_plots(self) -> list[Path]:
        """Write ``trajectories.png`` and, for the toy bag with candidates, ``toy_scenes.png``."""
        done = [g.plot_data(self.start_ns) for g in self.goals if g.status == "SUCCEEDED" and g.trajectory is not None]
        if not done:
            return []
        suffix = f" - {self.model_title}" if self.model_title else ""
        paths = [plot_channels(done, self.out_dir / "trajectories.png",
                               f"candidates vs reduced trajectory per action channel ({done[0].reducer}){suffix}")]
        # Toy scenes only make sense for the toy's action space: [H, 2] waypoints in scene coordinates.
        toy = [g for g in done if g.scene is not None and g.candidates is not None and g.reduced.shape[1] == 2]
        if toy:
            paths.append(plot_toy_scenes(toy, self.out_dir / "toy_scenes.png",
                                         title=f"toy obstacle task: candidates and reducers{suffix}"))
        return paths

    def evaluate_reference(self, selectors: tuple[str, ...] | None = None) -> dict[str, Any]:
        """Compare the succeeded goals' chunks with :attr:`reference_series`; sets and returns :attr:`reference`.

        Raises:
            ReferenceError: The channels do not match (width, names) or no row overlaps the recording in time.
        """
        assert self.reference_series is not None
        series = self.reference_series
        done = [g for g in self.goals if g.status == "SUCCEEDED" and g.trajectory is not None
                and g.stamp_ns is not None]
        if not done:
            self.reference = {"topic": series.topic, "msgtype": series.msgtype, "goals_compared": 0,
                              "rows_compared": 0, "goals": [], "error": "no goal succeeded: nothing to compare"}
            return self.reference
        channels = match_channels(series, done[0].trajectory.shape[1], self.served_names, selectors)
        self.comparisons = [compare_goal(g.index, g.stamp_ns, g.dt, g.trajectory, g.candidates, series, channels)
                            for g in done]
        self.reference = summarize(self.comparisons, series, channels,
                                   served_normalized=any(g.normalized for g in done))
        return self.reference

    def write_reference_plots(self) -> list[Path]:
        """Write ``reference.png`` and ``error_by_step.png`` (after :meth:`evaluate_reference`)."""
        section, series = self.reference, self.reference_series
        if not self.comparisons or section is None or series is None or "channels" not in section:
            return []
        refs = [entry["reference"] for entry in section["channel_map"]]
        indices = [series.names.index(r) if series.names is not None else int(r) for r in refs]
        origin = min([series.channels[i].first_ns for i in indices] + [c.stamp_ns for c in self.comparisons])
        recorded = [((series.channels[i].times_ns - origin) / 1e9, series.channels[i].values) for i in indices]
        goals = [ReferenceGoalPlot(f"goal {c.index}", (c.stamp_ns - origin) / 1e9, (c.times_ns - origin) / 1e9,
                                   c.served, c.compared, c.candidates) for c in self.comparisons]
        suffix = f" - {self.model_title}" if self.model_title else ""
        stamp = f"{origin // 1_000_000_000}.{origin % 1_000_000_000:09d}"
        paths = [plot_reference(recorded, goals, section["channels"], self.out_dir / "reference.png",
                                title=f"served chunks against {series.topic} ({section['rmse']:.4f} RMSE over "
                                      f"{section['rows_compared']} rows){suffix}",
                                axis_label=f"seconds since {stamp} s; row k of a chunk at its observation stamp "
                                           "(dotted) + (k+1) dt")]
        dt = float(section["dt"] or 0.0)
        steps = [(k + 1) * dt for k in range(len(section["error_by_step"]))]
        paths.append(plot_error_by_step(steps, section["error_by_step"], section["error_by_step_per_channel"],
                                        self.out_dir / "error_by_step.png",
                                        best=section.get("best_candidate_error_by_step"),
                                        title=f"error by horizon step against {series.topic}{suffix}"))
        return paths

    def write_summary(self) -> Path:
        """Write ``summary.json``: per goal, the bag's topic counts, and the problems (and ``reference``)."""
        path = self.out_dir / "summary.json"
        document: dict[str, Any] = {
            "bag": str(self.bag_path), "recorded": self.recorded, "problems": self.problems(),
            "goals": [g.to_json() for g in self.goals],
        }
        if self.reference is not None:
            document["reference"] = self.reference
        path.write_text(json.dumps(document, indent=1), encoding="utf-8")
        return path
