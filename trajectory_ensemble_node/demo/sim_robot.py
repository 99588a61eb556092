"""The simulated robot on the ROS graph (``trajectory-ensemble sim``): ``/clock``, camera frames, goals to the
serving node, and ``~/trajectory`` executed at its stamps. The time model, splicing and episode rules it applies
are the pure parts in :mod:`.sim`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..replay.bags import candidates_array, stamp_ns, trajectory_array
from .clock_publisher import ClockPublisher
from .sim_model import (
    CLOCK_PERIOD_S,
    FIRST_GOAL_TRIES,
    GOAL_TIMEOUT_S,
    NS_PER_S,
    EpisodeRecord,
    GoalRecord,
    Plan,
    SimClock,
    SimSettings,
    handover_seam,
    row_period_ns,
    row_times,
    should_request,
)
from .sim_world import SimWorld, ToyWorld


class SimRobot:
    """The simulated robot on the ROS graph: ``/clock``, camera frames, goals, and ``~/trajectory`` executed.

    Everything runs on the calling thread (callbacks included, from :meth:`pump`), so no lock is needed.

    Args:
        session (`ClientSession`): rclpy context, node and executor (:mod:`.ros_client`).
        settings (`SimSettings`): How to drive the node.
        node (`str`): The serving node's fully qualified name.
        image_topic (`str`, *optional*): Camera topic (default ``<node>/observation/image``).
        log (`Callable[[str], None]`): Progress lines.
        world (`SimWorld`, *optional*): What the robot acts in (default :class:`.sim_world.ToyWorld`); an episode
            is whatever its ``reset`` takes (a toy scene, a PushT reset seed).
    """

    def __init__(self, session: Any, settings: SimSettings, node: str = "/trajectory_ensemble",
                 image_topic: str | None = None, log: Callable[[str], None] = print,
                 world: SimWorld | None = None) -> None:
        from rclpy.action import ActionClient
        from rclpy.qos import QoSProfile
        from sensor_msgs.msg import Image, JointState
        from trajectory_ensemble_msgs.action import GenerateTrajectory
        from trajectory_ensemble_msgs.msg import ActionTrajectory

        from ..ros.conversions import ns_to_time
        from ..ros.guards import ACTION_SERVICE_QOS

        self.session, self.settings, self.node_name, self.log = session, settings, node, log
        self.world: SimWorld = world if world is not None else ToyWorld()
        self.image_topic = image_topic or f"{node}/observation/image"
        self.state_topic = f"{node}/observation/state"
        self.clock = SimClock(settings.real_time_factor)
        self.clock.pause()
        self._Image, self._JointState, self._Goal = Image, JointState, GenerateTrajectory.Goal
        self._ns_to_time = ns_to_time
        n = session.node
        self.clock_out = ClockPublisher(n, self.clock)
        self.image_pub = n.create_publisher(Image, self.image_topic, QoSProfile(depth=10))
        self.state_pub = n.create_publisher(JointState, self.state_topic, QoSProfile(depth=10))
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
        self._due_ns: dict[int, int] = {}  # seed -> when its chunk takes over (fixed_delay)
        self._goals: dict[int, GoalRecord] = {}  # seed -> goal of the running episode
        self._arrivals: list[tuple[int, Any, GoalRecord]] = []
        self._seen: set[tuple[int, int]] = set()
        self._in_flight: GoalRecord | None = None
        self._taking_frame: GoalRecord | None = None  # time stands still until the node has taken its frame
        self._handle: Any = None
        self._positions_at: dict[int, np.ndarray] = {}

    # --- plumbing ------------------------------------------------------------------------------------------------

    def pump(self, seconds: float) -> None:
        """Serve callbacks for ``seconds`` of wall time, publishing ``/clock`` every :data:`CLOCK_PERIOD_S`."""
        deadline = time.monotonic() + max(seconds, 0.0)
        while True:
            wall = time.monotonic()
            if wall - self._last_clock_wall >= CLOCK_PERIOD_S:
                self.clock_out.publish()
                self._last_clock_wall = wall
            self.session.executor.spin_once(timeout_sec=max(0.0, min(0.005, deadline - wall)))
            if time.monotonic() >= deadline:
                return

    def wait_for_node(self, timeout_s: float) -> None:
        """Wait for the action server and the node's camera subscription (publishing ``/clock`` meanwhile).

        Raises:
            NodeUnreachableError: Either is missing after ``timeout_s``; the message names what.
        """
        from ..cli.ros_client import NodeUnreachableError
        from ..cli.ros_client import domain_text, wait_with_progress

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

    def _publish_frame(self, position: np.ndarray, t_ns: int, repeats: int = 1) -> None:
        rgb = self.world.render(position)
        msg = self._Image(height=rgb.shape[0], width=rgb.shape[1], encoding="rgb8", step=rgb.shape[1] * 3)
        msg.header.stamp = self._ns_to_time(t_ns)
        msg.header.frame_id = self.world.frame_id
        msg.data = np.ascontiguousarray(rgb).tobytes()
        if self.settings.hold_for_goals:
            # At a high real-time factor a late loop lets sim time run ahead of the last /clock; the node drops a frame
            # stamped too far after its own clock, so its clock goes out first.
            self.clock_out.publish()
        joints = self.world.joint_state()
        if joints is not None:
            # Before the frame, with its stamp: the node pairs a frame with the state nearest its stamp.
            state = self._JointState(name=list(joints[0]), position=[float(v) for v in joints[1]])
            state.header.stamp = msg.header.stamp
            for _ in range(repeats):
                self.state_pub.publish(state)
        for _ in range(repeats):
            self.image_pub.publish(msg)
        self._last_frame_ns = t_ns
        self._positions_at[t_ns] = np.asarray(position, dtype=np.float64).copy()

    def _send(self, record: EpisodeRecord, index: int, seed: int, reset: bool) -> None:
        s = self.settings
        # A goal continues or starts fresh, never both (the node refuses that). Without continuity every goal
        # resets: the node's own continue_previous default must not continue for it.
        fresh = reset or not s.continue_previous
        delay = s.inference_delay or ((s.fixed_delay or 0) if s.execute is not None else 0)
        goal = self._Goal(candidate_count=s.candidates, reducer=s.reducer, use_seed=True, seed=seed,
                          continue_previous=not fresh, reset_context=fresh, inference_delay=delay, guidance=s.guidance,
                          return_candidates=s.return_candidates)
        # Served from the frame published last or a newer one: the node waits for it if the goal overtakes it.
        goal.min_observation_stamp = self._ns_to_time(self._last_frame_ns)
        now = self.clock.now_ns()
        # A clock held on this goal's step (hold_for_goals) is running time, stopped only until the goal is out.
        running = not self.clock.paused or self.clock.held
        goal_record = GoalRecord(index, seed, bool(goal.reset_context), now / NS_PER_S, time.monotonic(),
                                 clock_paused=not running)
        if s.fixed_delay is not None and running:
            # The chunk takes over at exactly now + d steps: held if it comes earlier, the world stopped if later.
            # Time also stands still until the node has taken this goal's frame (its first feedback comes after):
            # on a loaded host the next step's frame would otherwise overtake the goal, and the chunk's stamp, so
            # the episode, would follow the host's speed instead of the seed.
            self._due_ns[seed] = now + s.fixed_delay * s.dt_ns
            self.clock.pause()
            self.clock.stop_at(self._due_ns[seed])
            self._taking_frame = goal_record
        record.goals.append(goal_record)
        self._goals[seed] = goal_record
        self._in_flight, self._handle = goal_record, None
        self.action.send_goal_async(goal, feedback_callback=lambda _: self._frame_taken(goal_record)) \
            .add_done_callback(lambda f: self._on_response(record, goal_record, f))

    def _frame_taken(self, goal: GoalRecord) -> None:
        # The node has built the goal's group (feedback), or the goal ended: the world runs on toward its chunk.
        if self._taking_frame is goal:
            self._taking_frame = None
            self.clock.resume()

    def _on_response(self, record: EpisodeRecord, goal: GoalRecord, future: Any) -> None:
        handle = future.result()
        if not handle.accepted:
            goal.status = "rejected"
            self._in_flight = None
            self._frame_taken(goal)
            return
        self._handle = handle
        handle.get_result_async().add_done_callback(lambda f: self._on_result(record, goal, f))

    def _on_result(self, record: EpisodeRecord, goal: GoalRecord, future: Any) -> None:
        from action_msgs.msg import GoalStatus

        self._frame_taken(goal)
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
            if self.settings.return_candidates:
                record.candidates[goal.index] = (candidates_array(result.candidates),
                                                 trajectory_array(result.trajectory))
            self._offer(result.trajectory, now)
        if self._due_ns.pop(goal.seed, None) is not None:  # no chunk to wait for (failed, or not executed)
            self._release_clock()
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
        self._frame_taken(goal)
        due = self._due_ns.pop(goal.seed, None)
        if due is not None:
            arrival_ns = max(arrival_ns, due)
            self._release_clock()
        self._arrivals.append((arrival_ns, msg, goal))

    def _release_clock(self) -> None:
        # Only a clock held for a chunk runs on; one paused for another reason (an episode's end) stays paused.
        self.clock.stop_at(None)
        if self.clock.held:
            self.clock.resume()

    # --- an episode ----------------------------------------------------------------------------------------------

    def run_episode(self, scene: Any) -> EpisodeRecord:
        """Run one episode of the world from ``scene`` (what its ``reset`` takes); the clock is paused again when it
        returns.

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
        world = self.world
        record = EpisodeRecord(world.episode_id(scene), s.mode, s.continue_previous, start_s=origin / NS_PER_S)
        self._goals, self._arrivals, self._seen, self._positions_at = {}, [], set(), {}
        self._due_ns, self._taking_frame = {}, None
        self._min_stamp_ns = origin
        position = world.reset(scene)
        seed0 = world.first_seed(s.base_seed, scene)
        plan, steps, chunk_index = Plan(), 0, 0
        first = self._first_chunk(record, record.scene_seed, position, origin, seed0)
        self.clock.resume()
        record.positions.append(position.tolist())
        frame_ns = int(round(NS_PER_S / s.image_rate))
        next_tick, next_frame = origin + s.dt_ns, origin + frame_ns
        arrivals = [first]
        chunk_start, retry_after = origin, 0

        def splice(arrival_ns: int, msg: Any, goal: GoalRecord) -> int:
            horizon, width = int(msg.horizon), int(msg.action_dim)
            rows = np.asarray(msg.data, dtype=np.float64).reshape(horizon, width)
            dt_ns, stamp = row_period_ns(float(msg.dt), s.dt_ns), stamp_ns(msg)
            if s.execute is None and goal.index > 0:  # synchronous: the robot waited; the chunk starts next step
                times, start = next_tick + dt_ns * np.arange(horizon, dtype=np.int64), next_tick - dt_ns
            else:
                times, start = row_times(stamp, dt_ns, horizon), stamp
            deviation = plan.deviation(times, rows, hold=position)
            switch = plan.splice(times, rows, arrival_ns, hold=position)
            planned_from = self._positions_at.get(stamp, position)
            record.sides.append(world.passing_side(rows, planned_from))
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
                    position, record.outcome = world.step(previous, plan.target(next_tick, hold=position), steps,
                                                          s.step_budget)
                    record.positions.append(position.tolist())
                    next_tick += s.dt_ns
                    ended = bool(record.outcome)
                elif next_frame == due:
                    self._publish_frame(position, next_frame)
                    next_frame += frame_ns
                else:
                    chunk_start = splice(*arrivals.pop(0))
                    if s.hold_for_goals:  # time stops on the step the next goal is due, until it is sent
                        self.clock.stop_at(chunk_start + (s.horizon if s.execute is None else s.execute) * s.dt_ns)
            if ended:
                break
            if (self._in_flight is None and not arrivals and now >= retry_after
                    and should_request(now, chunk_start, s.dt_ns, s.horizon, s.execute)):
                chunk_index += 1
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

    def _first_chunk(self, record: EpisodeRecord, episode_id: int, position: np.ndarray, origin: int,
                     seed: int) -> tuple[int, Any, GoalRecord]:
        # The world waits for an episode's first chunk (paused clock): it then starts at once, with rows at their
        # stamped times, so the node's alignment of the next chunk by stamps holds from the first switch on.
        for _ in range(FIRST_GOAL_TRIES):
            self._publish_frame(position, origin, repeats=3)
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
        raise TimeoutError(f"scene {episode_id}: no first chunk from {self.node_name} (last goal: {last.status}, "
                           f"error {last.error_code} {last.error_message!r})")

    def warm_up(self, scene: Any) -> None:
        """One goal on running sim time before the first episode, its answer discarded.

        Why: an episode's first goal runs on a paused clock, so the node measures 0 s for it; without one real
        sample first, the node's latency estimate (its frozen count when ``inference_delay`` is 0) would start at 0.
        """
        self.clock.pause()
        t_ns = self.clock.now_ns()
        record = EpisodeRecord(self.world.episode_id(scene), self.settings.mode, self.settings.continue_previous)
        self._goals, self._min_stamp_ns = {}, t_ns
        self._publish_frame(self.world.reset(scene), t_ns, repeats=3)
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


