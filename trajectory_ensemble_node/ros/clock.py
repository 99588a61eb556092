"""The node's clocks under ``use_sim_time``: ``/clock`` read off the node's executor, and time jumps.

:class:`ClockFeed` reads ``/clock`` on a hidden node and thread of its own, at most :data:`CLOCK_UPDATE_HZ` updates a
second (why: docs/node.md, "Why ``/clock`` has its own thread"). :func:`watch_jumps` reports a backward jump and a
forward one past :data:`FORWARD_JUMP_S`; its callback runs inside rcl on the feed's thread, so it must only flip state
under locks and return.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import rclpy
from rclpy.clock import Clock, ClockType, JumpHandle, JumpThreshold, TimeJump
from rclpy.duration import Duration
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.time import Time
from rosgraph_msgs.msg import Clock as ClockMsg

CLOCK_TOPIC = "/clock"
CLOCK_UPDATE_HZ = 50.0
"""Most ``/clock`` updates the node's clock takes per wall second (20 ms apart); newer messages replace older ones."""
FORWARD_JUMP_S = 1.0
"""A forward step of the ROS clock larger than this, in one ``/clock`` update, is a jump (a seek), not time passing.
Simulators step far less per message (Gazebo 1 ms, the bundled sim 1 ms, a bag at 40 Hz 25 ms of its rate)."""
_SPIN_TIMEOUT_S = 0.2


def host_clock() -> Clock:
    """The host's steady clock, for timers that must run whatever ``/clock`` does (diagnostics report on the node,
    not on the simulation: a paused simulator must not silence them)."""
    return Clock(clock_type=ClockType.STEADY_TIME)


class ClockFeed:
    """Takes ``/clock`` over from rclpy's ``TimeSource`` and feeds it to ``node``'s ROS clock from its own thread.

    Construct it right after the node, under ``use_sim_time`` only; :meth:`stop` before the node is destroyed.

    Args:
        node (`rclpy.node.Node`): The serving node; its clock must already be on ROS time.
        max_rate_hz (`float`): Most clock updates per second (:data:`CLOCK_UPDATE_HZ`).
    """

    def __init__(self, node: Any, max_rate_hz: float = CLOCK_UPDATE_HZ) -> None:
        if not max_rate_hz > 0:
            raise ValueError(f"max_rate_hz must be > 0, got {max_rate_hz!r}")
        self._clock = node.get_clock()
        self._period_s = 1.0 / float(max_rate_hz)
        # The TimeSource's own subscription would keep waking the node's executor: remove it (the TimeSource keeps
        # ROS time active on the node's clock; use_sim_time is read-only, so it never subscribes again).
        for subscription in list(node.subscriptions):
            if subscription.topic_name == CLOCK_TOPIC:
                node.destroy_subscription(subscription)
        # A lean node: no global arguments (they carry use_sim_time, whose TimeSource would subscribe /clock here
        # too), no parameter, type-description or rosout services: its executor waits on one subscription.
        self._node = rclpy.create_node(
            f"_{node.get_name()}_clock", namespace=node.get_namespace(), context=node.context,
            use_global_arguments=False, start_parameter_services=False, enable_rosout=False,
            parameter_overrides=[Parameter("start_type_description_service", value=False)],
        )
        # Same QoS as rclpy's TimeSource: the newest message only, best effort (simulators publish it so).
        self._node.create_subscription(
            ClockMsg, CLOCK_TOPIC, self._on_clock, QoSProfile(depth=1, reliability=ReliabilityPolicy.BEST_EFFORT),
            event_callbacks=SubscriptionEventCallbacks(use_default_callbacks=False),
        )
        self._executor = SingleThreadedExecutor(context=node.context)
        self._executor.add_node(self._node)
        self._stopping = threading.Event()
        self.updates = 0
        """Clock updates taken so far (a test reads it to see the feed run)."""
        self._thread = threading.Thread(target=self._spin, name="clock-feed", daemon=True)
        self._thread.start()

    def _on_clock(self, msg: ClockMsg) -> None:
        self._clock.set_ros_time_override(Time.from_msg(msg.clock))
        self.updates += 1

    def _spin(self) -> None:
        while not self._stopping.is_set():
            before = self.updates
            try:
                self._executor.spin_once(timeout_sec=_SPIN_TIMEOUT_S)
            except (ExternalShutdownException, RuntimeError):
                return  # the context is shutting down
            if self.updates != before:
                # Rate cap: whatever arrives meanwhile waits in the depth-1 queue, the newest replacing the rest.
                self._stopping.wait(self._period_s)

    def stop(self) -> None:
        """End the thread and destroy the hidden node (idempotent)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._thread.join(timeout=2 * _SPIN_TIMEOUT_S + 1.0)
        self._executor.shutdown(timeout_sec=0.5)
        self._node.destroy_node()


def watch_jumps(clock: Clock, on_jump: Callable[[bool, float], None],
                forward_s: float = FORWARD_JUMP_S) -> JumpHandle:
    """Call ``on_jump(backward, delta_s)`` when ``clock`` jumps back (any amount) or forward by more than ``forward_s``.

    Args:
        clock (`rclpy.clock.Clock`): The node's ROS clock (jumps are reported while ROS time is active).
        on_jump (`Callable[[bool, float], None]`): ``backward`` and the jump in seconds (negative when backward).
        forward_s (`float`): Forward threshold, seconds, ``> 0``.

    Returns:
        `JumpHandle`: keep it (the callback lives as long as the handle); ``unregister()`` ends it.
    """
    threshold = JumpThreshold(min_forward=Duration(nanoseconds=int(forward_s * 1e9)),
                              min_backward=Duration(nanoseconds=-1), on_clock_change=False)

    def post(jump: TimeJump) -> None:
        delta_s = jump.delta.nanoseconds * 1e-9
        on_jump(delta_s < 0, delta_s)

    return clock.create_jump_callback(threshold, post_callback=post)


class SimulatedTime:
    """A node under ``use_sim_time``: its :class:`ClockFeed`, and what a time jump does to its serving state.

    The feed runs from the node's construction (an unconfigured node under a fast ``/clock`` must not starve
    either); a configured node :meth:`bind` s its observation buffer and chunk memory, which a jump then acts on:

    - back (a simulator reset): ``observations.clear(why)`` and ``memory.clock_jumped(backward=True)``: frames and the
      remembered chunk belong to the old time line; goals are refused ``NO_OBSERVATION`` (with the reason) until new
      frames come, and the next continuation starts fresh with ``"clock jumped back"``;
    - forward by more than :data:`FORWARD_JUMP_S` (a seek): ``memory.clock_jumped(backward=False)`` resets the
      latency estimate.

    Either way the goals decided before the jump keep neither their chunk nor their latency (the memory's epoch).

    Args:
        node (`rclpy.node.Node`): The serving node (its clock and logger).
    """

    def __init__(self, node: Any) -> None:
        self._logger = node.get_logger()
        self._lock = threading.Lock()
        self._observations: Any = None
        self._memory: Any = None
        self.jumps = {"backward": 0, "forward": 0}
        """Jumps seen so far (``/diagnostics`` reports them)."""
        self.feed = ClockFeed(node)
        self._handle = watch_jumps(node.get_clock(), self._on_jump)

    def bind(self, observations: Any, memory: Any) -> None:
        """Act on ``observations`` (an ``ObservationBuffer``) and ``memory`` (a ``ChunkMemory``) at each jump."""
        with self._lock:
            self._observations, self._memory = observations, memory

    def unbind(self) -> None:
        """Forget them (``cleanup``): jumps are still counted."""
        with self._lock:
            self._observations = self._memory = None

    def _on_jump(self, backward: bool, delta_s: float) -> None:
        # Runs inside rcl on the feed's thread: flip state under the owners' locks, log, return.
        with self._lock:
            observations, memory = self._observations, self._memory
        if backward:
            self.jumps["backward"] += 1
            why = f"the clock jumped back {-delta_s:.3f} s"
            if observations is None:
                self._logger.info(f"{why}; nothing to drop (not configured)")
                return
            frames = observations.clear(why)
            chunk = memory.clock_jumped(backward=True)
            self._logger.warning(
                f"{why} (a simulator reset?): dropped {'the observation buffer' if frames else 'no frames'} and "
                f"{'the remembered chunk' if chunk else 'no chunk'}; goals wait for new frames, continuations start "
                "fresh")
        else:
            self.jumps["forward"] += 1
            if memory is not None:
                memory.clock_jumped(backward=False)
            self._logger.info(f"the clock jumped forward {delta_s:.3f} s: the latency estimate starts over")

    def stop(self) -> None:
        """Stop the jump callback and the feed (before the node is destroyed; idempotent)."""
        if self._handle is not None:
            self._handle.unregister()
            self._handle = None
        self.feed.stop()
