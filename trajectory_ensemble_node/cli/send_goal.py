"""``trajectory-ensemble send-goal``: send one ``GenerateTrajectory`` goal from a shell, print its feedback and result.

What ``ros2 action send_goal`` would do, on an install without the ``ros2`` CLI. Every goal field is a flag; the exit
status is the goal's terminal state, so a script can branch on it. ``--toy-scene SEED`` first publishes one rendered
toy-task scene on the node's image topic, to try the node without a camera.
"""

from __future__ import annotations

import argparse
import math
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

from ..errors import ErrorCode
from .exits import fail, run_command
from .ros_client import (
    DEFAULT_NODE,
    DISCOVERY_SETTLE_S,
    ClientSession,
    NodeUnreachableError,
    check_node_name,
    domain_text,
    subscribe_goal_feedback,
    wait_with_progress,
)

EXIT_SUCCEEDED = 0
EXIT_ABORTED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_REJECTED = 4
EXIT_CANCELED = 5
EXIT_TIMEOUT = 6
EXIT_INTERRUPTED = 130
EXIT_CODES = f"""exit status:
  {EXIT_SUCCEEDED}    the goal succeeded
  {EXIT_ABORTED}    the goal was aborted (the printed error code says why)
  {EXIT_USAGE}    bad arguments
  {EXIT_UNREACHABLE}    no action server <node>/generate_trajectory within --wait
  {EXIT_REJECTED}    the node rejected the goal
  {EXIT_CANCELED}    the goal was canceled (Ctrl-C here, or another client)
  {EXIT_TIMEOUT}    no terminal state within --timeout (the goal was canceled)
  {EXIT_INTERRUPTED}  Ctrl-C twice: stopped waiting before the goal ended"""
GOAL_RESPONSE_TIMEOUT_S = 30.0
"""How long the node may take to accept or reject a goal once the action server is there."""
CANCEL_GRACE_S = 30.0
"""How long a canceled goal (Ctrl-C, --timeout) may take to reach its terminal state before the command gives up."""
TOY_FRAME_REPEATS = 3
"""The toy frame is published this many times (same stamp): one lost sample must not leave the node without it."""
LAST_FEEDBACK_GRACE_S = 2.0
"""How long a succeeded goal's last feedback (``done``) may trail its result before the result is printed without it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``send-goal`` flags to ``parser``."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EXIT_CODES
    goal = parser.add_argument_group("goal fields (unset = the node's defaults)")
    goal.add_argument("--count", type=int, default=0, metavar="N", help="candidate_count (0 = node default)")
    goal.add_argument("--reducer", default="", help="reducer name ('' = node default)")
    goal.add_argument("--instruction", default="", help="instruction ('' = the node's ~/instruction or default)")
    goal.add_argument("--seed", type=int, default=None, help="base seed (sets use_seed); default: the node picks one")
    goal.add_argument("--return-candidates", action="store_true", help="return every candidate in the result")
    goal.add_argument("--rollout", action="store_true", help="record an RL rollout (needs the node's rollout_dir)")
    goal.add_argument("--deadline", type=float, default=0.0, metavar="S",
                      help="publish the result within S seconds of acceptance, with fewer denoising steps (0 = none)")
    goal.add_argument("--continue-previous", action="store_true",
                      help="continue the chunk the node served last (closed loop)")
    goal.add_argument("--reset-context", action="store_true", help="start fresh even if the node continues by default")
    goal.add_argument("--inference-delay", type=int, default=0, metavar="D",
                      help="frozen actions of the previous chunk (0 = the node's latency estimate)")
    goal.add_argument("--guidance", default="", help="prefix, mask, vjp or none (default: the node's guidance_mode)")
    where = parser.add_argument_group("node and waiting")
    where.add_argument("--node", default=DEFAULT_NODE, help=f"the node's fully qualified name (default {DEFAULT_NODE})")
    where.add_argument("--wait", type=float, default=30.0, metavar="S",
                       help="seconds to wait for the node's action server to appear (30)")
    where.add_argument("--timeout", type=float, default=300.0, metavar="S",
                       help="seconds from acceptance to the terminal state; then the goal is canceled (300)")
    scene = parser.add_argument_group("trying the node without a camera")
    scene.add_argument("--toy-scene", type=int, default=None, metavar="SEED",
                       help="first publish the rendered toy-task scene SEED (256x256 rgb8, stamped now) on the image "
                            "topic")
    scene.add_argument("--image-topic", default=None,
                       help="topic for --toy-scene (default <node>/observation/image)")
    parser.add_argument("--print-data", action="store_true", help="also print the trajectory (and candidates) rows")


def _check_args(args: argparse.Namespace) -> None:
    check_node_name(args.node)
    if args.count < 0:
        raise ValueError(f"--count must be >= 0, got {args.count}")
    if args.seed is not None and not 0 <= args.seed < 2**64:
        raise ValueError(f"--seed must be in [0, 2**64), got {args.seed}")
    if args.wait < 0 or args.timeout <= 0:
        raise ValueError(f"--wait must be >= 0 and --timeout > 0, got --wait {args.wait:g} --timeout {args.timeout:g}")
    if not math.isfinite(args.deadline) or args.deadline < 0:
        raise ValueError(f"--deadline must be >= 0 seconds, got {args.deadline:g}")
    if args.toy_scene is not None and args.toy_scene < 0:
        raise ValueError(f"--toy-scene must be >= 0, got {args.toy_scene}")


def build_goal(goal_class: Any, args: argparse.Namespace, frame_stamp_ns: int = 0) -> Any:
    """The ``GenerateTrajectory.Goal`` the flags describe; ``frame_stamp_ns`` (the toy frame's) > 0 asks for a frame
    that new (``min_observation_stamp``)."""
    from ..ros.conversions import ns_to_time

    goal = goal_class(instruction=args.instruction, candidate_count=args.count, reducer=args.reducer,
                      return_candidates=args.return_candidates, rollout=args.rollout,
                      continue_previous=args.continue_previous, reset_context=args.reset_context,
                      inference_delay=args.inference_delay, guidance=args.guidance)
    goal.deadline.sec, goal.deadline.nanosec = divmod(int(round(args.deadline * 1e9)), 1_000_000_000)
    if args.seed is not None:
        goal.use_seed, goal.seed = True, int(args.seed)
    goal.min_observation_stamp = ns_to_time(frame_stamp_ns)
    return goal


def toy_scene_frame(seed: int, stamp_ns: int) -> bytes:
    """CDR bytes of a ``sensor_msgs/Image`` of the rendered toy scene ``seed`` (what the toy policy was trained on)."""
    from ..toy.task import make_scene, render
    from .messages import image_msg, serialize

    return serialize(image_msg(render(make_scene(seed)), stamp_ns, "toy_camera"))


def publish_toy_scene(session: ClientSession, topic: str, seed: int, wait_s: float,
                      log: Callable[[str], None]) -> int:
    """Publish the toy scene ``seed`` on ``topic`` once the node subscribes to it; returns the frame's stamp (ns).

    Raises:
        NodeUnreachableError: Nobody subscribes to ``topic`` within ``wait_s``.
    """
    from rclpy.qos import QoSProfile
    from sensor_msgs.msg import Image

    # Reliable matches the node's best-effort (sensor-data) subscription too.
    publisher = session.node.create_publisher(Image, topic, QoSProfile(depth=10))
    if not wait_with_progress(lambda: publisher.get_subscription_count() > 0, session.spin_for, wait_s,
                              f"a subscriber on {topic}", log):
        raise NodeUnreachableError(f"nobody subscribes to {topic} after {wait_s:g} s; is it the node's image topic "
                                   f"(parameter image_topics)? pass --image-topic")
    session.spin_for(DISCOVERY_SETTLE_S)
    stamp_ns = time.time_ns()
    data = toy_scene_frame(seed, stamp_ns)
    for _ in range(TOY_FRAME_REPEATS):
        publisher.publish(data)
    log(f"published toy scene {seed} on {topic} (256x256 rgb8, stamp {stamp_ns // 10**9}.{stamp_ns % 10**9:09d})")
    return stamp_ns


def _code_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return "UNKNOWN"


def _stamp(msg: Any) -> str:
    return f"{int(msg.header.stamp.sec)}.{int(msg.header.stamp.nanosec):09d}"


def result_lines(status: str, result: Any, print_data: bool = False) -> list[str]:
    """The printed result: status, error, seed, weights version, trajectory shape, candidates, metrics.

    Args:
        status (`str`): Terminal status name (``SUCCEEDED``, ``ABORTED``, ``CANCELED``).
        result (`GenerateTrajectory.Result`): What the node returned.
        print_data (`bool`): Also print the trajectory (and candidates) rows.
    """
    lines = [f"result: {status}",
             f"  error: {result.error_code} {_code_name(int(result.error_code))}"
             + (f": {result.error_message}" if result.error_message else ""),
             f"  base_seed: {result.base_seed}",
             f"  weights_version: {result.weights_version}"]
    trajectory = result.trajectory
    if int(trajectory.horizon) > 0:
        lines.append(
            f"  trajectory: {trajectory.horizon} x {trajectory.action_dim} (horizon x action_dim), reducer "
            f"{trajectory.reducer}, {trajectory.candidate_count} candidates, dt {trajectory.dt:g} s, "
            f"{'normalized' if trajectory.normalized else 'physical units'}, domain {trajectory.domain_name}, "
            f"stamp {_stamp(trajectory)}")
        if print_data:
            width = int(trajectory.action_dim)
            data = list(trajectory.data)
            lines += [f"    {k}: " + " ".join(f"{v:+.4f}" for v in data[k * width:(k + 1) * width])
                      for k in range(int(trajectory.horizon))]
    candidates = result.candidates
    if len(candidates.seeds):
        lines.append(f"  candidates: {len(candidates.seeds)} x {candidates.horizon} x {candidates.action_dim}, "
                     f"seeds {list(candidates.seeds)}")
        if print_data:
            size = int(candidates.horizon) * int(candidates.action_dim)
            data = list(candidates.data)
            lines += [f"    candidate {i}: " + " ".join(f"{v:+.4f}" for v in data[i * size:(i + 1) * size])
                      for i in range(len(candidates.seeds))]
    if result.rollout_path:
        lines.append(f"  rollout_path: {result.rollout_path}")
    lines += _report_lines(result)
    lines += [f"  metrics.{kv.key}: {kv.value}" for kv in result.metrics]
    return lines


def _report_lines(result: Any) -> list[str]:
    # The typed report fields a behaviour tree reads (absent from nodes built before them).
    lines = []
    validity = getattr(result, "validity", None)
    if validity is not None and (validity.valid or validity.dropped):
        reasons = ", ".join(f"{r} {n}" for r, n in zip(validity.drop_reasons, validity.drop_counts))
        lines.append(f"  validity: {validity.valid} valid, {validity.dropped} dropped"
                     + (f" ({reasons})" if reasons else "") + (f", {validity.clamped} clamped" if validity.clamped
                                                                 else ""))
    if getattr(result, "steps_planned", 0):
        lines.append(f"  steps: {result.steps_used} used of {result.steps_planned} planned "
                     f"({result.steps_fitted} fitted to the deadline)")
    uncertainty = getattr(result, "uncertainty", None)
    if uncertainty is not None and (uncertainty.modes or result.uncertain):
        lines.append(f"  uncertain: {str(bool(result.uncertain)).lower()} (score {uncertainty.score:.4g}"
                     + (f" vs threshold {uncertainty.threshold:.4g}" if uncertainty.threshold else "")
                     + f", {uncertainty.modes} mode(s), largest {uncertainty.mode_share:.0%})")
    continuity = getattr(result, "continuity", None)
    if continuity is not None and continuity.status:
        lines.append(f"  continuity: {continuity.status}" + (
            f", {continuity.frozen_actions} frozen, shift {continuity.shift}, {continuity.guidance}, seam jump "
            f"{continuity.seam_jump:.4g}" if continuity.continued else ""))
    return lines


class _Interrupts:
    """Counts Ctrl-C presses (SIGINT) while installed, instead of raising KeyboardInterrupt mid-spin."""

    def __init__(self) -> None:
        self.count = 0
        self._previous: Any = None

    def __enter__(self) -> _Interrupts:
        self._previous = signal.signal(signal.SIGINT, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.count += 1

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)


def send_goal(args: argparse.Namespace, log: Callable[[str], None] = print) -> int:
    """Send the goal ``args`` describe and follow it to its terminal state; returns the exit status.

    Raises:
        NodeUnreachableError: No action server (or, with ``--toy-scene``, no image subscriber) within ``--wait``.
    """
    from action_msgs.msg import GoalStatus
    from rclpy.action import ActionClient
    from trajectory_ensemble_msgs.action import GenerateTrajectory
    from unique_identifier_msgs.msg import UUID

    names = {v: k[len("STATUS_"):] for k, v in vars(GoalStatus).items() if k.startswith("STATUS_")}
    action_name = f"{args.node}/generate_trajectory"
    with ClientSession("trajectory_ensemble_send_goal") as session, _Interrupts() as interrupts:
        client = ActionClient(session.node, GenerateTrajectory, action_name)
        if not wait_with_progress(lambda: interrupts.count > 0 or client.server_is_ready(), session.spin_for,
                                  args.wait, f"the action server {action_name}", log) or interrupts.count:
            if interrupts.count:
                return EXIT_INTERRUPTED
            servers = session.action_servers()
            raise NodeUnreachableError(
                f"node not reachable: no action server {action_name} after {args.wait:g} s on {domain_text()}; "
                + (f"GenerateTrajectory servers seen: {', '.join(servers)}" if servers
                   else "no GenerateTrajectory server seen (is the node running and ready?)"))
        frame_stamp_ns = 0
        if args.toy_scene is not None:
            # The goal names the frame: the two travel on separate DDS readers and the goal may come first.
            frame_stamp_ns = publish_toy_scene(session, args.image_topic or f"{args.node}/observation/image",
                                               args.toy_scene, args.wait, log)
        goal_uuid = uuid.uuid4()
        feedback = _FeedbackLog(session.node, GenerateTrajectory, action_name, goal_uuid, log)
        sent = client.send_goal_async(build_goal(GenerateTrajectory.Goal, args, frame_stamp_ns),
                                      goal_uuid=UUID(uuid=list(goal_uuid.bytes)))
        if not session.wait_future(sent, GOAL_RESPONSE_TIMEOUT_S, lambda: interrupts.count > 1):
            log(f"result: no answer to the goal from {action_name} within {GOAL_RESPONSE_TIMEOUT_S:g} s")
            return EXIT_UNREACHABLE if not interrupts.count else EXIT_INTERRUPTED
        handle = sent.result()
        goal_id = uuid.UUID(bytes=bytes(bytearray(handle.goal_id.uuid)))
        if not handle.accepted:
            log(f"goal {goal_id}: rejected by {action_name} (see the node's log and /diagnostics)")
            log("result: REJECTED")
            return EXIT_REJECTED
        log(f"goal {goal_id}: accepted by {action_name}")
        feedback.release()
        result_future = handle.get_result_async()
        timed_out = False
        if not session.wait_future(result_future, args.timeout, lambda: interrupts.count > 0):
            timed_out = not interrupts.count
            why = "Ctrl-C" if interrupts.count else f"no result after --timeout {args.timeout:g} s"
            log(f"canceling goal {goal_id} ({why}); waiting for its terminal state (Ctrl-C again: stop waiting)")
            handle.cancel_goal_async()
            if not session.wait_future(result_future, CANCEL_GRACE_S, lambda: interrupts.count > 1):
                log(f"result: no terminal state {CANCEL_GRACE_S:g} s after the cancel request"
                    if interrupts.count < 2 else "result: stopped waiting (Ctrl-C twice)")
                return EXIT_INTERRUPTED if interrupts.count > 1 else EXIT_TIMEOUT
        response = result_future.result()
        status = names.get(response.status, str(response.status))
        if status == "SUCCEEDED":
            session.wait_until(lambda: feedback.done, LAST_FEEDBACK_GRACE_S)
        for line in result_lines(status, response.result, args.print_data):
            log(line)
        if timed_out:
            return EXIT_TIMEOUT
        return {"SUCCEEDED": EXIT_SUCCEEDED, "CANCELED": EXIT_CANCELED}.get(status, EXIT_ABORTED)


class _FeedbackLog:
    """Prints one goal's feedback, read from the action's feedback topic (:func:`.ros_client.subscribe_goal_feedback`,
    so the last one, ``done``, is printed even when it trails the result). Lines are held until :meth:`release`
    (after the "accepted" line).
    """

    def __init__(self, node: Any, action_type: Any, action_name: str, goal_uuid: uuid.UUID,
                 log: Callable[[str], None]) -> None:
        self._goal = goal_uuid.bytes
        self._log = log
        self._held: list[str] | None = []
        self.done = False
        subscribe_goal_feedback(node, action_type, action_name, self._on_feedback)

    def _on_feedback(self, goal: bytes, feedback: Any) -> None:
        if goal != self._goal:
            return  # another client's goal
        self.done = self.done or feedback.stage == "done"
        line = _feedback_line(feedback)
        if self._held is None:
            self._log(line)
        else:
            self._held.append(line)

    def release(self) -> None:
        """Print the held lines; print later ones as they come."""
        held, self._held = self._held or [], None
        for line in held:
            self._log(line)


def _feedback_line(feedback: Any) -> str:
    return f"feedback: {feedback.stage} {feedback.step}/{feedback.total_steps}"


def run(args: argparse.Namespace) -> int:
    """Run ``trajectory-ensemble send-goal``; the exit status is listed in ``--help``."""
    try:
        _check_args(args)
    except ValueError as error:
        return fail(error, EXIT_USAGE)
    return run_command(lambda: send_goal(args, log=lambda line: print(line, flush=True)),
                       ((NodeUnreachableError, EXIT_UNREACHABLE),))
