"""A ``GenerateTrajectory`` server with no node behind it: the floor under ``bench --ros``'s node overhead.

What rclpy and DDS cost for one action round trip on this machine, measured by the same client, in the same run, as
the node. Built like the node where it matters for latency: the same action type, a ``MultiThreadedExecutor`` with
one ``ReentrantCallbackGroup``, work that starts in the accept callback and runs on another thread, and an execute
callback that waits for it, then succeeds with ``total_ms`` (the work's own time) in ``metrics``, as the node
reports the engine's. Latency minus ``total_ms`` is then the same measure as the node's overhead, with no
observation buffer, validation, engine hand-off, reducer or publishing in it.

Run by ``bench --ros`` as ``python -m trajectory_ensemble_lab.bench.ros_floor --work-ms MS``; it serves
``/trajectory_ensemble_floor/generate_trajectory`` until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

FLOOR_NAMESPACE = "/trajectory_ensemble_floor"


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the floor action until SIGINT/SIGTERM.

    Args:
        argv (`Sequence[str]`, *optional*): ``--work-ms MS``: how long each goal's work takes (sleeping on a timer
            thread, so the executor is as idle as the node's is while the engine denoises).
    """
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.bench.ros_floor")
    parser.add_argument("--work-ms", type=float, default=250.0)
    args = parser.parse_args(argv)

    import rclpy
    from diagnostic_msgs.msg import KeyValue
    from rclpy.action import ActionServer, CancelResponse, GoalResponse
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.executors import MultiThreadedExecutor
    from rclpy.signals import SignalHandlerOptions
    from trajectory_ensemble_msgs.action import GenerateTrajectory

    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    node = rclpy.create_node("trajectory_ensemble_floor")
    work: dict[bytes, tuple[float, threading.Event]] = {}
    lock = threading.Lock()

    def on_accepted(goal_handle: Any) -> None:
        done = threading.Event()
        timer = threading.Timer(args.work_ms / 1e3, done.set)
        with lock:
            work[bytes(goal_handle.goal_id.uuid)] = (time.perf_counter(), done)
        timer.start()
        goal_handle.execute()

    def execute(goal_handle: Any) -> Any:
        with lock:
            started, done = work.pop(bytes(goal_handle.goal_id.uuid))
        done.wait()
        total_ms = (time.perf_counter() - started) * 1e3
        goal_handle.succeed()
        return GenerateTrajectory.Result(metrics=[KeyValue(key="total_ms", value=f"{total_ms:.3f}")])

    ActionServer(node, GenerateTrajectory, f"{FLOOR_NAMESPACE}/generate_trajectory", execute_callback=execute,
                 goal_callback=lambda _goal: GoalResponse.ACCEPT, handle_accepted_callback=on_accepted,
                 cancel_callback=lambda _goal: CancelResponse.REJECT, callback_group=ReentrantCallbackGroup())
    executor = MultiThreadedExecutor(num_threads=6)
    executor.add_node(node)
    try:
        while not stop.is_set():
            executor.spin_once(timeout_sec=0.2)
    finally:
        executor.shutdown(timeout_sec=2.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
