"""What a configured node holds: the model and everything built on it, from ``configure`` to ``cleanup``.

:class:`ModelHost` is created at ``configure`` (the one model factory, the engine started, :meth:`warm_up` through the
goals' own request path) and dropped at ``cleanup``, so every reference to the model lives here and goes with it. Per
goal: :meth:`build` (every refusal that needs the observation, before admission), :meth:`submit`, :meth:`remember`.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String

from ..catalog import model_notice
from ..contract import CandidateTrajectorySpec, EnsembleResult
from ..engine import GroupHandle, GroupRequest
from ..engine.validity import to_model_space
from ..errors import (
    ErrorCode,
    ImageTooLargeError,
    InstructionTooLongError,
    ReducedTrajectoryInvalidError,
    TooFewValidCandidatesError,
    TrajectoryEnsembleError,
)
from ..models.cosmos3 import RolloutSpec, resolve_device
from ..remote import RemoteModel
from ..serving import model_factory
from ..serving import params as node_params
from ..serving.continuity import ChunkMemory
from ..serving.input_limits import InputLimits, check_image_fields, check_instruction
from ..serving.observation_buffer import ObservationBuffer
from ..serving.observations import Observation, state_positions
from ..serving.request_path import ServedModel, build_request, deadline_left, decide, remember, submit
from ..serving.startup_checks import bundled_settings_mismatch
from ..serving.planning import GoalPlan
from .clock import SimulatedTime
from .conversions import stamp_seconds
from .goals import GoalRecord, plan_action_goal
from .publishing import OutputTopics
from .uncertainty_window import UncertaintyWindow

WARMUP_SEED = 0
WARMUP_TIMEOUT_S = 3600.0
"""A warm-up group of a real checkpoint on a slow device may take minutes; this only bounds a hung engine."""


class ModelHost:
    """The model of a configured node, its engine, its inputs and outputs, and how goals become groups.

    Args:
        node (`rclpy.node.Node`): The node (publishers, subscriptions, clock, logger).
        params (`NodeParams`): The validated parameters.
        callback_group (`CallbackGroup`): For the subscriptions.
        simulated_time (`SimulatedTime`, *optional*): The node's clock feed under ``use_sim_time``.
        log (`Callable[[str], None]`): Startup lines (each names the weights).
        on_phase (`Callable[[str], None]`): Told ``"loading"`` and ``"warming up"`` as configure goes on.

    Raises:
        ParameterError: a model-dependent setting is invalid (the reducer for this model).
        ModelLoadError: the model cannot be loaded.
        StatsFileError, LimitsFileError, NoveltyScorerError: a configured file is unusable.
        TrajectoryEnsembleError: a warm-up group failed (the engine is stopped again).
    """

    def __init__(self, node: Any, params: node_params.NodeParams, callback_group: Any, *,
                 simulated_time: SimulatedTime | None = None, log: Callable[[str], None],
                 on_phase: Callable[[str], None] = lambda _: None) -> None:
        p = self.params = params
        self._node, self._cb, self._log = node, callback_group, log
        on_phase("loading")
        self.notice = model_notice(p.model)

        def warn_settings() -> None:
            mismatch = bundled_settings_mismatch(p)
            if mismatch:
                node.get_logger().warning(f"[{self.notice}] {mismatch}")

        # engine: openpi serves the groups on a remote OpenPI server; everything about the robot stays here.
        self.model: ServedModel = (RemoteModel(p) if p.engine == "openpi"
                                   else model_factory.build_model(p, on_loaded=warn_settings))
        self.device = str(resolve_device(p.device))
        # The alarm over the last uncertainty_window goals of one episode (a chain of continued chunks).
        self.uncertainty_window = UncertaintyWindow(p.uncertainty_window, self.model.alarm)
        limits = self.model.validity.limits
        self.start_jump = limits is not None and any(c.max_start_jump is not None for c in limits.channels)
        self.faults = model_factory.fault_hook(self.model)
        self.limits = InputLimits(p.max_instruction_chars, p.max_instruction_tokens, p.max_image_bytes,
                                  p.max_image_pixels, self.model.min_image_side)
        self.count_tokens = self.model.count_tokens
        check_instruction(p.instruction, self.limits, self.count_tokens, source="the instruction parameter")
        self._lock = threading.Lock()
        self._instruction = p.instruction

        self.image_topics = [node.resolve_topic_name(t) for t in (p.image_topics or ("~/observation/image",))]
        self.state_topic = node.resolve_topic_name("~/observation/state")
        # Under use_sim_time staleness is judged on the simulated clock, so a slowed-down simulation (or a paused
        # one) is not refused as stale; otherwise on the host's monotonic clock, which never jumps.
        self.sim_time = bool(node.get_parameter("use_sim_time").value)
        # Started before its capabilities are read: a remote model learns from its server's handshake whether it
        # takes state, and by which names.
        self.model.start()
        try:
            # A model that takes state reads, by name, the joint state of the image's moment (stamped nearest it).
            capabilities = self.model.capabilities
            self.state_names = tuple(capabilities.state_names) if capabilities.uses_state else ()
            # Header stamps are on the ROS clock either way: a frame stamped after "now" is never fresh. A frame the
            # model cannot encode is refused on arrival, so it never becomes the frame every later goal fails on.
            self.observations = ObservationBuffer(
                self.image_topics, self.state_topic, stamp_clock=self.now_s,
                min_image_side=self.limits.min_image_side, state_names=self.state_names,
                max_state_skew_s=p.max_state_skew_s, **({"clock": self.now_s} if self.sim_time else {}))
            # A start-jump limit without a current state would pass anything: such goals need a recent state.
            self.requires_state = bool(p.require_state or capabilities.uses_state or self.start_jump)
            self.memory = ChunkMemory()
            # A simulator reset or a seek drops what the old time line made meaningless (the node owns the clock).
            self.simulated_time = simulated_time
            if simulated_time is not None:
                simulated_time.bind(self.observations, self.memory)
            self.outputs = OutputTopics(node, p)
        except BaseException:
            self.model.stop()
            raise
        self._subscriptions: list[Any] = []
        try:
            on_phase("warming up")
            for line in self.warm_up():
                log(line)
        except BaseException:
            self.release()
            raise
        if self.faults is not None and p.fault_injection:
            self.faults.arm(p.fault_injection)  # after the warm-up, which must not consume it

    # --- configure: warm-up -----------------------------------------------------------------------------------------

    def warm_up(self) -> list[str]:
        """One group per ``warmup_counts`` entry (0 = ``candidate_count``) on a grey frame, then forget them.

        The groups take the goals' own path (``serving.request_path.build_request``, the background engine) with the
        configured steps, so the first goal finds allocations made, kernels chosen and, with ``step_capture``,
        its steps captured. The first group's costs are dropped (it alone pays one-time costs); those of the group of
        ``candidate_count`` candidates, run last, stand in for the deadline planner until the first goal measures its
        own. A single entry runs twice, so what is kept never comes from a cold group.

        Returns:
            `list[str]`: Log lines, one per group and one for the costs kept.

        Raises:
            TrajectoryEnsembleError: a warm-up group failed in the engine (a group whose chunk only the validity
                checks refused ran every step: that is no failure of the warm-up).
        """
        p = self.params
        status = self.model.remote_status()
        if status is not None:
            # Its costs are the server's (warmed by its own start); the handshake in start() checked it fits.
            return [f"remote engine {p.engine_url}: {status['server']} serving {status['model']!r} (weights version "
                    f"{status['weights_version']}); no local warm-up, deadlines bound each remote request's wait"]
        if list(p.warmup_counts) == [-1]:
            return ["no warm-up (warmup_counts: [-1]): the first goal pays one-time costs, and goals with a deadline "
                    "are refused until a goal has measured a step"]
        counts = [c or p.candidate_count for c in p.warmup_counts]
        order = sorted(dict.fromkeys(counts), key=lambda c: c == p.candidate_count)
        if len(order) == 1:
            order = order * 2
        side = int(p.resolution_tier)
        image = np.full((side, side, 3), 127, np.uint8)
        # A model that takes state gets a placeholder state, as it gets a grey frame.
        state = (0.0,) * len(self.state_names) or None
        lines = []
        for i, count in enumerate(order):
            started = time.monotonic()
            spec = CandidateTrajectorySpec(count=count, reducer=p.reducer if count > 1 else "none",
                                           max_count=p.max_candidates)
            request = build_request(self.model, p, prompt=p.instruction, spec=spec, base_seed=WARMUP_SEED, image=image,
                                    request_id=f"warm-up-{i}-n{count}", context=None, state=state)
            outcome = "done"
            try:
                self.model.wait(self.model.submit_request(request), timeout=WARMUP_TIMEOUT_S)
            except (TooFewValidCandidatesError, ReducedTrajectoryInvalidError) as error:
                # Every step ran; only the validity checks (limits_file) refused a grey frame's chunk, which says
                # nothing about a camera's. The warm-up did its work.
                outcome = f"ran; its chunk was refused by the validity checks ({ErrorCode(error.code).name})"
            lines.append(f"warm-up group {i + 1}/{len(order)}: {count} candidate(s), {p.num_inference_steps} steps in "
                         f"{(time.monotonic() - started) * 1000:.0f} ms ({outcome})")
            if i == 0:
                self.model.measured_costs(forget=True)
        # The grey frame fills its tier; camera frames are scaled down, never up, into a bin of about the tier's area:
        # about the most a frame costs, standing in until the first goal measures its own.
        encode, step, post = self.model.measured_costs(provisional=True)
        lines.append(f"measured costs for deadlines (until the first goal measures its own): encode {encode or 0:.0f} "
                     f"ms, step {step or 0:.0f} ms, post-processing {post or 0:.0f} ms ({order[-1]} candidates)")
        return lines

    # --- activate / deactivate --------------------------------------------------------------------------------------

    def subscribe(self) -> None:
        """Start taking camera frames, joint states and instructions (``activate``)."""
        if self._subscriptions:
            return
        node, cb = self._node, self._cb
        for topic in self.image_topics:
            self._subscriptions.append(node.create_subscription(
                Image, topic, lambda msg, t=topic: self._on_image(t, msg), qos_profile_sensor_data,
                callback_group=cb))
        self._subscriptions.append(node.create_subscription(
            JointState, self.state_topic, self._on_state, qos_profile_sensor_data, callback_group=cb))
        self._subscriptions.append(node.create_subscription(String, "~/instruction", self._on_instruction, 10,
                                                            callback_group=cb))

    def unsubscribe(self) -> None:
        """Stop taking inputs (``deactivate``); frames already received stay, and age."""
        for subscription in self._subscriptions:
            self._node.destroy_subscription(subscription)
        self._subscriptions = []

    def _on_image(self, topic: str, msg: Image) -> None:
        try:
            check_image_fields(len(msg.data), msg.width, msg.height, msg.encoding, self.limits)
        except ImageTooLargeError as error:
            # Checked from the header fields, before any conversion or copy of the data.
            self.observations.count_rejection(topic, error.cause, f"{type(error).__name__}: {error}")
            self._node.get_logger().warning(f"rejected a frame on {topic}: {error}", throttle_duration_sec=5.0)
            return
        error = self.observations.offer_image(topic, msg)
        if error is not None and self.observations.first_rejection(error):
            self._node.get_logger().warning(
                f"rejected a frame on {topic} ({error.cause}): {error}; keeping the last good frame "
                f"(further '{error.cause}' rejections are only counted in /diagnostics)"
            )

    def _on_state(self, msg: JointState) -> None:
        error = self.observations.offer_state(msg)
        if error is not None:
            self._node.get_logger().warning(f"rejected a joint state: {error}; keeping the last good one",
                                            throttle_duration_sec=5.0)

    def _on_instruction(self, msg: String) -> None:
        try:
            check_instruction(msg.data, self.limits, self.count_tokens, source="~/instruction")
        except InstructionTooLongError as error:
            self._node.get_logger().warning(f"ignored: {error}; keeping the previous instruction",
                                            throttle_duration_sec=5.0)
            return
        with self._lock:
            self._instruction = msg.data or self.params.instruction

    def default_instruction(self) -> str:
        """The latest ``~/instruction``, else the ``instruction`` parameter."""
        with self._lock:
            return self._instruction

    def now_s(self) -> float:
        """Seconds of the node's ROS clock (simulated time under ``use_sim_time``)."""
        return self._node.get_clock().now().nanoseconds * 1e-9

    # --- goals -----------------------------------------------------------------------------------------------------

    def plan(self, goal: Any) -> GoalPlan:
        """Validate a goal before any model work: size limits first (O(1) on characters), then the plan.

        Raises:
            InstructionTooLongError, GoalRequestError, InvalidSpecError, ExecutionContextError: as named.
        """
        check_instruction(goal.instruction, self.limits, self.count_tokens)
        return plan_action_goal(goal, self.params, default_instruction=self.default_instruction(),
                                valid_reducers=self.model.valid_reducers())

    def build(self, record: GoalRecord) -> tuple[Observation, GroupRequest]:
        """The group request of a validated goal on the latest observation.

        Every refusal that needs the observation or the clock is decided here: a missing or stale frame, the
        continuation, a deadline the engine cannot meet. The node calls this before admission (a refused goal never
        preempts another) and, for a goal that waited in the queue, again once admitted: it then serves the frame
        of that moment.

        Raises:
            ObservationError, ExecutionContextError, DeadlineUnmeetableError: as named.
        """
        p, plan, goal_id = self.params, record.plan, record.goal_id
        assert plan is not None
        observation = self.observations.latest(p.max_observation_age_s, require_state=self.requires_state)
        epoch, now = self.memory.epoch, self.now_s()
        # Rows of the new chunk execute from its observation's stamp: what has gone since counts toward the frozen
        # ones. A stamp that cannot be on this clock (older than the staleness limit while the frame arrived in
        # time: another clock's epoch) is measured by the frame's arrival instead.
        elapsed = now - stamp_seconds(observation.stamp)
        if not 0.0 <= elapsed <= p.max_observation_age_s:
            elapsed = observation.age_s
        # A queued goal is decided again once admitted: ``earlier`` keeps why its chunk was dropped.
        decision = decide(self.memory, plan, stamp=stamp_seconds(observation.stamp),
                          weights_version=self.model.weights_version, elapsed_s=elapsed, earlier=record.continuity)
        record.continuity, record.decided_clock, record.elapsed_s, record.epoch = decision, now, elapsed, epoch
        # The goal's deadline counts from acceptance; the engine's from submission, right after this.
        deadline_s = deadline_left(plan.deadline_s, record.accepted, who=f"goal {goal_id}", since_what="acceptance")
        rollout = RolloutSpec(noise_level=p.rollout_noise_level, output_dir=p.rollout_dir) if plan.rollout else None
        request = build_request(
            self.model, p, prompt=plan.instruction, spec=plan.spec, base_seed=plan.base_seed,
            image=observation.image, request_id=goal_id, context=decision.context, deadline_s=deadline_s,
            state=observation.state_values, current_state=self._current_state(observation), rollout=rollout,
            on_progress=record.on_progress)
        # What the engine would refuse at submission (an unmeetable deadline, cold or warm) is refused here.
        self.model.check_request(request, refuse_cold=True)
        return observation, request

    def submit(self, record: GoalRecord, request: GroupRequest) -> GroupHandle:
        """Submit a built goal by the request path's one deadline rule: what is left of its deadline, counted from
        acceptance, goes to the engine (``serving.request_path.submit``, as on the wire).

        Raises:
            DeadlineUnmeetableError: it passed while the goal was built; or what the engine refuses at submission.
        """
        assert record.plan is not None
        return submit(self.model.submit_request, request, record.plan.deadline_s, record.accepted,
                      who=f"goal {record.goal_id}", since_what="acceptance")

    def _current_state(self, observation: Observation) -> tuple[float, ...] | None:
        if not self.start_jump or observation.state is None:
            return None
        return state_positions(observation.state, self.params.start_jump_joints or self.params.joint_names,
                               self.params.action_dim)

    def remember(self, record: GoalRecord, result: EnsembleResult, metrics: dict[str, Any]) -> None:
        """Keep what was served for the next continuation, and its latency for the frozen count."""
        plan, observation = record.plan, record.observation
        assert plan is not None
        # Published just now: publication - stamp = what had gone at the decision + the serving latency. A goal
        # decided before a clock jump belongs to the old time line: its chunk and latency are not kept.
        serving = None if record.decided_clock is None else self.now_s() - record.decided_clock
        taken = remember(self.memory, result, instruction=plan.instruction, stamp=stamp_seconds(observation.stamp),
                         dt=self.params.dt, normalizer=self.model.normalizer_for(self.params.domain_name),
                         latency_s=serving, epoch=record.epoch)
        if serving is not None:
            metrics["latency_ms"] = (record.elapsed_s + serving) * 1000.0
            metrics["latency_sample_taken"] = taken
        estimate = self.memory.estimator.estimate
        metrics["latency_estimate_ms"] = None if estimate is None else estimate * 1000.0

    def model_space(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (published units) in the model's normalized space, where clusters and distances are defined."""
        normalizer = self.model.normalizer_for(self.params.domain_name)
        return tensor if normalizer is None else to_model_space(tensor, normalizer)

    # --- cleanup ---------------------------------------------------------------------------------------------------

    def release(self, timeout_s: float = 10.0) -> None:
        """Stop the engine, the clock feed, subscriptions and publishers, and give the model's memory back.

        Args:
            timeout_s (`float`): Seconds the engine may take to end the step it is in.
        """
        self.unsubscribe()
        if self.simulated_time is not None:
            self.simulated_time.unbind()
            self.simulated_time = None
        try:
            self.model.stop(timeout=timeout_s)
        except TrajectoryEnsembleError as error:
            self._node.get_logger().warning(f"engine stop: {type(error).__name__}: {error}")
        self.outputs.destroy(self._node)
        device = self.device
        # Everything that holds the pipeline goes: the model (engine, adapter, pipe), the tokenizer counter, the
        # test-only hook. The node drops this object next; gc then frees the weights.
        self.model = self.faults = self.count_tokens = None  # type: ignore[assignment]
        gc.collect()
        if device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.empty_cache()

