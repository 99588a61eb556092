"""The ``trajectory_ensemble`` managed node: lifecycle, the action server, the weights service, diagnostics.

The lifecycle, readiness and a goal's one path are in docs/node.md ("A managed node", "Goals"). All callbacks share
one ``ReentrantCallbackGroup`` on a ``MultiThreadedExecutor``, so cancel requests, feedback, lifecycle services,
subscriptions and diagnostics stay live while goals wait on the engine and configure loads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy._rclpy_pybind11 import RCLError
from rclpy.action import CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.exceptions import InvalidHandle
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import QoSProfile
from trajectory_ensemble_msgs.action import GenerateTrajectory
from trajectory_ensemble_msgs.srv import UpdateWeights

from ..catalog import model_notice
from ..contract import EnsembleResult
from ..engine import ProgressEvent
from ..errors import (
    ErrorCode,
    NotActiveError,
    TrajectoryEnsembleError,
    describe_error,
    error_table,
)
from ..metrics import GroupCounters
from ..quoting import bound_text
from ..serving.continuity import CONTINUED, NOT_REQUESTED, WEIGHTS_UPDATED
from . import params as node_params
from .action_server import NotifyingActionServer
from .clock import SimulatedTime, host_clock
from .deferred import Deferred
from .diagnostics import DiagnosticsInputs, build_diagnostics
from .goal_state import GoalState
from .goals import GoalRecord, GoalTracker, goal_id_str
from .guards import ACTION_SERVICE_QOS, DUPLICATE_CHECK_PERIOD_S, report_duplicates, set_parameters, warn_raw_reducer
from .model_host import ModelHost
from .readiness import READY, FirstObservationGate, readiness_text
from .results import NOT_SERVED, done_feedback, failure_result, success_result
from .weight_updates import serve_update

NODE_NAME = "trajectory_ensemble"
DIAGNOSTICS_PERIOD_S = 1.0
AFTER_RESULT_S = 0.02
"""A goal's log line and ``/diagnostics`` update come this long after its end, so they never delay its result."""
# Codes that mean "the engine failed" (not a refusal), which the diagnostics report as a WARN until the next success.
_ENGINE_FAILURE_CODES = frozenset(value for _, value, kind, _ in error_table() if kind == "engine failure")
WEIGHT_UPDATE_TIMEOUT_S = 120.0
CANCEL_ACK_TIMEOUT_S = 5.0
"""Bounds the wait for rclpy to mark a canceled goal CANCELING; it does so right after the cancel callback."""
CLEANUP_WAIT_S = 10.0
"""``cleanup`` waits this long for stopped goals' threads to end before it releases the model."""
READINESS_UNCONFIGURED = "not configured"


class TrajectoryEnsembleNode(LifecycleNode):
    """The node. Construction checks the parameters and, with ``autostart``, configures and activates.

    Args:
        **kwargs: Passed to ``rclpy.lifecycle.LifecycleNode`` (e.g. ``parameter_overrides``, ``context``).

    Raises:
        ParameterError: a parameter is invalid (the message names each one).
        TrajectoryEnsembleError: with ``autostart``, what made configure fail (the model, a file, the warm-up).
    """

    def __init__(self, **kwargs: Any) -> None:
        self._cb = ReentrantCallbackGroup()
        super().__init__(NODE_NAME, **kwargs)
        self.params = node_params.declare(self)
        p = self.params
        self.notice = model_notice(p.model)
        self.host: ModelHost | None = None
        self.readiness = READINESS_UNCONFIGURED
        self.configure_error: TrajectoryEnsembleError | None = None
        self._active = False
        self._lock = threading.Lock()
        self._last_metrics: dict[str, Any] = {}
        self._last_error: str | None = None
        self.sim_time = bool(self.get_parameter("use_sim_time").value)
        # /clock on its own thread, never on this node's executor (a fast /clock starved it), from the start.
        self.simulated_time = SimulatedTime(self) if self.sim_time else None
        self.add_on_set_parameters_callback(self._on_set_parameters)

        self.tracker = GoalTracker(p.goal_policy, p.max_concurrent_goals, on_stop=self._goal_stopped)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", QoSProfile(depth=10))
        # Deep goal/cancel/result queues: with rclpy's default (KEEP_LAST 10) a burst of goals is dropped unanswered.
        # Up in every state, so a client sees the server and an early goal gets NOT_ACTIVE, not silence.
        self.action_server = NotifyingActionServer(
            self, GenerateTrajectory, "~/generate_trajectory", execute_callback=self._execute,
            goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel, callback_group=self._cb,
            goal_service_qos_profile=ACTION_SERVICE_QOS, result_service_qos_profile=ACTION_SERVICE_QOS,
            cancel_service_qos_profile=ACTION_SERVICE_QOS, on_cancel_processed=self._cancels_processed,
        )
        self.create_service(UpdateWeights, "~/update_weights", self._on_update_weights, callback_group=self._cb)
        # On the host's clock: diagnostics report on the node, and must go on while a simulator is paused.
        self.create_timer(DIAGNOSTICS_PERIOD_S, self.publish_diagnostics, callback_group=self._cb, clock=host_clock())
        self._same_name_count = report_duplicates(self, 1)
        self.create_timer(DUPLICATE_CHECK_PERIOD_S,
                          lambda: setattr(self, "_same_name_count", report_duplicates(self, self._same_name_count)),
                          callback_group=self._cb, clock=host_clock())
        self.after_result = Deferred(AFTER_RESULT_S, "after-result")
        # Each waiting goal holds an executor thread (serve.py gives 4 + max_concurrent_goals + 1 or more): leave some
        # for the subscriptions that end the wait.
        self.first_observation = FirstObservationGate(p.startup_goal_wait_s, 1 + p.max_concurrent_goals,
                                                      self.get_logger().info)
        if p.autostart:
            if self.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                raise self.configure_error or TrajectoryEnsembleError("configure failed")
            self.trigger_activate()
        else:
            self._startup(f"unconfigured: waiting for a lifecycle manager (configure, then activate) on "
                          f"{self.get_fully_qualified_name()}/change_state")

    @property
    def default_callback_group(self) -> ReentrantCallbackGroup:
        # The lifecycle and parameter services too: get_state must answer while configure loads a model.
        return self._cb

    # --- lifecycle -------------------------------------------------------------------------------------------------

    def _startup(self, message: str) -> None:
        # Every startup line names the weights, so nobody mistakes the embedded random model for a policy.
        self.get_logger().info(f"[{self.notice}] {message}")

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        p = self.params
        self._startup(f"loading model {p.model!r} on {p.device} ({p.dtype})")
        try:
            host = ModelHost(self, p, self._cb, simulated_time=self.simulated_time, log=self._startup,
                              on_phase=self._set_readiness)
        except TrajectoryEnsembleError as error:
            self.configure_error, self.readiness = error, READINESS_UNCONFIGURED
            self.get_logger().error(f"configure failed: {describe_error(error)}")
            return TransitionCallbackReturn.FAILURE
        self.host, self.notice, self.configure_error = host, host.notice, None
        self.readiness = READY
        warn_raw_reducer(self, p.reducer, p.action_stats_file)
        self._startup(f"configured: {p.domain_name} (width {p.action_dim}), chunk {p.chunk_size}, "
                      f"{p.num_inference_steps} steps, {p.candidate_count}x {p.reducer}, device {host.device}")
        return TransitionCallbackReturn.SUCCESS

    def _set_readiness(self, readiness: str) -> None:
        self.readiness = readiness
        self.publish_diagnostics()

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        assert self.host is not None
        self.host.subscribe()
        self._active = True
        p = self.params
        self._startup(
            f"ready: action {self.resolve_topic_name('~/generate_trajectory')}, images {self.host.image_topics}, "
            f"{p.domain_name} (width {p.action_dim}), chunk {p.chunk_size}, {p.num_inference_steps} steps, "
            f"{p.candidate_count}x {p.reducer}, goal_policy {p.goal_policy}, device {self.host.device}"
        )
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_serving(GoalState.NOT_ACTIVE, "the node was deactivated")
        self._startup("deactivated: goals end NOT_ACTIVE until the node is activated again")
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release("the node was cleaned up")
        self._startup("cleaned up: the model is released")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_serving(GoalState.SHUTDOWN, "the node is shutting down")
        self._release("the node is shutting down")
        return TransitionCallbackReturn.SUCCESS

    def _stop_serving(self, state: GoalState, why: str) -> None:
        self._active = False
        if self.host is not None:
            self.host.unsubscribe()
        stopped = self.tracker.stop_all(state, why)
        if stopped:
            self.get_logger().info(f"{why}: {stopped} goal(s) ended")

    def _release(self, why: str) -> None:
        self._active = False
        self.tracker.stop_all(GoalState.NOT_ACTIVE, why)
        # The stopped goals' threads end at once (their groups are canceled); none touches the model after this.
        self.tracker.wait_idle(CLEANUP_WAIT_S)
        host, self.host = self.host, None
        if host is not None:
            host.release()
        self.readiness = READINESS_UNCONFIGURED

    def lifecycle_state(self) -> str:
        """The managed node's state label (``unconfigured``, ``inactive``, ``active``, ``finalized``, ...)."""
        return self._state_machine.current_state[1]

    def _on_set_parameters(self, changes: Sequence[Any]) -> Any:
        return set_parameters(changes, sim_time=self.sim_time, logger=self.get_logger(),
                              faults=self.host.faults if self.host is not None else None)

    # --- action server ---------------------------------------------------------------------------------------------

    def _on_goal(self, goal: GenerateTrajectory.Goal) -> GoalResponse:
        reason = self.tracker.should_reject()
        if reason is None:
            return GoalResponse.ACCEPT
        self.tracker.reject()
        self.get_logger().warning(f"goal rejected: {reason}")
        return GoalResponse.REJECT

    def _on_accepted(self, goal_handle: ServerGoalHandle) -> None:
        # Registered before execution starts, so a cancel that arrives at once finds the goal.
        self.tracker.register(goal_id_str(goal_handle.goal_id))
        goal_handle.execute()

    def _on_cancel(self, goal_handle: ServerGoalHandle) -> CancelResponse:
        record = self.tracker.find(goal_id_str(goal_handle.goal_id))
        if record is None or not record.request_cancel():
            return CancelResponse.REJECT  # already ended (or committed to its result)
        return CancelResponse.ACCEPT

    def _cancels_processed(self) -> None:
        for record in self.tracker.canceled_records():
            record.cancel_processed.set()

    def _goal_stopped(self, record: GoalRecord) -> None:
        # A goal stopped from outside may be waiting for its frame: wake it (the tracker wakes its own waits).
        host = self.host
        if host is not None:
            host.observations.wake_waiters()

    def _start(self, goal_handle: ServerGoalHandle, record: GoalRecord, host: ModelHost) -> None:
        """The one path from acceptance to the engine: validate, await the frame, build, admit, submit.

        Args:
            goal_handle (`ServerGoalHandle`): The accepted goal.
            record (`GoalRecord`): Its record; gets ``plan``, ``observation`` and the group handle.
            host (`ModelHost`): The configured model.

        Raises:
            TrajectoryEnsembleError: every refusal (before admission), and the stops (cancel, preemption, ...).
        """
        record.plan = host.plan(goal_handle.request)
        warn_raw_reducer(self, record.plan.spec.reducer, self.params.action_stats_file)
        # Right after activation the camera has not been heard yet: wait for its first frame (startup_goal_wait_s).
        self.first_observation.await_first(record.goal_id, host.observations, stopped=record.stop_error)
        wanted = record.plan.min_observation_stamp_ns
        if wanted and not host.observations.has_stamp(wanted):
            host.observations.wait_for_stamp(wanted, self.params.observation_wait_s, record.stop_error)
        # Everything that can refuse the goal runs before admission, so a bad goal never preempts a good one.
        observation, request = host.build(record)
        if self.tracker.admit(record):
            # It waited in the queue: decided again on the observation as it is now (it may refuse now, too).
            observation, request = host.build(record)
        record.observation = observation
        record.attach(host.submit(record, request))

    def readiness_now(self) -> str:
        """``readiness`` as ``/diagnostics`` reports it: the configure phase, then what an active node waits for."""
        host = self.host
        if self.readiness != READY or not self._active or host is None:
            return self.readiness
        return readiness_text(host.observations.silent())

    def _execute(self, goal_handle: ServerGoalHandle) -> GenerateTrajectory.Result:
        goal_id = goal_id_str(goal_handle.goal_id)
        record = self.tracker.find(goal_id) or self.tracker.register(goal_id)
        host = self.host
        try:
            if not self._active or host is None:
                raise NotActiveError(goal_id, f"the node is {self.lifecycle_state()}, not active: goals are served "
                                              "once it is configured and activated")
            self._start(goal_handle, record, host)
            assert record.handle is not None
            self._relay_feedback(goal_handle, record)
            stop = record.stop_error()
            if stop is not None and not record.handle.done():
                raise stop  # woken by a stop; the engine drops the group at its next step
            result = record.handle.result(timeout=0)
            stop = record.claim_success()
            if stop is not None:
                raise stop  # stopped after the last step: never publish it
            return self._succeed(goal_handle, record, host, result)
        except Exception as error:  # noqa: BLE001 - whatever happens, the goal must reach a terminal state
            if not isinstance(error, TrajectoryEnsembleError):
                self.get_logger().error(bound_text(f"goal {goal_id}: unexpected {type(error).__name__}: {error}"))
            # A stop that came first names the end, whatever the engine raised meanwhile.
            return self._end(goal_handle, record, record.stop_error() or error)
        finally:
            self.tracker.release(record)
            self.after_result.call(self.publish_diagnostics, key="diagnostics")

    def _relay_feedback(self, goal_handle: ServerGoalHandle, record: GoalRecord) -> None:
        # Progress events come from the engine thread through the record's queue; publishing happens here, so the
        # engine never waits on DDS. ``None`` marks the end of the group, or a stop.
        steps, step = self.params.num_inference_steps, 0
        context = record.continuity.context if record.continuity is not None else None
        frozen, guidance = (context.frozen, context.guidance) if context is not None else (0, "")
        while True:
            event: ProgressEvent | None = record.events.get()
            if event is None:
                return
            if event.stage == "denoising":
                step, steps = event.step, event.total_steps
            goal_handle.publish_feedback(GenerateTrajectory.Feedback(
                step=step, total_steps=steps, stage=event.stage, frozen_actions=frozen, guidance=guidance))

    def _succeed(self, goal_handle: ServerGoalHandle, record: GoalRecord, host: ModelHost,
                 result: EnsembleResult) -> GenerateTrajectory.Result:
        plan, observation = record.plan, record.observation
        assert plan is not None
        trajectory, candidates = host.outputs.publish(
            result, observation, normalized=host.model.normalizer_for(self.params.domain_name) is None,
            publish_candidates=plan.return_candidates or self.params.publish_candidates,
            model_space=host.model_space)
        # goal_ms counts from acceptance, so executor scheduling delays show up in node_overhead_ms.
        goal_ms = (time.monotonic() - record.accepted) * 1000.0
        metrics = dict(result.metrics)
        engine_ms = float(GroupCounters.from_metrics(result.metrics).total_ms or 0.0)
        metrics["goal_ms"] = goal_ms
        metrics["node_overhead_ms"] = goal_ms - engine_ms
        metrics["observation_age_ms"] = observation.age_s * 1000.0
        metrics.update(observation.state_metrics())  # which joint state a model that takes state was served
        decision = record.continuity
        status = metrics["continuity"] = decision.status if decision is not None else ""
        host.uncertainty_window.observe(metrics, continued=status == CONTINUED)
        if decision is not None and decision.latency_s is not None:
            metrics["frozen_latency_ms"] = decision.latency_s * 1000.0
        if decision is not None and decision.status not in (CONTINUED, NOT_REQUESTED):
            self.after_result.log(self.get_logger(), "info", f"goal {record.goal_id}: started fresh ({decision.status})")
        host.remember(record, result, metrics)
        context = decision.context if decision is not None else None
        response = success_result(trajectory, metrics, base_seed=result.base_seed,
                                  continuity_status=status,
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
        self.after_result.log(
            self.get_logger(), "info",
            f"goal {record.goal_id}: {result.size}x {result.spec.reducer} -> {trajectory.horizon}x"
            f"{trajectory.action_dim} in {goal_ms:.0f} ms (engine {engine_ms:.0f} ms)"
        )
        return response

    def _end(self, goal_handle: ServerGoalHandle, record: GoalRecord,
             error: BaseException) -> GenerateTrajectory.Result:
        """End a goal that did not succeed: its state from its code, the action's terminal status, the result."""
        code = error.code if isinstance(error, TrajectoryEnsembleError) else ErrorCode.ENGINE_FAILURE
        # Bounded whatever the error quoted: it becomes the result's error_message and a log line.
        message = bound_text(str(error) if isinstance(error, TrajectoryEnsembleError)
                             else f"{type(error).__name__}: {error}")
        state = record.finish(code)
        if state is GoalState.CANCELED:
            # rclpy marks the goal CANCELING right after the cancel callback; NotifyingActionServer says when it has.
            record.cancel_processed.wait(CANCEL_ACK_TIMEOUT_S)
            if goal_handle.is_cancel_requested:
                goal_handle.canceled()
            elif goal_handle.is_active:
                goal_handle.abort()
            self.after_result.log(self.get_logger(), "info", f"goal {record.goal_id} canceled")
        else:
            if goal_handle.is_active:
                goal_handle.abort()
            if code in _ENGINE_FAILURE_CODES:
                with self._lock:
                    self._last_error = f"{ErrorCode(code).name}: {message}"
            self.after_result.log(self.get_logger(), "warning",
                                  f"goal {record.goal_id} aborted ({ErrorCode(code).name}): {message}")
        plan, decision = record.plan, record.continuity
        host = self.host
        # TOO_FEW_VALID_CANDIDATES says which checks dropped them.
        return failure_result(code, message, base_seed=plan.base_seed if plan else 0,
                              weights_version=host.model.weights_version if host is not None else 0,
                              counts=getattr(error, "counts", None),
                              continuity_status=decision.status if decision is not None else NOT_SERVED)

    # --- update_weights --------------------------------------------------------------------------------------------

    def _on_update_weights(self, request: UpdateWeights.Request, response: UpdateWeights.Response
                           ) -> UpdateWeights.Response:
        host = self.host
        if host is None:
            response.success = False
            response.message = f"the node is {self.lifecycle_state()}: no model to update (configure it first)"
            return response
        response = serve_update(host.model, self.params, request, response, self.get_logger(),
                                timeout=WEIGHT_UPDATE_TIMEOUT_S)
        # A chunk from the old weights is no policy's plan any more: the next continuation starts fresh.
        if response.success and host.memory.drop(WEIGHTS_UPDATED):
            self.get_logger().info("continuity: the remembered chunk is dropped (weights updated)")
        return response

    # --- diagnostics and shutdown ----------------------------------------------------------------------------------

    def publish_diagnostics(self) -> None:
        """Publish ``/diagnostics`` now (the 1 Hz timer; and :data:`AFTER_RESULT_S` after every goal)."""
        with self._lock:
            last_metrics, last_error = dict(self._last_metrics), self._last_error
        if self.configure_error is not None and self.host is None:
            last_error = f"configure failed: {describe_error(self.configure_error)}"
        host, p = self.host, self.params
        model = host.model if host is not None else None
        observations = host.observations if host is not None else None
        inputs = DiagnosticsInputs(
            node_name=self.get_name(), hardware_id=host.device if host is not None else p.device,
            model=p.model, notice=self.notice,
            weights_version=model.weights_version if model is not None else 0,
            engine_alive=model.is_alive if model is not None else False,
            groups_running=model.num_running if model is not None else 0,
            groups_queued=model.num_queued if model is not None else 0,
            last_metrics=last_metrics, last_error=last_error, goal_counts=self.tracker.snapshot(),
            observation_ages=observations.ages() if observations is not None else {},
            max_observation_age_s=p.max_observation_age_s,
            frames_received=observations.received_count() if observations is not None else 0,
            frames_rejected=observations.rejected_counts() if observations is not None else {},
            image_topics=observations.image_topics if observations is not None else (),
            clock_jumps=self.simulated_time.jumps if self.simulated_time is not None else None,
            lifecycle_state=self.lifecycle_state(), readiness=self.readiness_now(),
            states_rejected=observations.states_rejected() if observations is not None else 0,
            remote=model.remote_status() if model is not None else None,
            state_topic=observations.state_topic if observations is not None else "",
            state_names=observations.state_names if observations is not None else (),
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
        self._active = False
        self.tracker.close()
        host = self.host
        if host is None:
            return
        # On its own thread: the engine stops only after the step it is in (an encode can take seconds), and the
        # executor must keep spinning meanwhile so the goals' SHUTDOWN results reach their clients.
        threading.Thread(target=host.model.stop, kwargs={"timeout": 2.0}, name="engine-stop", daemon=True).start()

