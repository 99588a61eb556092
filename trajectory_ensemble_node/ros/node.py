"""The ``trajectory_ensemble`` rclpy node: topics, the action server, the weights service, diagnostics.

Data flow: subscriptions fill the :class:`~.observations.ObservationBuffer`; a ``GenerateTrajectory`` goal is
validated into a plan (:mod:`.goals`), built into one candidate group on the observation, admitted by the goal
policy and submitted to the engine, which runs every group on its own background thread. All of that happens in the
action server's accept callback when the goal can run at once (else in the execute callback, once admitted), so the
engine is denoising before the executor gets round to the execute callback. The goal's executor thread relays
per-step feedback, and on success publishes ``~/trajectory`` (and ``~/candidates``, ``~/joint_trajectory``)
before the goal succeeds. Every path ends the goal in a terminal state with an ``error_code``
(:class:`~trajectory_ensemble_node.errors.ErrorCode`).

All callbacks share one ``ReentrantCallbackGroup`` on a ``MultiThreadedExecutor``, so cancel requests, feedback,
subscriptions and diagnostics stay live while goals wait on the engine.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from rclpy._rclpy_pybind11 import RCLError
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.exceptions import InvalidHandle
from rclpy.node import Node
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from trajectory_ensemble_msgs.action import GenerateTrajectory
from trajectory_ensemble_msgs.srv import UpdateWeights

from ..catalog import load_model, model_notice
from ..contract import EnsembleResult, check_reducer
from ..engine import GroupRequest, ProgressEvent
from ..engine.validity import to_model_space
from ..errors import (
    DeadlineUnmeetableError,
    EngineShutdownError,
    ErrorCode,
    GroupCanceledError,
    GroupPreemptedError,
    ImageTooLargeError,
    InstructionTooLongError,
    InvalidSpecError,
    ParameterError,
    TrajectoryEnsembleError,
    error_table,
)
from ..models.cosmos3 import Cosmos3ActionModel, RolloutSpec, resolve_device
from ..safety import load_limits
from . import params as node_params
from .clock import SimulatedTime, host_clock
from .continuity import (
    CONTINUED,
    FRESH_REASONS,
    NO_PREVIOUS,
    NOT_REQUESTED,
    WEIGHTS_UPDATED,
    ChunkMemory,
    ServedChunk,
)
from .conversions import stamp_seconds
from .deferred import Deferred
from .publishing import OutputTopics
from .results import NOT_SERVED, done_feedback, failure_result, success_result
from .diagnostics import DiagnosticsInputs, build_diagnostics
from .faults import FaultInjector
from .goals import GoalPlan, GoalRecord, GoalTracker, goal_id_str, plan_goal
from .input_limits import InputLimits, check_image_size, check_instruction, token_counter
from .lifecycle import (
    ACTION_SERVICE_QOS,
    DUPLICATE_CHECK_PERIOD_S,
    measure_costs,
    report_duplicates,
    set_parameters,
    warn_raw_reducer,
)
from .startup_checks import (
    alarm_in_force,
    load_action_stats,
    load_novelty,
    load_uncertainty_threshold,
    toy_settings_mismatch,
)
from .uncertainty_window import UncertaintyWindow
from .observations import Observation, ObservationBuffer, state_positions
from .weight_updates import serve_update

NODE_NAME = "trajectory_ensemble"
DIAGNOSTICS_PERIOD_S = 1.0
AFTER_RESULT_S = 0.02
"""A goal's log line and ``/diagnostics`` update come this long after its end, so they never delay its result."""
# Codes that mean "the engine failed" (not a refusal), which the diagnostics report as a WARN until the next success.
_ENGINE_FAILURE_CODES = frozenset(value for _, value, kind, _ in error_table() if kind == "engine failure")
WEIGHT_UPDATE_TIMEOUT_S = 120.0


class TrajectoryEnsembleNode(Node):
    """The node. Construction loads the model and starts the engine thread; :meth:`shutdown` ends every goal.

    Args:
        **kwargs: Passed to ``rclpy.node.Node`` (e.g. ``parameter_overrides``, ``context``).

    Raises:
        ParameterError: a parameter is invalid (the message names each one).
        ModelLoadError: the model cannot be loaded.
        StatsFileError: ``action_stats_file`` is unusable.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self.params = node_params.declare(self)
        p = self.params
        self.notice = model_notice(p.model)
        self._startup(f"loading model {p.model!r} on {p.device} ({p.dtype})")
        pipe, self.notice = load_model(p.model, p.device, p.dtype, allow_pickle=p.allow_pickle_weights, seed=p.seed)
        self.device = str(resolve_device(p.device))
        mismatch = toy_settings_mismatch(p)
        if mismatch:
            self.get_logger().warning(f"[{self.notice}] {mismatch}")
        limits = load_limits(p.limits_file) if p.limits_file else None
        if limits is not None:
            limits.check_width(p.action_dim)  # refused at startup, not on the first goal
        self.model = Cosmos3ActionModel(
            pipe, max_batch_candidates=p.max_batch_candidates, max_candidates=p.max_candidates,
            prefix_retain=p.prefix_retain, cfg_mode=p.cfg_mode, step_capture=p.step_capture,
            action_stats=load_action_stats(p), limits=limits, min_valid_candidates=p.min_valid_candidates,
            position_policy=p.position_limit_policy, uncertainty_threshold=load_uncertainty_threshold(p),
            novelty=load_novelty(p),
        )
        # The alarm over the last uncertainty_window goals of one episode (a chain of continued chunks).
        self.uncertainty_window = UncertaintyWindow(
            p.uncertainty_window, alarm_in_force(self.model.novelty, self.model.uncertainty_threshold))
        self._start_jump = limits is not None and any(c.max_start_jump is not None for c in limits.channels)
        try:
            check_reducer(p.reducer, p.action_dim, valid_reducers=self.model.valid_reducers(), domain_name=p.domain_name)
        except InvalidSpecError as error:
            raise ParameterError(f"invalid parameters:\n  reducer: {error}") from None
        # Only a test run (TRAJECTORY_ENSEMBLE_TESTING=1) wraps the adapter; production never carries the hook.
        self.faults = (self.model.instrument(FaultInjector) if os.environ.get(node_params.TESTING_ENV) == "1"
                       else None)
        self.limits = InputLimits(p.max_instruction_chars, p.max_instruction_tokens, p.max_image_bytes,
                                  p.max_image_pixels)
        self._count_tokens = token_counter(pipe)
        check_instruction(p.instruction, self.limits, self._count_tokens, source="the instruction parameter")
        # Deadlines are planned from measured costs: measure them now, so no goal ever meets a cold engine.
        self._startup(measure_costs(self.model, p, p.instruction))
        if self.faults is not None and p.fault_injection:
            self.faults.arm(p.fault_injection)  # after the measurement, which must not consume it
        warn_raw_reducer(self, p.reducer, p.action_stats_file)
        self.add_on_set_parameters_callback(self._on_set_parameters)

        self.tracker = GoalTracker(p.goal_policy, p.max_concurrent_goals)
        self._cb = ReentrantCallbackGroup()
        self._lock = threading.Lock()
        self._instruction = p.instruction
        self._last_metrics: dict[str, Any] = {}
        self._last_error: str | None = None

        image_topics = [self.resolve_topic_name(t) for t in (p.image_topics or ("~/observation/image",))]
        state_topic = self.resolve_topic_name("~/observation/state")
        # Under use_sim_time staleness is judged on the simulated clock, so a slowed-down simulation (or a paused
        # one) is not refused as stale; otherwise on the host's monotonic clock, which never jumps.
        self.sim_time = bool(self.get_parameter("use_sim_time").value)
        # Header stamps are on the ROS clock either way: a frame stamped after "now" is never fresh.
        self.observations = (ObservationBuffer(image_topics, state_topic, clock=self.now_s, stamp_clock=self.now_s)
                             if self.sim_time else ObservationBuffer(image_topics, state_topic, stamp_clock=self.now_s))
        self.memory = ChunkMemory()
        # /clock on its own thread, never on this node's executor (a fast /clock starved it); a simulator reset or a
        # seek drops what the old time line made meaningless.
        self.simulated_time = SimulatedTime(self, self.observations, self.memory) if self.sim_time else None
        for topic in image_topics:
            self.create_subscription(Image, topic, lambda msg, t=topic: self._on_image(t, msg),
                                     qos_profile_sensor_data, callback_group=self._cb)
        self.create_subscription(JointState, state_topic, self.observations.offer_state, qos_profile_sensor_data,
                                 callback_group=self._cb)
        self.create_subscription(String, "~/instruction", self._on_instruction, 10, callback_group=self._cb)

        self.outputs = OutputTopics(self, p)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", QoSProfile(depth=10))

        self.model.start()
        # Deep goal/cancel/result queues: with rclpy's default (KEEP_LAST 10) a burst of goals is dropped unanswered.
        self.action_server = ActionServer(
            self, GenerateTrajectory, "~/generate_trajectory", execute_callback=self._execute,
            goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel, callback_group=self._cb,
            goal_service_qos_profile=ACTION_SERVICE_QOS, result_service_qos_profile=ACTION_SERVICE_QOS,
            cancel_service_qos_profile=ACTION_SERVICE_QOS,
        )
        self.create_service(UpdateWeights, "~/update_weights", self._on_update_weights, callback_group=self._cb)
        # On the host's clock: diagnostics report on the node, and must go on while a simulator is paused.
        self.create_timer(DIAGNOSTICS_PERIOD_S, self.publish_diagnostics, callback_group=self._cb, clock=host_clock())
        self._same_name_count = report_duplicates(self, 1)
        self.create_timer(DUPLICATE_CHECK_PERIOD_S,
                          lambda: setattr(self, "_same_name_count", report_duplicates(self, self._same_name_count)),
                          callback_group=self._cb, clock=host_clock())
        self.after_result = Deferred(AFTER_RESULT_S, "after-result")
        self._startup(
            f"ready: action {self.resolve_topic_name('~/generate_trajectory')}, images {image_topics}, "
            f"{p.domain_name} (width {p.action_dim}), chunk {p.chunk_size}, {p.num_inference_steps} steps, "
            f"{p.candidate_count}x {p.reducer}, goal_policy {p.goal_policy}, device {self.device}"
        )

    # --- startup helpers -------------------------------------------------------------------------------------------

    def _startup(self, message: str) -> None:
        # Every startup line names the weights, so nobody mistakes the embedded random model for a policy.
        self.get_logger().info(f"[{self.notice}] {message}")

    def _on_set_parameters(self, changes: Sequence[Any]) -> Any:
        return set_parameters(changes, sim_time=self.sim_time, faults=self.faults, logger=self.get_logger())

    # --- subscriptions ---------------------------------------------------------------------------------------------

    def _on_image(self, topic: str, msg: Image) -> None:
        try:
            check_image_size(msg, self.limits)
        except ImageTooLargeError as error:
            # Checked from the header fields, before any conversion or copy of the data.
            self.observations.count_rejection(topic, error.cause, f"{type(error).__name__}: {error}")
            self.get_logger().warning(f"rejected a frame on {topic}: {error}", throttle_duration_sec=5.0)
            return
        error = self.observations.offer_image(topic, msg)
        if error is not None and self.observations.first_rejection(error):
            self.get_logger().warning(
                f"rejected a frame on {topic} ({error.cause}): {error}; keeping the last good frame "
                f"(further '{error.cause}' rejections are only counted in /diagnostics)"
            )

    def _on_instruction(self, msg: String) -> None:
        try:
            check_instruction(msg.data, self.limits, self._count_tokens, source="~/instruction")
        except InstructionTooLongError as error:
            self.get_logger().warning(f"ignored: {error}; keeping the previous instruction",
                                      throttle_duration_sec=5.0)
            return
        with self._lock:
            self._instruction = msg.data or self.params.instruction

    def now_s(self) -> float:
        """Seconds of the node's ROS clock (simulated time under ``use_sim_time``)."""
        return self.get_clock().now().nanoseconds * 1e-9

    def default_instruction(self) -> str:
        """The latest ``~/instruction``, else the ``instruction`` parameter."""
        with self._lock:
            return self._instruction

    # --- action server ---------------------------------------------------------------------------------------------

    def _on_goal(self, goal: GenerateTrajectory.Goal) -> GoalResponse:
        reason = self.tracker.should_reject()
        if reason is None:
            return GoalResponse.ACCEPT
        self.tracker.count("rejected")
        self.get_logger().warning(f"goal rejected: {reason}")
        return GoalResponse.REJECT

    def _on_accepted(self, goal_handle: ServerGoalHandle) -> None:
        # Registered before execution starts, so a cancel that arrives at once finds the goal.
        record = self.tracker.register(goal_id_str(goal_handle.goal_id))
        # Start the group here rather than in the execute callback: the executor hands that callback to a pool
        # thread one spin later (about a millisecond on a small CPU), time the engine can already spend denoising.
        # Whatever fails is kept for the execute callback, which ends the goal with it.
        try:
            self._start(goal_handle, record, block=False)
        except Exception as error:  # noqa: BLE001 - reported by _execute, never lost
            record.start_error = error
        goal_handle.execute()

    def _on_cancel(self, goal_handle: ServerGoalHandle) -> CancelResponse:
        record = self.tracker.find(goal_id_str(goal_handle.goal_id))
        if record is None or not record.request_cancel():
            return CancelResponse.REJECT  # already finished (or committed to its result)
        self.tracker.wake()
        return CancelResponse.ACCEPT

    def _start(self, goal_handle: ServerGoalHandle, record: GoalRecord, *, block: bool) -> bool:
        """Validate the goal, build its group on the latest observation, admit it and submit it to the engine.

        Args:
            goal_handle (`ServerGoalHandle`): The accepted goal.
            record (`GoalRecord`): Its record; gets ``plan``, ``observation`` and the group handle.
            block (`bool`): Wait for the goal's frame (``min_observation_stamp``) and for a slot (``queue`` policy);
                with False, return False instead of waiting.

        Returns:
            `bool`: True when the group was submitted.
        """
        goal_id = record.goal_id
        if record.plan is None:
            # Size limits first: O(1) on characters, so a hostile instruction costs nothing further.
            check_instruction(goal_handle.request.instruction, self.limits, self._count_tokens)
            record.plan = plan_goal(goal_handle.request, self.params, default_instruction=self.default_instruction(),
                                    valid_reducers=self.model.valid_reducers())
            warn_raw_reducer(self, record.plan.spec.reducer, self.params.action_stats_file)
        wanted = record.plan.min_observation_stamp_ns
        if wanted and not self.observations.has_stamp(wanted):
            if not block:
                return False  # the execute callback waits for the frame: this callback must not hold the executor
            self.observations.wait_for_stamp(wanted, self.params.observation_wait_s, record.stop_error)
        # Everything that can refuse the goal runs before admission, so a bad goal never preempts a good one.
        observation, request = self._build(goal_id, record.plan, record)
        if not block:
            if not self.tracker.try_admit(record):
                return False
        elif self.tracker.admit(record):
            # It waited in the queue: serve the observation as it is now, not as it was when the goal came.
            observation, request = self._build(goal_id, record.plan, record)
        record.observation = observation
        record.attach(self.model.submit_request(request))
        return True

    def _execute(self, goal_handle: ServerGoalHandle) -> GenerateTrajectory.Result:
        goal_id = goal_id_str(goal_handle.goal_id)
        record = self.tracker.find(goal_id) or self.tracker.register(goal_id)
        # goal_ms counts from acceptance, so executor scheduling delays show up in node_overhead_ms.
        started = record.accepted
        try:
            if record.start_error is not None:
                raise record.start_error
            if record.handle is None:
                self._start(goal_handle, record, block=True)
            assert record.handle is not None and record.plan is not None
            self._relay_feedback(goal_handle, record, record.plan)
            stop_now = record.stop_error()
            if isinstance(stop_now, (GroupCanceledError, EngineShutdownError)) and not record.handle.done():
                raise stop_now  # woken by a cancel, preemption or shutdown; the engine drops the group later
            result = record.handle.result(timeout=0)
            stop = record.claim_success()
            if stop is not None:
                raise stop  # preempted or canceled after the last step: never publish it
            return self._succeed(goal_handle, goal_id, record, result, started)
        except GroupCanceledError as error:
            if not isinstance(error, GroupPreemptedError) and record.cancel_requested:
                return self._canceled(goal_handle, record, error)
            return self._abort(goal_handle, record, error)
        except TrajectoryEnsembleError as error:
            return self._abort(goal_handle, record, error)
        except Exception as error:  # noqa: BLE001 - whatever happens, the goal must reach a terminal state
            self.get_logger().error(f"goal {goal_id}: unexpected {type(error).__name__}: {error}")
            return self._abort(goal_handle, record, error)
        finally:
            self.tracker.release(record)
            self.after_result.call(self.publish_diagnostics, key="diagnostics")

    def _build(self, goal_id: str, plan: GoalPlan, record: GoalRecord) -> tuple[Observation, GroupRequest]:
        p = self.params
        # A start-jump limit without a current state would pass anything: such goals need a recent state.
        require_state = p.require_state or self.model.capabilities.uses_state or self._start_jump
        observation = self.observations.latest(p.max_observation_age_s, require_state=require_state)
        epoch, now = self.memory.epoch, self.now_s()
        # Rows of the new chunk execute from its observation's stamp: what has gone since counts toward the frozen
        # ones. A stamp that cannot be on this clock (older than the staleness limit while the frame arrived in
        # time: another clock's epoch) is measured by the frame's arrival instead.
        elapsed = now - stamp_seconds(observation.stamp)
        if not 0.0 <= elapsed <= p.max_observation_age_s:
            elapsed = observation.age_s
        decision = self.memory.decide(
            continue_previous=plan.continue_previous, reset=plan.reset_context, inference_delay=plan.inference_delay,
            guidance=plan.guidance, stamp=stamp_seconds(observation.stamp), instruction=plan.instruction,
            weights_version=self.model.weights_version, elapsed_s=elapsed,
        )
        earlier = record.continuity  # a queued goal is built again once admitted: keep why its chunk was dropped
        if earlier is not None and earlier.status in FRESH_REASONS and decision.status == NO_PREVIOUS:
            decision = earlier
        record.continuity, record.decided_clock, record.elapsed_s, record.epoch = decision, now, elapsed, epoch
        deadline_s = None
        if plan.deadline_s:
            # The goal's deadline counts from acceptance; the engine's from submission, a moment later.
            deadline_s = plan.deadline_s - (time.monotonic() - record.accepted)
            if deadline_s <= 0:
                raise DeadlineUnmeetableError(
                    f"goal {goal_id}: its deadline {plan.deadline_s:.3f} s passed before it could start "
                    f"({time.monotonic() - record.accepted:.3f} s after acceptance)")
        action = CosmosActionCondition(
            mode="policy", chunk_size=p.chunk_size, domain_name=p.domain_name, resolution_tier=p.resolution_tier,
            image=observation.image, view_point=p.view_point,
        )
        rollout = RolloutSpec(noise_level=p.rollout_noise_level, output_dir=p.rollout_dir) if plan.rollout else None
        request = self.model.make_request(
            prompt=plan.instruction, action=action, num_inference_steps=p.num_inference_steps,
            guidance_scale=p.guidance_scale, fps=p.fps, spec=plan.spec, base_seed=plan.base_seed,
            request_id=goal_id, rollout=rollout, on_progress=record.on_progress, deadline_s=deadline_s,
            context=record.continuity.context, current_state=self._current_state(observation),
        )
        # What the engine would refuse at submission (an unmeetable deadline, cold or warm) is refused here, before
        # admission: a refused goal never preempts a running one.
        self.model.check_request(request, refuse_cold=True)
        return observation, request

    def _current_state(self, observation: Observation) -> tuple[float, ...] | None:
        if not self._start_jump or observation.state is None:
            return None
        return state_positions(observation.state, self.params.start_jump_joints or self.params.joint_names,
                               self.params.action_dim)

    def _relay_feedback(self, goal_handle: ServerGoalHandle, record: GoalRecord, plan: GoalPlan) -> None:
        # Progress events come from the engine thread through the record's queue; publishing happens here, so the
        # engine never waits on DDS. ``None`` marks the end of the group.
        steps = self.params.num_inference_steps
        step = 0
        context = record.continuity.context if record.continuity is not None else None
        frozen, guidance = (context.frozen, context.guidance) if context is not None else (0, "")
        while True:
            try:
                event: ProgressEvent | None = record.events.get(timeout=0.5)
            except queue.Empty:
                continue
            if event is None:
                return
            if event.stage == "denoising":
                step, steps = event.step, event.total_steps
            feedback = GenerateTrajectory.Feedback(step=step, total_steps=steps, stage=event.stage,
                                                   frozen_actions=frozen, guidance=guidance)
            goal_handle.publish_feedback(feedback)

    def _succeed(self, goal_handle: ServerGoalHandle, goal_id: str, record: GoalRecord, result: EnsembleResult,
                 started: float) -> GenerateTrajectory.Result:
        plan, observation = record.plan, record.observation
        trajectory, candidates = self.outputs.publish(
            result, observation, normalized=self.model.normalizer_for(self.params.domain_name) is None,
            publish_candidates=plan.return_candidates or self.params.publish_candidates)
        goal_ms = (time.monotonic() - started) * 1000.0
        metrics = dict(result.metrics)
        metrics["goal_ms"] = goal_ms
        metrics["node_overhead_ms"] = goal_ms - float(metrics.get("total_ms") or 0.0)
        metrics["observation_age_ms"] = observation.age_s * 1000.0
        decision = record.continuity
        metrics["continuity"] = decision.status if decision is not None else ""
        self.uncertainty_window.observe(metrics, continued=metrics["continuity"] == CONTINUED)
        if decision is not None and decision.latency_s is not None:
            metrics["frozen_latency_ms"] = decision.latency_s * 1000.0
        self._remember(record, plan, observation, result, metrics)
        context = decision.context if decision is not None else None
        response = success_result(trajectory, metrics, base_seed=result.base_seed,
                                  continuity_status=metrics["continuity"],
                                  previous_stamp=context.previous_stamp if context is not None else None)
        # The last feedback carries the goal's metrics (validity counts, uncertainty, steps, seam jump).
        goal_handle.publish_feedback(done_feedback(response))
        if plan.return_candidates and candidates is not None:
            response.candidates = candidates
        if result.rollout is not None and getattr(result.rollout, "path", None) is not None:
            response.rollout_path = str(result.rollout.path)
        with self._lock:
            self._last_metrics, self._last_error = metrics, None
        goal_handle.succeed()
        self.tracker.count("succeeded")
        self.after_result.log(
            self.get_logger(), "info",
            f"goal {goal_id}: {result.size}x {result.spec.reducer} -> {trajectory.horizon}x{trajectory.action_dim} "
            f"in {goal_ms:.0f} ms (engine {float(metrics.get('total_ms') or 0.0):.0f} ms)"
        )
        return response

    def _remember(self, record: GoalRecord, plan: GoalPlan, observation: Observation, result: EnsembleResult,
                  metrics: dict[str, Any]) -> None:
        # What the robot executes next is what the next continuation continues, in the model's space.
        decision = record.continuity
        if decision is not None and decision.status not in (CONTINUED, NOT_REQUESTED):
            self.after_result.log(self.get_logger(), "info",
                                  f"goal {record.goal_id}: started fresh ({decision.status})")
        normalizer = self.model.normalizer_for(self.params.domain_name)
        action = result.action if normalizer is None else to_model_space(result.action, normalizer)
        # A goal decided before a clock jump belongs to the old time line: its chunk and latency are not kept.
        chunk = ServedChunk(action.float(), stamp_seconds(observation.stamp), self.params.dt, plan.instruction,
                            int(metrics.get("weights_version") or 0))
        self.memory.remember(chunk, epoch=record.epoch)
        if record.decided_clock is not None:
            # Published just now: publication - stamp = what had gone at the decision + the serving latency.
            serving = self.now_s() - record.decided_clock
            metrics["latency_ms"] = (record.elapsed_s + serving) * 1000.0
            metrics["latency_sample_taken"] = self.memory.observe_latency(serving, epoch=record.epoch)
        estimate = self.memory.estimator.estimate
        metrics["latency_estimate_ms"] = None if estimate is None else estimate * 1000.0

    def _failure(self, record: GoalRecord, code: int, message: str,
                 counts: dict[str, Any] | None = None) -> GenerateTrajectory.Result:
        plan = record.plan
        decision = record.continuity
        return failure_result(code, message, base_seed=plan.base_seed if plan else 0,
                              weights_version=self.model.weights_version, counts=counts,
                              continuity_status=decision.status if decision is not None else NOT_SERVED)

    def _canceled(self, goal_handle: ServerGoalHandle, record: GoalRecord,
                  error: BaseException) -> GenerateTrajectory.Result:
        # The state becomes CANCELING right after the cancel callback returns; the group can stop first.
        deadline = time.monotonic() + 2.0
        while not goal_handle.is_cancel_requested and time.monotonic() < deadline:
            time.sleep(0.005)
        if goal_handle.is_cancel_requested:
            goal_handle.canceled()
        else:
            goal_handle.abort()
        self.tracker.count("canceled")
        self.after_result.log(self.get_logger(), "info", f"goal {record.goal_id} canceled")
        return self._failure(record, ErrorCode.CANCELED, str(error))

    def _abort(self, goal_handle: ServerGoalHandle, record: GoalRecord,
               error: BaseException) -> GenerateTrajectory.Result:
        code = error.code if isinstance(error, TrajectoryEnsembleError) else ErrorCode.ENGINE_FAILURE
        message = str(error) if isinstance(error, TrajectoryEnsembleError) else f"{type(error).__name__}: {error}"
        if goal_handle.is_active:
            goal_handle.abort()
        self.tracker.count("preempted" if code == ErrorCode.PREEMPTED else "aborted")
        if code in _ENGINE_FAILURE_CODES:
            with self._lock:
                self._last_error = f"{ErrorCode(code).name}: {message}"
        self.after_result.log(self.get_logger(), "warning",
                              f"goal {record.goal_id} aborted ({ErrorCode(code).name}): {message}")
        # TOO_FEW_VALID_CANDIDATES says which checks dropped them.
        return self._failure(record, code, message, getattr(error, "counts", None))

    # --- update_weights --------------------------------------------------------------------------------------------

    def _on_update_weights(self, request: UpdateWeights.Request, response: UpdateWeights.Response
                           ) -> UpdateWeights.Response:
        response = serve_update(self.model, self.params, request, response, self.get_logger(),
                                timeout=WEIGHT_UPDATE_TIMEOUT_S)
        # A chunk from the old weights is no policy's plan any more: the next continuation starts fresh.
        if response.success and self.memory.drop(WEIGHTS_UPDATED):
            self.get_logger().info("continuity: the remembered chunk is dropped (weights updated)")
        return response

    # --- diagnostics and shutdown ----------------------------------------------------------------------------------

    def publish_diagnostics(self) -> None:
        """Publish ``/diagnostics`` now (the 1 Hz timer; and :data:`AFTER_RESULT_S` after every goal)."""
        with self._lock:
            last_metrics, last_error = dict(self._last_metrics), self._last_error
        inputs = DiagnosticsInputs(
            node_name=self.get_name(), hardware_id=self.device, model=self.params.model, notice=self.notice,
            weights_version=self.model.weights_version,
            engine_alive=self.model.is_alive,
            groups_running=self.model.num_running, groups_queued=self.model.num_queued,
            last_metrics=last_metrics, last_error=last_error, goal_counts=self.tracker.snapshot(),
            observation_ages=self.observations.ages(), max_observation_age_s=self.params.max_observation_age_s,
            frames_received=self.observations.received_count(), frames_rejected=self.observations.rejected_counts(),
            image_topics=self.observations.image_topics,
            clock_jumps=self.simulated_time.jumps if self.simulated_time is not None else None,
        )
        try:
            self.diagnostics_pub.publish(build_diagnostics(inputs, self.get_clock().now().to_msg()))
        except (InvalidHandle, RCLError) as error:
            # Expected only while the context shuts down (the publisher is gone); anything else propagates.
            if rclpy.ok(context=self.context):
                self.get_logger().warning(f"/diagnostics not published: {type(error).__name__}: {error}")

    def destroy_node(self) -> None:
        # getattr: rclpy destroys a node whose construction failed (bad parameters) too.
        if getattr(self, "simulated_time", None) is not None:
            self.simulated_time.stop()
        super().destroy_node()

    def shutdown(self) -> None:
        """Refuse new goals and end every running or waiting goal (SHUTDOWN); the engine thread stops."""
        self.tracker.close()
        # On its own thread: the engine stops only after the step it is in (an encode can take seconds), and the
        # executor must keep spinning meanwhile so the goals' SHUTDOWN results reach their clients.
        threading.Thread(target=self.model.stop, kwargs={"timeout": 2.0}, name="engine-stop",
                         daemon=True).start()

