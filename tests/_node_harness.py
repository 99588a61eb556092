"""Run the real node as a subprocess over real DDS, and talk to it from a test-side rclpy node.

``NodeProcess`` starts ``trajectory-ensemble serve --params-file <yaml>`` with the venv's Python (the ROS wheels'
bootstrapper needs it), ``TRAJECTORY_ENSEMBLE_TESTING=1`` (the fault-injection hook) and the session's
ROS_DOMAIN_ID. ``RosClient`` is a plain rclpy node in its own context with its own executor thread: publishers for
the observation topics, an action client, subscriptions that record everything the node publishes, and the
service and parameter clients. Timeouts are generous: CI has two cores, shared with the node process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from trajectory_ensemble_node.cli.ros_client import DISCOVERY_SETTLE_S, subscribe_goal_feedback

NODE = "trajectory_ensemble"
NS = f"/{NODE}"
STARTUP_TIMEOUT_S = 180.0
GOAL_TIMEOUT_S = 120.0
PUBLISH_RETRY_S = 3.0
"""A publish the node has not reported after this long is sent again (the observation topics are best effort)."""

# The small configuration the node tests share (overridden per module).
BASE_PARAMS: dict[str, Any] = {
    # The random tiny model with the settings the node tests were written for (the node's own defaults are the toy
    # policy's: pusht, chunk 8, reducer mode).
    "model": "tiny",
    "device": "cpu",
    "domain_name": "droid_lerobot",
    "instruction": "reach the target",
    "reducer": "mean",
    "chunk_size": 8,
    "num_inference_steps": 3,
    "candidate_count": 3,
    "max_candidates": 8,
    "max_batch_candidates": 8,
    "fps": 10.0,
    "max_observation_age_s": 3.0,
}


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``predicate`` every 10 ms until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"condition not met within {timeout} s"
        time.sleep(0.01)


def write_params(path: Path, overrides: Mapping[str, Any]) -> Path:
    """Write a ``--params-file`` YAML for the node: :data:`BASE_PARAMS` updated with ``overrides``."""
    params = {**BASE_PARAMS, **overrides}
    path.write_text(yaml.safe_dump({NODE: {"ros__parameters": params}}))
    return path


class NodeProcess:
    """The node under test, as a subprocess.

    Args:
        params_file (`Path`): Its parameter file.
        env (`Mapping[str, str]`): Its environment (``trajectory_ensemble_node.cli.launcher.ros_env``).
        log_path (`Path`): Where its stdout and stderr go.
    """

    def __init__(self, params_file: Path, env: Mapping[str, str], log_path: Path, step_delay_s: float = 0.0) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = {**env, "TRAJECTORY_ENSEMBLE_TESTING": "1", "TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S": str(step_delay_s)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trajectory_ensemble_node.cli", "serve", "--params-file", str(params_file)],
            env=env, stdout=self._log, stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT_S, marker: str = "] ready: ") -> None:
        """Wait for the node's ``ready`` log line (the action server exists from then on), or another ``marker``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker in self.log():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.2)
        raise TimeoutError(f"node not ready after {timeout} s:\n{self.log()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGINT, then wait; kill if it hangs. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode


def run_node_until_exit(params_file: Path, env: Mapping[str, str], timeout: float = STARTUP_TIMEOUT_S,
                        extra_env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Start the node and wait for it to exit by itself (for startup errors)."""
    return subprocess.run(
        [sys.executable, "-m", "trajectory_ensemble_node.cli", "serve", "--params-file", str(params_file)],
        env={**env, **(extra_env or {})}, capture_output=True, text=True, timeout=timeout,
    )


def image_msg(stamp_sec: float, *, seed: int = 0, height: int = 48, width: int = 64, encoding: str = "rgb8",
              step: int | None = None, data: bytes | None = None, frame_id: str = "camera") -> Any:
    """A ``sensor_msgs/Image`` of random pixels (or the given bytes), stamped ``stamp_sec`` seconds (to the ns)."""
    from sensor_msgs.msg import Image

    from trajectory_ensemble_node.serving.frames import BYTES_PER_PIXEL

    channels = BYTES_PER_PIXEL.get(encoding, 3)
    if step is None:
        step = width * channels
    if data is None:
        data = np.random.default_rng(seed).integers(0, 256, step * height, dtype=np.uint8).tobytes()
    msg = Image(height=height, width=width, encoding=encoding, step=step)
    total = int(round(stamp_sec * 1e9))
    msg.header.stamp.sec, msg.header.stamp.nanosec = total // 1_000_000_000, total % 1_000_000_000
    msg.header.frame_id = frame_id
    msg.data = data
    return msg


@dataclass
class GoalOutcome:
    """What a goal produced, as the client saw it."""

    goal_id: str
    accepted: bool
    status: int = 0
    result: Any = None
    feedback: list[Any] = field(default_factory=list)
    handle: Any = None
    result_future: Any = None


class RosClient:
    """A test-side rclpy node in its own context, spun on its own thread.

    Args:
        image_topics (`Iterable[str]`): Topics to publish images on.
        domain_id (`int`): The session's ROS_DOMAIN_ID.
        use_sim_time (`bool`): The node runs on ``/clock`` (how the node reports a frame then, see the publishes).
    """

    def __init__(self, image_topics: Iterable[str] = (f"{NS}/observation/image",), *, domain_id: int,
                 use_sim_time: bool = False) -> None:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.action import ActionClient
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.parameter_client import AsyncParameterClient
        from rclpy.qos import QoSProfile
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import String
        from trajectory_ensemble_msgs.action import GenerateTrajectory
        from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateArray
        from trajectory_ensemble_msgs.srv import UpdateWeights
        from trajectory_msgs.msg import JointTrajectory
        from visualization_msgs.msg import MarkerArray

        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node("node_test_client", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        qos = QoSProfile(depth=10)
        self.image_pubs = {t: self.node.create_publisher(Image, t, qos) for t in image_topics}
        self.state_pub = self.node.create_publisher(JointState, f"{NS}/observation/state", qos)
        self.instruction_pub = self.node.create_publisher(String, f"{NS}/instruction", qos)
        self.received: dict[str, list[Any]] = {"trajectory": [], "candidates": [], "joint_trajectory": [],
                                               "diagnostics": [], "markers": []}
        self._lock = threading.Lock()
        for name, msg_type, topic in (
            ("trajectory", ActionTrajectory, f"{NS}/trajectory"),
            ("candidates", CandidateArray, f"{NS}/candidates"),
            ("joint_trajectory", JointTrajectory, f"{NS}/joint_trajectory"),
            ("diagnostics", DiagnosticArray, "/diagnostics"),
            ("markers", MarkerArray, f"{NS}/markers"),
        ):
            self.node.create_subscription(msg_type, topic, lambda msg, n=name: self._record(n, msg), qos)
        self.Goal = GenerateTrajectory.Goal
        self.action = ActionClient(self.node, GenerateTrajectory, f"{NS}/generate_trajectory")
        # Feedback from the feedback topic, as send-goal reads it, so a "done" feedback trailing the result counts.
        self._feedback: dict[bytes, list[Any]] = {}
        subscribe_goal_feedback(self.node, GenerateTrajectory, f"{NS}/generate_trajectory", self._record_feedback)
        self.weights = self.node.create_client(UpdateWeights, f"{NS}/update_weights")
        self.UpdateWeights = UpdateWeights
        self.params = AsyncParameterClient(self.node, NS)
        self.use_sim_time = use_sim_time
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._running = True
        self._thread.start()

    def _spin(self) -> None:
        while self._running and self.context.ok():
            self.executor.spin_once(timeout_sec=0.05)

    def _record(self, name: str, msg: Any) -> None:
        with self._lock:
            self.received[name].append(msg)

    def _record_feedback(self, goal: bytes, feedback: Any) -> None:
        with self._lock:
            self._feedback.setdefault(goal, []).append(feedback)

    def _feedback_list(self, goal_uuid: bytes) -> list[Any]:
        # The list is shared with the subscription, so an outcome's feedback keeps growing as messages land.
        with self._lock:
            return self._feedback.setdefault(goal_uuid, [])

    def messages(self, name: str) -> list[Any]:
        with self._lock:
            return list(self.received[name])

    def clear(self, *names: str) -> None:
        with self._lock:
            for name in names or tuple(self.received):
                self.received[name].clear()

    def close(self) -> None:
        import rclpy

        if getattr(self, "_clock_out", None) is not None:
            self._clock_out.stop()
        self._running = False
        self._thread.join(5)
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)

    # --- waiting ---------------------------------------------------------------------------------------------------

    @staticmethod
    def wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.02)
        raise TimeoutError(f"timed out after {timeout} s waiting for {what}")

    def wait_future(self, future: Any, timeout: float, what: str) -> Any:
        self.wait(future.done, timeout, what)
        return future.result()

    def wait_for_node(self, timeout: float = 60.0) -> None:
        """Wait until the action server, the service and every image subscription are matched."""
        assert self.action.wait_for_server(timeout_sec=timeout), "action server not found"
        assert self.weights.wait_for_service(timeout_sec=timeout), "update_weights service not found"
        for topic, pub in self.image_pubs.items():
            self.wait(lambda p=pub: p.get_subscription_count() > 0, timeout, f"a subscriber on {topic}")
        self.wait(lambda: self.state_pub.get_subscription_count() > 0, timeout, "a subscriber on the state topic")
        # Our writers have matched the node's readers; the node's readers match our writers on their own discovery
        # message, a moment later, and until then they drop best-effort samples (images, state) unseen. Nothing on
        # this side tells when: the publish_* helpers below wait for the node's report and publish again, but a test
        # that publishes on its own (a frame a goal then names) relies on this one settle after discovery.
        time.sleep(DISCOVERY_SETTLE_S)

    # --- observations ---------------------------------------------------------------------------------------------
    #
    # Every publish waits until the node reports the sample in /diagnostics and publishes again what it has not
    # reported within PUBLISH_RETRY_S: the observation topics are best effort, so a sample can be lost, and a goal
    # sent afterwards must find what was published, on any machine. The node reports a good message by the age of
    # its topic's newest one (``age_s <topic>``, in arrays stamped on its clock), a refused frame by a counter
    # (``frames_rejected_<cause>``), and a good frame by ``frames_received`` too, which is what tells under
    # ``use_sim_time``, where ages and stamps are on a clock the test holds still.

    def observation_values(self) -> dict[str, str] | None:
        """The values of the newest ``<node>: observations`` status on ``/diagnostics`` (``None`` before the first)."""
        return next((values for _, values in self._observation_reports()), None)

    def _observation_reports(self) -> Iterable[tuple[Any, dict[str, str]]]:
        # Newest first: (the DiagnosticArray, its observations values).
        for array in reversed(self.messages("diagnostics")):
            for status in array.status:
                if status.name == f"{NODE}: observations":
                    yield array, {kv.key: kv.value for kv in status.values}

    def _publish_until(self, publishers: Mapping[str, Callable[[], None]], reported: Callable[[str], bool],
                       timeout: float) -> int:
        """Call each of ``publishers`` (name -> publish one sample) until ``reported(name)``, publishing again what is
        still unreported every PUBLISH_RETRY_S; returns the rounds published. TimeoutError after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        rounds = 0
        while True:
            pending = [name for name in publishers if not reported(name)]
            if not pending:
                return rounds
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the node did not report {pending} within {timeout} s ({rounds} rounds)")
            for name in pending:
                publishers[name]()
            rounds += 1
            retry_at = min(time.monotonic() + PUBLISH_RETRY_S, deadline)
            while time.monotonic() < retry_at and not all(reported(name) for name in pending):
                time.sleep(0.02)

    def _publish_arrived(self, publishers: Mapping[str, Callable[[], None]], timeout: float) -> None:
        """Publish on each topic of ``publishers`` until the node's newest report dates a message on it after this
        call began: that report's stamp minus the topic's age (``age_s <topic>``) is when its newest message arrived.
        On the host's clock (the node's ROS clock off ``use_sim_time``; its ages are on the monotonic clock)."""
        assert not self.use_sim_time, "under use_sim_time the node's ages and stamps are on the test's clock"
        began = time.time()

        def arrived(topic: str) -> bool:
            for array, values in self._observation_reports():
                age = values.get(f"age_s {topic}", "never")
                return age not in ("never", "") and _stamp_ns(array.header.stamp) * 1e-9 - float(age) > began
            return False

        self._publish_until(publishers, arrived, timeout)

    def _publish_counted(self, publishers: Mapping[str, Callable[[], None]], timeout: float) -> None:
        """Publish each of ``publishers`` (observations counter -> publish one sample that raises it) until the node's
        reports show every counter above its value in the last report before."""
        values = self.wait(self.observation_values, 30.0, "the node's first /diagnostics")
        before = {counter: int(values.get(counter, "0")) for counter in publishers}

        def counted(counter: str) -> bool:
            return int((self.observation_values() or {}).get(counter, "0")) > before[counter]

        if self._publish_until(publishers, counted, timeout) > 1:
            # An earlier sample was slow, not lost, and may be counted after the report that ended this wait: the
            # next report includes it, so the next publish's baseline does too.
            seen = len(self.messages("diagnostics"))
            self.wait(lambda: len(self.messages("diagnostics")) > seen, 30.0, "the next /diagnostics")

    def publish_image(self, stamp_sec: float, topics: Iterable[str] | None = None, *,
                      counted: str = "frames_received", timeout: float = 60.0, **kwargs: Any) -> None:
        """Publish one frame on each topic until the node reports it.

        Args:
            stamp_sec (`float`): The frame's stamp (seconds).
            topics (`Iterable[str]`, *optional*): Image topics (default: all of the client's).
            counted (`str`): For a frame the node refuses, the observations counter it raises
                (``frames_rejected_<cause>``); the default is a good frame, reported by its topic's age (by
                ``frames_received`` under ``use_sim_time``, one topic after the other).
            timeout (`float`): Fail (TimeoutError) when the node has not reported it after this long.
            **kwargs: Passed to :func:`image_msg` (seed, size, encoding...).
        """
        self._publish_frame(image_msg(stamp_sec, **kwargs), list(topics or self.image_pubs), counted, timeout)

    def publish_rgb(self, rgb: np.ndarray, stamp_sec: float, timeout: float = 60.0) -> None:
        """Publish an RGB ``uint8`` array ``[H, W, 3]`` (e.g. a rendered toy scene) on every image topic, until the
        node reports it."""
        from sensor_msgs.msg import Image

        rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
        msg = Image(height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8", step=rgb.shape[1] * 3)
        total = int(round(stamp_sec * 1e9))
        msg.header.stamp.sec, msg.header.stamp.nanosec = total // 1_000_000_000, total % 1_000_000_000
        msg.header.frame_id = "camera"
        msg.data = rgb.tobytes()
        self._publish_frame(msg, list(self.image_pubs), "frames_received", timeout)

    def _publish_frame(self, msg: Any, topics: list[str], counted: str, timeout: float) -> None:
        if counted == "frames_received" and not self.use_sim_time:
            self._publish_arrived({t: lambda t=t: self.image_pubs[t].publish(msg) for t in topics}, timeout)
            return
        for topic in topics:  # one counter for every topic: one topic at a time
            self._publish_counted({counted: lambda t=topic: self.image_pubs[t].publish(msg)}, timeout)

    def publish_frames(self, topic: str, frames: Mapping[str, Any], timeout: float = 60.0) -> None:
        """Publish frames the node refuses, each until it counts it: ``frames`` maps the observations counter each
        raises (``frames_rejected_<cause>``, distinct) to its ``sensor_msgs/Image``."""
        self._publish_counted({c: lambda m=msg: self.image_pubs[topic].publish(m) for c, msg in frames.items()},
                              timeout)

    def clock_out(self) -> Any:
        """The client's ``/clock`` publisher (``tools.clock_publisher.ClockPublisher``, for a node running with
        ``use_sim_time``), created on first use once the node's clock subscription matched; its ``SimClock`` starts
        paused at 0 s (``start(rate_hz)`` publishes it at a fixed rate, as a simulator does)."""
        if getattr(self, "_clock_out", None) is None:
            from trajectory_ensemble_node.demo.clock_publisher import ClockPublisher
            from trajectory_ensemble_node.demo.sim_model import SimClock

            clock = SimClock(1.0, start_ns=0)
            clock.pause()
            self._clock_out = ClockPublisher(self.node, clock)
            self.wait(lambda: self._clock_out.subscribers() > 0, 60.0, "the node's /clock subscription")
            time.sleep(DISCOVERY_SETTLE_S)
        return self._clock_out

    def publish_clock(self, seconds: float, timeout: float = 60.0) -> None:
        """Publish ``/clock`` at ``seconds`` until the node's clock reads it: a ``/diagnostics`` array stamped
        ``seconds`` (the node stamps them on its ROS clock, which under ``use_sim_time`` is ``/clock``)."""
        out = self.clock_out()
        ns = int(round(seconds * 1e9))
        seen = len(self.messages("diagnostics"))
        self._publish_until(
            {"/clock": lambda: out.publish(ns)},
            lambda _: any(_stamp_ns(a.header.stamp) == ns for a in self.messages("diagnostics")[seen:]), timeout)

    def publish_state(self, positions: list[float], names: list[str] | None = None, timeout: float = 60.0) -> None:
        """Publish a joint state of ``positions`` (joints ``names``, default ``j0..``) until the node reports it."""
        from sensor_msgs.msg import JointState

        self.publish_joint_state(JointState(name=names or [f"j{i}" for i in range(len(positions))],
                                            position=positions), timeout)

    def publish_joint_state(self, msg: Any, timeout: float = 60.0) -> None:
        """Publish the ``sensor_msgs/JointState`` ``msg`` until the node reports it (by the state topic's age)."""
        self._publish_arrived({f"{NS}/observation/state": lambda: self.state_pub.publish(msg)}, timeout)

    def publish_observation(self, stamp_sec: int, positions: list[float], timeout: float = 60.0) -> None:
        """A frame stamped ``stamp_sec`` on every image topic and a joint state of ``positions``, published together
        until the node reports each (off ``use_sim_time``)."""
        from sensor_msgs.msg import JointState

        frame = image_msg(stamp_sec)
        state = JointState(name=[f"j{i}" for i in range(len(positions))], position=positions)
        publishers: dict[str, Callable[[], None]] = {t: lambda t=t: self.image_pubs[t].publish(frame)
                                                     for t in self.image_pubs}
        publishers[f"{NS}/observation/state"] = lambda: self.state_pub.publish(state)
        self._publish_arrived(publishers, timeout)

    # --- goals ---------------------------------------------------------------------------------------------------------

    def send_goal(self, timeout: float = GOAL_TIMEOUT_S, **fields: Any) -> GoalOutcome:
        """Send a goal, wait until it is accepted or rejected; the result is fetched by :meth:`result`."""
        import uuid

        outcome = GoalOutcome(goal_id="", accepted=False)
        goal = self.Goal(**fields)
        future = self.action.send_goal_async(goal)
        handle = self.wait_future(future, timeout, "goal acceptance")
        outcome.handle = handle
        outcome.accepted = bool(handle.accepted)
        goal_uuid = bytes(bytearray(handle.goal_id.uuid))
        outcome.goal_id = str(uuid.UUID(bytes=goal_uuid))
        outcome.feedback = self._feedback_list(goal_uuid)
        if handle.accepted:
            # Ask for the result at once, as real clients do: the answer then arrives even if the node exits.
            outcome.result_future = handle.get_result_async()
        return outcome

    def result(self, outcome: GoalOutcome, timeout: float = GOAL_TIMEOUT_S) -> GoalOutcome:
        response = self.wait_future(outcome.result_future, timeout, f"the result of {outcome.goal_id}")
        outcome.status, outcome.result = response.status, response.result
        return outcome

    def run_goal(self, timeout: float = GOAL_TIMEOUT_S, **fields: Any) -> GoalOutcome:
        outcome = self.send_goal(timeout, **fields)
        assert outcome.accepted, "goal was rejected"
        return self.result(outcome, timeout)

    def wait_executing(self, outcome: GoalOutcome, timeout: float = GOAL_TIMEOUT_S) -> None:
        """Wait until the node reports ``outcome``'s goal executing (or past it) on the action's status topic: its
        execute callback has begun, so what the test does next comes after the node started on the goal."""
        from action_msgs.msg import GoalStatus

        self.wait(lambda: outcome.handle.status >= GoalStatus.STATUS_EXECUTING, timeout,
                  f"goal {outcome.goal_id} executing")

    def cancel(self, outcome: GoalOutcome, timeout: float = 30.0) -> Any:
        return self.wait_future(outcome.handle.cancel_goal_async(), timeout, "the cancel response")

    # --- services and parameters -----------------------------------------------------------------------------------

    def _lifecycle_clients(self) -> tuple[Any, Any]:
        if getattr(self, "_lifecycle", None) is None:
            from lifecycle_msgs.srv import ChangeState, GetState

            self._lifecycle = (self.node.create_client(ChangeState, f"{NS}/change_state"),
                               self.node.create_client(GetState, f"{NS}/get_state"))
        return self._lifecycle

    def lifecycle_state(self, timeout: float = 30.0) -> str:
        """The node's lifecycle state label, from its standard ``~/get_state`` service."""
        from lifecycle_msgs.srv import GetState

        _, get = self._lifecycle_clients()
        assert get.wait_for_service(timeout_sec=timeout), "get_state service not found"
        return self.wait_future(get.call_async(GetState.Request()), timeout, "get_state").current_state.label

    def change_state(self, label: str, timeout: float = STARTUP_TIMEOUT_S) -> bool:
        """Ask for the lifecycle transition ``label`` (``configure``, ``activate``, ...) through ``~/change_state``."""
        from lifecycle_msgs.srv import ChangeState

        change, _ = self._lifecycle_clients()
        assert change.wait_for_service(timeout_sec=30.0), "change_state service not found"
        request = ChangeState.Request()
        request.transition.label = label
        return bool(self.wait_future(change.call_async(request), timeout, f"change_state {label}").success)


    def update_weights(self, path: str, strict: bool = True, timeout: float = 60.0) -> Any:
        return self.wait_future(self.weights.call_async(self.UpdateWeights.Request(path=path, strict=strict)),
                                timeout, "the update_weights response")

    def set_parameter(self, name: str, value: Any, timeout: float = 30.0) -> Any:
        from rclpy.parameter import Parameter

        assert self.params.wait_for_services(timeout_sec=timeout)
        response = self.wait_future(self.params.set_parameters([Parameter(name, value=value)]), timeout,
                                    f"setting {name}")
        return response.results[0]

    # --- diagnostics ---------------------------------------------------------------------------------------------------

    def wait_diagnostics(self, count: int, timeout: float = 60.0) -> None:
        """Wait until ``count`` more ``/diagnostics`` arrays have arrived. The node publishes one a second from a timer
        on the host's steady clock (and one after each goal), so with no goal running, ``count`` arrays are the node's
        own report that at least ``count - 1`` seconds of host time have passed."""
        seen = len(self.messages("diagnostics"))
        self.wait(lambda: len(self.messages("diagnostics")) >= seen + count, timeout, f"{count} more /diagnostics")

    def latest_status(self, suffix: str, after: float = 0.0, timeout: float = 30.0,
                      predicate: Callable[[dict[str, str]], bool] | None = None) -> tuple[Any, dict[str, str]]:
        """The newest ``/diagnostics`` status named ``trajectory_ensemble: <suffix>`` (and its values as a dict)."""
        name = f"{NODE}: {suffix}"

        def find() -> tuple[Any, dict[str, str]] | None:
            for array in reversed(self.messages("diagnostics")):
                for status in array.status:
                    if status.name == name:
                        values = {kv.key: kv.value for kv in status.values}
                        if predicate is None or predicate(values):
                            return status, values
                        return None
            return None

        return self.wait(find, timeout, f"diagnostics status {name!r}")


def wait_until_stale(client: RosClient, max_age_s: float, timeout: float = 60.0) -> None:
    """Wait until the node's ``/diagnostics`` report its observation older than ``max_age_s`` (an age only grows,
    so a goal sent afterwards finds it stale): a condition, not a sleep."""

    def stale(values: dict[str, str]) -> bool:
        age = values.get("observation_age_s", "never")
        return age != "never" and float(age) > max_age_s

    client.latest_status("observations", timeout=timeout, predicate=stale)


def metrics_dict(result: Any) -> dict[str, str]:
    """A result's ``metrics`` KeyValues as a dict."""
    return {kv.key: kv.value for kv in result.metrics}


def stamp_sec(msg: Any) -> int:
    return int(msg.header.stamp.sec)


def published_through(client: RosClient, name: str, stamp: int, timeout: float = 30.0) -> list[Any]:
    """Every message received on ``~/<name>`` once the one stamped ``stamp`` seconds has landed.

    One publisher's messages reach a subscriber in order, so with ``stamp`` the frame of a goal sent after the one
    under test, the list holds everything the node published before: a claim that a goal published nothing is
    checked on it, without sleeping.
    """
    return client.wait(lambda: (msgs := client.messages(name)) and any(stamp_sec(m) == stamp for m in msgs) and msgs,
                       timeout, f"~/{name} stamped {stamp}")


def _stamp_ns(stamp: Any) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def env_without(env: Mapping[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def os_environ() -> dict[str, str]:
    return dict(os.environ)


def serve_node(tmp: Path, domain_id: int, overrides: Mapping[str, Any],
               image_topics: Iterable[str] = (f"{NS}/observation/image",),
               step_delay_s: float = 0.0) -> Iterable[tuple[NodeProcess, RosClient]]:
    """Generator behind the module fixtures: start the node with ``overrides``, connect a client, clean up.

    Args:
        tmp (`Path`): The module's temporary folder (parameter file and node log go there).
        domain_id (`int`): The session's ROS_DOMAIN_ID.
        overrides (`Mapping[str, Any]`): Parameters on top of :data:`BASE_PARAMS`.
        image_topics (`Iterable[str]`): Topics the client publishes images on.
        step_delay_s (`float`): Sleep before every physical forward (test-only pacing, see ``serving/faults.py``), so
            a cancel, preemption or shutdown lands mid-group however fast the machine is.
    """
    from trajectory_ensemble_node.cli.launcher import ros_env

    params_file = write_params(tmp / "params.yaml", overrides)
    node = NodeProcess(params_file, ros_env(domain_id), tmp / "node.log", step_delay_s)
    client: RosClient | None = None
    try:
        node.wait_ready()
        client = RosClient(image_topics, domain_id=domain_id, use_sim_time=bool(overrides.get("use_sim_time")))
        client.wait_for_node()
        yield node, client
    finally:
        if client is not None:
            client.close()
        node.stop()


def succeeded(outcome: GoalOutcome) -> Any:
    """The goal's result, after checking it succeeded (the error message is the assertion's)."""
    from action_msgs.msg import GoalStatus

    assert outcome.status == GoalStatus.STATUS_SUCCEEDED, (outcome.status, outcome.result.error_message)
    return outcome.result


def write_state_checkpoint(folder: Path, names: Iterable[str], low: Iterable[float], high: Iterable[float],
                           domain: str = "droid_lerobot") -> Path:
    """A tiny checkpoint that takes the robot's state (issue 58): the random tiny pipeline saved as safetensors, its
    ``action_stats.json`` declaring ``names`` with ``minmax`` statistics ``low`` .. ``high`` under ``domain``.

    Returns:
        `Path`: ``folder``, for the node's ``model`` parameter.
    """
    from trajectory_ensemble_node.models.cosmos3 import StateInput, build_pipeline, write_state_input

    build_pipeline("tiny", seed=0).save_pretrained(folder, safe_serialization=True)
    write_state_input(folder, StateInput.from_stats(tuple(names), "minmax", {"min": list(low), "max": list(high)},
                                                    domain=domain))
    return folder


class Stamps:
    """Unique observation stamps within one module (seconds)."""

    def __init__(self, start: int = 1000) -> None:
        self._next = start

    def __call__(self) -> int:
        self._next += 1
        return self._next


@dataclass(frozen=True)
class NoveltyCalibration:
    """A small novelty calibration of the toy policy (:func:`toy_novelty_calibration`), and two frames to test it on.

    Args:
        scorer_file (`Path`), calibration_file (`Path`): What ``novelty_scorer_file`` and
            ``uncertainty_calibration_file`` load; the JSON recommends the ``novelty`` rule.
        threshold (`float`): The novelty threshold.
        normal (`tuple[np.ndarray, float]`), shifted (`tuple[np.ndarray, float]`): An in-distribution frame well below
            the threshold and a two-obstacle frame well above it, each with its novelty score computed here.
    """

    scorer_file: Path
    calibration_file: Path
    threshold: float
    normal: tuple[np.ndarray, float]
    shifted: tuple[np.ndarray, float]


def toy_novelty_calibration(tmp: Path, grid: int = 2) -> NoveltyCalibration:
    """Calibrate novelty as ``calibrate`` does, only smaller, in this process (node and OpenPI tests load it).

    Observation embeddings of 40 in-distribution toy scenes (``Cosmos3ActionModel.observation_embedding``, the value a
    serving group scores), a k-NN scorer fitted on 20, its split-conformal threshold (alpha 0.1) from the other 20.
    """
    import json

    import torch

    from trajectory_ensemble_node.models.cosmos3 import EMBEDDING_NAME, Cosmos3ActionModel, embedding_dim
    from trajectory_ensemble_node.novelty import EmbeddingSpec, fit_scorer
    from trajectory_ensemble_node.stats import conformal_threshold
    from trajectory_ensemble_node.toy import INSTRUCTION, load_toy_pipeline, request_kwargs, task
    from trajectory_ensemble_lab.toy.shifted import render_shifted, shifted_scenes
    from trajectory_ensemble_node.uncertainty import ALARM_RULES

    model = Cosmos3ActionModel(load_toy_pipeline())

    def embed(image: np.ndarray) -> torch.Tensor:
        return model.observation_embedding(prompt=INSTRUCTION, action=request_kwargs(image)["action"], fps=task.FPS,
                                           guidance_scale=task.GUIDANCE_SCALE, grid=grid)

    scenes = task.heldout_scenes(60, seed=5000)
    embeddings = torch.stack([embed(task.render(s)) for s in scenes[:40]])
    spec = EmbeddingSpec(EMBEDDING_NAME, grid, embedding_dim(int(model.pipe.vae.config.z_dim), grid))
    scorer = fit_scorer("knn", embeddings[:20], spec)
    threshold = conformal_threshold([float(v) for v in scorer.scores(embeddings[20:])], 0.1)
    scorer_file = tmp / "toy.novelty.safetensors"
    digest = scorer.save(scorer_file)
    rules = {rule: {"spread_threshold": 1.0, "novelty_threshold": threshold} for rule in ALARM_RULES}
    calibration_file = tmp / "toy.json"
    calibration_file.write_text(json.dumps({
        "uncertainty": {"threshold": 1.0},
        "observation": {"threshold": threshold, "scorer_sha256": digest},
        "combined": {"rule": "novelty", "rules": rules},
    }))
    # Margins on both sides of the threshold, so float32 transport cannot flip a verdict.
    normal = next((image, score) for image in (task.render(s) for s in scenes[40:])
                  if (score := scorer.score(embed(image))) < 0.8 * threshold)
    shifted = next((image, score) for image in (render_shifted(s) for s in shifted_scenes(30, seed=5000))
                   if (score := scorer.score(embed(image))) > 1.2 * threshold)
    return NoveltyCalibration(scorer_file, calibration_file, threshold, normal, shifted)
