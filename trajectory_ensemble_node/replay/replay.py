"""``trajectory-ensemble replay BAG``: play a rosbag2 into the running node, send goals, record what it publishes.

The goal schedule, the paused bag clock, frame and state resends (:data:`FRAME_RESENDS`), the outputs, the reference
comparison and the exit status (0 ok, 1 a goal failed or a gate, 2 bad input, 3 node unreachable) are in
docs/replay.md and docs/replay-tests.md.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ..cli.exits import fail
from ..errors import ErrorCode
from . import bags
from .bag_check import check_replay_bag
from .open_loop import GateLimitError, check_gate, check_limit_names, parse_channel_limit
from .playback import (
    DEFAULT_WAIT_S,
    GoalOutcome,
    PlaybackClock,
    ReplayOptions,
    ReplayReport,
    goal_times,
    resolve_inputs,
)
from .reference import ReferenceError, ReferenceSeries, read_reference
from ..cli.ros_client import DISCOVERY_SETTLE_S, ClientSession, NodeUnreachableError, domain_text, wait_with_progress

EXIT_OK = 0
EXIT_GOALS_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
SETTLE_S = 0.1
"""A goal waits at least this long (wall time) after the last image, so the node has taken that frame in before the
goal arrives: frames and goals travel on separate DDS readers, and a loaded node may handle them out of order."""
DRAIN_S = 2.0
"""How long to wait after the last goal for its ``~/trajectory`` message to arrive."""
FRAME_RESENDS = 2
"""How often a goal is sent again, after its frame (and the latest joint state) is published again, when the node
never received that frame (``OBSERVATION_NOT_RECEIVED``) or has no joint state near its stamp (``STATE_SKEW``): the
node's observation subscriptions are best effort, and DDS may drop a sample on a loaded host. A drop is the
transport's, not the policy's, so a replay does not count it against the goal."""
RESENT_FOR = {int(ErrorCode.OBSERVATION_NOT_RECEIVED): "frame", int(ErrorCode.STATE_SKEW): "joint state"}
"""The refusals a replay answers by publishing the observation again, and what the node lacked."""
OUTPUT_WAIT_S = 0.5
"""How long a succeeded goal keeps the bag clock paused for its ``~/trajectory`` (wall time), so the output is
logged at the goal's bag time even when the message arrives after the result."""
PARAMETER_WAIT_S = 5.0
"""How long ``--reference-topic`` waits for the node's parameter services to read its ``joint_names`` (the node
is up by then; a node without them is compared by index)."""


class _RosSession(ClientSession):
    """The replay's rclpy side: input publishers, the action client and raw output subscriptions.

    Spun only from the calling thread, as every :class:`~.ros_client.ClientSession` is (the docstring there says why).
    """

    def __init__(self, opts: ReplayOptions, inputs: dict[str, tuple[str, str]], on_output: Any) -> None:
        from rclpy.action import ActionClient
        from rclpy.qos import QoSProfile
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import String
        from trajectory_ensemble_msgs.action import GenerateTrajectory
        from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateArray

        # Imported here, not in run_goal: it pulls in torch, seconds of import on a loaded CPU that would pass
        # between the first frame and its goal, and the node would refuse that frame as too old.
        from ..ros.conversions import ns_to_time

        super().__init__("trajectory_ensemble_replay")
        self.ns_to_time = ns_to_time
        self.GenerateTrajectory = GenerateTrajectory
        classes = {bags.IMAGE_TYPE: Image, bags.STATE_TYPE: JointState, bags.STRING_TYPE: String}
        # Reliable publishers match both reliable and best-effort (sensor-data) subscriptions.
        self.publishers = {bag_topic: self.node.create_publisher(classes[msgtype], node_topic, QoSProfile(depth=10))
                           for bag_topic, (node_topic, msgtype) in inputs.items()}
        ns = opts.node_namespace.rstrip("/")
        self.action_name = f"{ns}/generate_trajectory"
        self.client = ActionClient(self.node, GenerateTrajectory, self.action_name)
        outputs = [(f"{ns}/trajectory", ActionTrajectory, bags.TRAJECTORY_TYPE)]
        if opts.return_candidates:
            outputs.append((f"{ns}/candidates", CandidateArray, bags.CANDIDATES_TYPE))
        self.output_topics = [topic for topic, _, _ in outputs]
        for topic, cls, msgtype in outputs:
            # raw=True hands over the CDR bytes as received: recorded exactly as ros2 bag record would.
            self.node.create_subscription(cls, topic, lambda data, t=topic, m=msgtype: on_output(t, m, data),
                                          QoSProfile(depth=50), raw=True)

    def wait_for_node(self, timeout_s: float, log: Any = print) -> None:
        """Wait for the action server (saying so every few seconds), then briefly for the node's subscriptions and
        publishers to match."""
        if not wait_with_progress(self.client.server_is_ready, self.spin_for, timeout_s,
                                  f"the action server {self.action_name}", log):
            raise NodeUnreachableError(
                f"node not reachable: no action server {self.action_name} after {timeout_s:g} s "
                f"(is the node running, on {domain_text()}, under the name {self.action_name.rsplit('/', 1)[0]}?)"
            )
        # Discovery of topics completes independently of the action; a first frame sent before it would be lost.
        deadline = time.monotonic() + min(timeout_s, 5.0)
        while time.monotonic() < deadline:
            if all(p.get_subscription_count() > 0 for p in self.publishers.values()) and all(
                self.node.count_publishers(t) > 0 for t in self.output_topics[:1]
            ):
                # No API shows the node's readers matching our writers; a frame sent before would be lost unseen.
                self.spin_for(DISCOVERY_SETTLE_S)
                return
            self.spin_for(0.05)

    def joint_names(self, node_name: str, log: Any = print) -> tuple[str, ...] | None:
        """The node's ``joint_names`` parameter (``None`` when unset, ``['']``, or not readable)."""
        from ..cli.params import ParamClient, ParameterRefusedError, python_value

        try:
            value = python_value(ParamClient(self, node_name, PARAMETER_WAIT_S, log).get(["joint_names"])[0])
        except (ParameterRefusedError, NodeUnreachableError) as error:
            log(f"reference: served channels unnamed ({error}); matching by index or --reference-channels")
            return None
        names = tuple(str(n) for n in (value or []) if str(n))
        return names or None

    def publish(self, bag_topic: str, data: bytes) -> None:
        """Publish one message of ``bag_topic`` as its CDR bytes."""
        self.publishers[bag_topic].publish(data)

    def run_goal(self, opts: ReplayOptions, index: int, frame_stamp_ns: int | None) -> tuple[str, Any, float]:
        """Send goal ``index`` and wait for its result: ``(status name, result or None, latency ms)``.

        Args:
            frame_stamp_ns (`int`, *optional*): Stamp of the frame published last: the goal asks to be served from it
                or a newer one (``min_observation_stamp``), so the node waits for it if the goal overtook it.
        """
        from action_msgs.msg import GoalStatus

        names = {v: k[len("STATUS_"):] for k, v in vars(GoalStatus).items() if k.startswith("STATUS_")}
        goal = self.GenerateTrajectory.Goal(instruction=opts.instruction, candidate_count=opts.candidates,
                                            reducer=opts.reducer, return_candidates=opts.return_candidates)
        if opts.seed is not None:
            goal.use_seed, goal.seed = True, int(opts.seed) + index
        if frame_stamp_ns is not None:
            goal.min_observation_stamp = self.ns_to_time(frame_stamp_ns)
        started = time.perf_counter()
        sent = self.client.send_goal_async(goal)
        if not self.wait_future(sent, opts.goal_timeout_s):
            return "TIMEOUT", None, (time.perf_counter() - started) * 1e3
        handle = sent.result()
        if not handle.accepted:
            return "REJECTED", None, (time.perf_counter() - started) * 1e3
        result_future = handle.get_result_async()
        if not self.wait_future(result_future, opts.goal_timeout_s):
            handle.cancel_goal_async()
            self.spin_for(0.5)
            return "TIMEOUT", None, (time.perf_counter() - started) * 1e3
        latency_ms = (time.perf_counter() - started) * 1e3
        response = result_future.result()
        return names.get(response.status, str(response.status)), response.result, latency_ms


def replay(opts: ReplayOptions, log: Any = print) -> ReplayReport:
    """Replay ``opts.bag`` into the node and record its outputs (docs/replay.md).

    Args:
        opts (`ReplayOptions`): What to replay and how.
        log (`Callable[[str], None]`): Receives the per-goal summary lines.

    Raises:
        BagError: The bag cannot be read, lacks an image topic, or holds a message that cannot be deserialized
            (:class:`~.bag_check.CorruptMessageError`, raised before the node is contacted).
        NodeUnreachableError: The node's action server is not up within ``opts.wait_s``.
    """
    info = bags.bag_info(opts.bag)
    inputs = resolve_inputs(info, opts)
    # Every message it will read, deserialized before the node is contacted: a damaged recording exits 2, not 1.
    check_replay_bag(opts)
    series = _read_reference(opts)
    image_topic = next(t for t, (_, m) in inputs.items() if m == bags.IMAGE_TYPE)
    state_topic = next((t for t, (_, m) in inputs.items() if m == bags.STATE_TYPE), None)
    scene_seeds = bags.toy_scene_seeds(info)
    out_bag = opts.out / "bag"
    if out_bag.exists():
        if not opts.overwrite:
            raise bags.BagError(f"{out_bag} exists; pass --overwrite or choose another --out")
        shutil.rmtree(out_bag)
    opts.out.mkdir(parents=True, exist_ok=True)
    clock = PlaybackClock(info.start_ns, opts.rate)
    outputs = _Outputs(clock)
    session = _RosSession(opts, inputs, outputs.on_message)
    report = ReplayReport(out_dir=opts.out, bag_path=out_bag, start_ns=info.start_ns,
                          trajectory_topic=session.output_topics[0], reference_series=series)
    recorder: bags.BagRecorder | None = None
    try:
        session.wait_for_node(opts.wait_s, log)
        if series is not None:
            report.served_names = session.joint_names(opts.node_namespace, log)
        recorder = bags.BagRecorder(out_bag, opts.storage,
                                    custom_data={"trajectory_ensemble.replayed_bag": str(opts.bag)})
        schedule = goal_times(info, image_topic, opts)
        latest: dict[str, Any] = {"stamp": None, "image": None, "data": None, "wall": 0.0, "state": None}
        clock.start()

        def send_goal(t_ns: int) -> None:
            session.spin_for(clock.delay_until(t_ns))
            # The goal happens at its scheduled bag time, however long the wait for the node to take in the last
            # frame and the goal itself take: its outputs are logged at that time.
            clock.pause(at_ns=t_ns)
            session.spin_for(SETTLE_S - (time.monotonic() - latest["wall"]))
            status, result, latency_ms = session.run_goal(opts, len(report.goals), latest["stamp"])
            for _ in range(FRAME_RESENDS):
                lacked = RESENT_FOR.get(int(result.error_code)) if result is not None else None
                if lacked is None or (lacked == "joint state" and latest["state"] is None):
                    break
                log(f"goal {len(report.goals) + 1}: the node did not receive the {lacked} of the frame stamped "
                    f"{latest['stamp'] / 1e9:.9f}; publishing it again")
                session.publish(image_topic, latest["data"])
                if latest["state"] is not None:
                    session.publish(state_topic, latest["state"])
                session.spin_for(SETTLE_S)
                status, result, latency_ms = session.run_goal(opts, len(report.goals), latest["stamp"])
            # The topic and the result travel separately; the bag clock waits for both.
            expected = sum(g.status == "SUCCEEDED" for g in report.goals) + (status == "SUCCEEDED")
            deadline = time.monotonic() + OUTPUT_WAIT_S
            while outputs.count(report.trajectory_topic) < expected and time.monotonic() < deadline:
                session.spin_for(0.005)
            clock.resume()
            outcome = GoalOutcome.from_result(len(report.goals) + 1, (t_ns - info.start_ns) / 1e9, latest["stamp"],
                                              status, result, latency_ms, image=latest["image"],
                                              scene_seed=scene_seeds.get(latest["stamp"] or -1))
            report.goals.append(outcome)
            log(outcome.summary_line(len(schedule)))

        # The reference topic is recorded (under its own name) for the analysis; published only if it is an input
        # as well (a team comparing with its measured /joint_states).
        played = list(inputs) + ([series.topic] if series is not None and series.topic not in inputs else [])
        for topic, msgtype, t_ns, data in bags.iter_raw(opts.bag, played):
            while schedule[len(report.goals):] and schedule[len(report.goals)] < t_ns:
                send_goal(schedule[len(report.goals)])
                outputs.flush(recorder)
            session.spin_for(clock.delay_until(t_ns))
            if topic not in inputs:
                recorder.write(topic, msgtype, t_ns, data)
                continue
            session.publish(topic, data)
            recorder.write(inputs[topic][0], msgtype, t_ns, data)
            if topic == image_topic:
                msg = bags.deserialize(data, msgtype)
                latest.update(stamp=bags.stamp_ns(msg), image=_plottable(msg), data=data, wall=time.monotonic())
            elif topic == state_topic:
                latest["state"] = data
        while len(report.goals) < len(schedule):
            send_goal(schedule[len(report.goals)])
        # The node publishes ~/trajectory before the goal succeeds, but the topic and the result travel separately.
        deadline = time.monotonic() + DRAIN_S
        expected = sum(g.status == "SUCCEEDED" for g in report.goals)
        while time.monotonic() < deadline and outputs.count(report.trajectory_topic) < expected:
            session.spin_for(0.05)
        outputs.flush(recorder)
    finally:
        if recorder is not None:
            recorder.close()
            report.recorded = dict(recorder.counts)
        session.close()
    report.received_stamps = outputs.stamps()
    return report


def _read_reference(opts: ReplayOptions) -> ReferenceSeries | None:
    """The recorded actions of ``--reference-topic``, checked before any goal is sent (``None`` without the flag).

    Raises:
        ReferenceError: The topic is missing, of a type that cannot be compared, or holds nothing; a
            ``--reference-channels`` name the recording lacks.
        GateLimitError: A ``--max-rmse-channel`` name that is no recorded joint (when the recording names them).
    """
    if opts.reference_topic is None:
        return None
    series = read_reference(opts.bag, opts.reference_topic)
    if series.names is not None:
        for selector in opts.reference_channels or ():
            if selector != "-" and not selector.isdigit() and selector not in series.names:
                raise ReferenceError(f"--reference-channels {selector!r}: no such joint on {series.describe()}")
        names = [s for s in (opts.reference_channels or series.names) if s in series.names]
        check_limit_names(names or series.names, opts.max_rmse_channel)
    return series


def _plottable(msg: Any) -> Any:
    """The frame as RGB for the plots, or None for an encoding they cannot show (the node may still accept it)."""
    try:
        return bags.image_rgb(msg)
    except (bags.BagError, ValueError):
        return None


class _Outputs:
    """The node's outputs as they arrive, queued and written to the bag between the replay's own writes.

    Callbacks only queue: the bag is written in one place, in the order the replay chooses (rosbags' sqlite3 writer
    must also stay on the thread that opened it).
    """

    def __init__(self, clock: PlaybackClock) -> None:
        import threading

        self._clock = clock
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str, int, bytes]] = []
        self._stamps: dict[str, list[int]] = {}

    def on_message(self, topic: str, msgtype: str, data: bytes) -> None:
        """Subscription callback: note the header stamp, queue the bytes at the current bag time."""
        stamp = bags.stamp_ns(bags.deserialize(data, msgtype))
        with self._lock:
            self._stamps.setdefault(topic, []).append(stamp)
            self._pending.append((topic, msgtype, self._clock.now_ns(), bytes(data)))

    def flush(self, recorder: bags.BagRecorder) -> None:
        """Write what has arrived."""
        with self._lock:
            pending, self._pending = self._pending, []
        for topic, msgtype, t_ns, data in pending:
            recorder.write(topic, msgtype, t_ns, data)

    def count(self, topic: str) -> int:
        """Messages received on ``topic`` so far."""
        with self._lock:
            return len(self._stamps.get(topic, []))

    def stamps(self) -> dict[str, list[int]]:
        """Header stamps received, per topic."""
        with self._lock:
            return {t: list(v) for t, v in self._stamps.items()}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``replay`` flags to ``parser``."""
    parser.add_argument("bag", type=Path, help="rosbag2 folder (sqlite3 or mcap) with a sensor_msgs/Image topic")
    parser.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1.0)")
    parser.add_argument("--goal-every", type=float, default=1.0, metavar="K", help="seconds of bag time per goal (1.0)")
    parser.add_argument("--goal-offset", type=float, default=0.25, metavar="S",
                        help="bag seconds from the first image to the first goal (0.25)")
    parser.add_argument("--out", type=Path, default=Path("out/replay"), help="output folder (default out/replay)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing <out>/bag")
    parser.add_argument("--storage", choices=sorted(bags.STORAGES), default="mcap", help="output bag storage (mcap)")
    parser.add_argument("--candidates", type=int, default=0, metavar="N", help="candidates per goal (0 = node default)")
    parser.add_argument("--reducer", default="", help="reducer per goal ('' = node default)")
    parser.add_argument("--return-candidates", action="store_true",
                        help="ask for the candidates; record <ns>/candidates and plot them")
    parser.add_argument("--seed", type=int, default=None, help="goal i uses base seed SEED+i (default: node picks)")
    parser.add_argument("--instruction", default="", help="goal instruction ('' = the node's latest ~/instruction)")
    parser.add_argument("--node-namespace", default="/trajectory_ensemble",
                        help="the node's fully qualified name (default /trajectory_ensemble)")
    parser.add_argument("--image-topic", default=None, help="bag image topic (needed when the bag has several)")
    parser.add_argument("--state-topic", default=None, help="bag JointState topic (default: the only one, if any)")
    parser.add_argument("--instruction-topic", default=None, help="bag String topic (default: the only one, if any)")
    parser.add_argument("--wait", type=float, default=DEFAULT_WAIT_S, metavar="S",
                        help=f"seconds to wait for the node's action server to appear ({DEFAULT_WAIT_S:g}: a node "
                             "started just before replay serves only once its model is loaded, and a real "
                             "checkpoint takes minutes)")
    parser.add_argument("--goal-timeout", type=float, default=300.0, metavar="S", help="seconds per goal (300)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    reference = parser.add_argument_group(
        "recorded actions", "compare every served chunk with the actions the bag recorded (docs/replay-tests.md)")
    reference.add_argument("--reference-topic", default=None, metavar="TOPIC",
                           help="bag topic of the recorded actions: sensor_msgs/JointState, "
                                "trajectory_msgs/JointTrajectory, std_msgs/Float32MultiArray or Float64MultiArray, "
                                "or trajectory_ensemble_msgs/ActionTrajectory")
    reference.add_argument("--reference-channels", default=None, metavar="A,B,...", type=_channel_list,
                           help="per served action channel, the recorded channel to compare it with: a joint "
                                "name or an index, '-' to leave it out (default: by joint name, else by index)")
    reference.add_argument("--max-rmse", type=float, default=None, metavar="VALUE",
                           help="exit 1 when the run's RMSE over every compared row and channel exceeds VALUE")
    reference.add_argument("--max-rmse-channel", action="append", default=[], metavar="NAME=VALUE",
                           type=_channel_limit, help="exit 1 when channel NAME's RMSE exceeds VALUE (repeatable)")


def _channel_list(text: str) -> tuple[str, ...]:
    items = tuple(item.strip() for item in text.split(","))
    if not all(items):
        raise argparse.ArgumentTypeError(f"expected comma-separated channel names or indices, got {text!r}")
    return items


def _channel_limit(text: str) -> tuple[str, float]:
    try:
        return parse_channel_limit(text)
    except GateLimitError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def options_from_args(args: argparse.Namespace) -> ReplayOptions:
    """Build :class:`ReplayOptions` from parsed ``replay`` flags (shared with ``demo``)."""
    return ReplayOptions(
        bag=args.bag, rate=args.rate, goal_every_s=args.goal_every, goal_offset_s=args.goal_offset, out=args.out,
        overwrite=args.overwrite, storage=args.storage, candidates=args.candidates, reducer=args.reducer,
        return_candidates=args.return_candidates, seed=args.seed, instruction=args.instruction,
        node_namespace=args.node_namespace, image_topic=args.image_topic, state_topic=args.state_topic,
        instruction_topic=args.instruction_topic, wait_s=args.wait, goal_timeout_s=args.goal_timeout,
        plot=not args.no_plot, reference_topic=getattr(args, "reference_topic", None),
        reference_channels=getattr(args, "reference_channels", None), max_rmse=getattr(args, "max_rmse", None),
        max_rmse_channel=dict(getattr(args, "max_rmse_channel", None) or []),
    )


def finish(report: ReplayReport, opts: ReplayOptions, log: Any = print) -> int:
    """Write plots and ``summary.json``, print the totals, return the exit status."""
    reference_error, gate_failures = None, []
    if report.reference_series is not None:
        try:
            section = report.evaluate_reference(opts.reference_channels)
            if "channels" in section:
                gate_failures, passes = check_gate(section, opts.max_rmse, opts.max_rmse_channel)
                section["gate"] = {"max_rmse": opts.max_rmse, "max_rmse_channel": dict(opts.max_rmse_channel),
                                   "failures": gate_failures, "passed": passes}
        except (ReferenceError, GateLimitError) as error:
            reference_error = str(error)
            report.reference = {"topic": report.reference_series.topic, "error": reference_error}
    if opts.plot:
        for path in report.write_plots() + (report.write_reference_plots() if reference_error is None else []):
            log(f"plot: {path}")
    summary = report.write_summary()
    log(f"bag: {report.bag_path} ({opts.storage}; {', '.join(f'{t} {n}' for t, n in sorted(report.recorded.items()))})")
    log(f"summary: {summary}")
    if report.reference is not None and reference_error is None and "channels" in report.reference:
        for line in reference_lines(report.reference):
            log(line)
    problems = report.problems()
    for problem in problems:
        log(f"error: {problem}")
    if reference_error is not None:
        log(f"error: reference: {reference_error}")
        return EXIT_BAD_INPUT
    for line in (report.reference or {}).get("gate", {}).get("passed", []):
        log(line)
    for line in gate_failures:
        log(f"error: {line}")
    return EXIT_OK if not problems and not gate_failures else EXIT_GOALS_FAILED


def _figure(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"


def reference_lines(section: dict[str, Any]) -> list[str]:
    """The open-loop figures of a ``reference`` section, a few lines for the terminal."""
    channels = ", ".join(f"{name} {_figure(v)}" for name, v in section["rmse_per_channel"].items())
    lines = [f"reference {section['topic']}: {section['goals_compared']} goals, {section['rows_compared']} rows "
             f"compared ({section['rows_past_recording']} past the recording, {section['rows_before_recording']} "
             f"before it), channels by {section['matched_by']}",
             f"reference: rmse {_figure(section['rmse'])}; per channel {channels}",
             f"reference: rmse by step k=0.. {' '.join(_figure(v) for v in section['error_by_step'])}"]
    if "best_candidate_rmse" in section:
        lines.append(f"reference: best candidate rmse {_figure(section['best_candidate_rmse'])}, served rank "
                     f"{section['served_rank_mean']:.2f} on average (1 = no candidate closer than the served chunk)")
    if section.get("served_normalized"):
        lines.append("reference: note: the served chunks are in the model's normalized action space (the node has "
                     "no action stats); the recording must be in those units for these figures to mean anything")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run ``trajectory-ensemble replay``; the exit status is in docs/replay.md."""
    try:
        opts = options_from_args(args)
        report = replay(opts)
    except NodeUnreachableError as error:
        return fail(error, EXIT_UNREACHABLE)
    except (bags.BagError, ValueError) as error:
        return fail(error, EXIT_BAD_INPUT)
    return finish(report, opts)


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="trajectory-ensemble replay")
    add_arguments(_parser)
    sys.exit(run(_parser.parse_args()))
