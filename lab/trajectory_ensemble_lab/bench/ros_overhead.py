"""``trajectory-ensemble bench --ros``: what the ROS node adds on top of the engine, measured over real DDS.

The node runs in its own process on the tiny embedded model (chunk 8, N=8, ``--steps`` denoising steps, default
10); this process publishes a camera frame at 4 Hz and is the action client (on rclpy's C++ ``EventsExecutor``;
``--client-executor single`` puts it on the Python ``SingleThreadedExecutor``, which a Python client may well use).

- **Node overhead** (50 goals after warm-up): client-side goal-to-result latency (``send_goal_async`` until
  the result arrives, i.e. goal request, acceptance, result request and result over DDS) minus the engine's own
  ``total_ms`` from the result metrics. The node's own view (``node_overhead_ms``: its goal time minus
  ``total_ms``) is reported beside it, so the DDS share is visible. Target: p50 <= 5 ms.
- **The floor under it**: each measured goal is followed by one to a do-nothing rclpy action server
  (:mod:`.ros_floor`: same action type and executor, work as long as the engine's, started on acceptance), timed by
  the same client. Its overhead is what rclpy and DDS alone cost per goal on this machine; the paired difference is
  what the node adds above that.
- **Cancel to terminal** (10 goals): when feedback reports denoising step >= 2, send a cancel and time until the
  result arrives with status CANCELED. Reported beside the per-step time (``denoise_ms / num_inference_steps`` of the
  uncanceled goals) so "<= one step + 20 ms" can be judged per run.
- **Deadline of half the goal time** (12 goals): each goal asks for a deadline of half the p50 engine time of the
  overhead goals; reported: its goal time (``goal_ms``, from acceptance) against the deadline (p50/p95), how many the
  engine reports met (``deadline_met``) and the steps it fitted and used. The node tests assert only the counts (fewer
  steps, a consistent report); how close to the deadline goals come is this figure.

Writes ``--json`` (default ``out/bench/ros_overhead.json``) and prints a table. rclpy is imported only here, lazily.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .ros_floor import FLOOR_NAMESPACE
from ..records import write_json

GOALS = 50
WARMUP_GOALS = 3
CANCEL_TRIALS = 10
CANCEL_AT_STEP = 2
CANDIDATES = 8
CHUNK = 8
DEFAULT_STEPS = 10
IMAGE_HZ = 4.0
"""Fresh enough for max_observation_age_s 1.0, and little CPU taken from the node on a small machine."""
OVERHEAD_TARGET_MS = 5.0
CANCEL_SLACK_MS = 20.0
DEADLINE_GOALS = 12
DEFAULT_JSON = Path("out/bench/ros_overhead.json")
GOAL_TIMEOUT_S = 300.0


def percentiles(values: list[float]) -> dict[str, float]:
    """p50/p95/mean/min/max of ``values`` (ms), with n."""
    array = np.asarray(values, dtype=np.float64)
    return {"n": int(array.size), "p50": float(np.percentile(array, 50)), "p95": float(np.percentile(array, 95)),
            "mean": float(array.mean()), "min": float(array.min()), "max": float(array.max())}


def _client_executor(context: Any, kind: str = "events") -> tuple[Any, str]:
    """The client's executor: rclpy's C++ ``EventsExecutor`` (``events``, where this rclpy has it) or the Python
    ``SingleThreadedExecutor`` (``single``).

    The client's own executor is inside the measured latency; the Python wait-set executor costs the client most of
    a millisecond more per goal on a small CPU, which is the client's overhead, not the node's.
    """
    if kind == "events":
        try:
            from rclpy.experimental import EventsExecutor
        except ImportError:
            pass
        else:
            return EventsExecutor(context=context), "EventsExecutor"
    from rclpy.executors import SingleThreadedExecutor

    return SingleThreadedExecutor(context=context), "SingleThreadedExecutor"


class _Client:
    """Image publisher and action client in one rclpy context, spun from the calling thread.

    Not from a background thread: rclpy 9's ``send_goal_async`` registers the future it returns only after sending,
    so an executor thread that handles a fast response in between leaves that future pending forever.
    """

    def __init__(self, namespace: str = "/trajectory_ensemble", floor_namespace: str | None = None,
                 executor: str = "events") -> None:
        import rclpy
        from rclpy.action import ActionClient
        from sensor_msgs.msg import Image
        from trajectory_ensemble_msgs.action import GenerateTrajectory
        from trajectory_ensemble_msgs.msg import ActionTrajectory

        self.GenerateTrajectory = GenerateTrajectory
        self.context = rclpy.Context()
        rclpy.init(args=[], context=self.context)
        self.node = rclpy.create_node("trajectory_ensemble_bench", context=self.context)
        self.client = ActionClient(self.node, GenerateTrajectory, f"{namespace}/generate_trajectory")
        self.floor = (ActionClient(self.node, GenerateTrajectory, f"{floor_namespace}/generate_trajectory")
                      if floor_namespace else None)
        self.image_pub = self.node.create_publisher(Image, f"{namespace}/observation/image", 10)
        # When ~/trajectory arrives: the node publishes it just before the goal succeeds, so the gap from here to
        # the result shows what the result path adds after the node's own goal_ms.
        self.trajectory_at = 0.0
        self.node.create_subscription(ActionTrajectory, f"{namespace}/trajectory", self._on_trajectory, 10)
        pixels = np.random.default_rng(0).integers(0, 255, size=(256, 256, 3), dtype=np.uint8)
        self.image = Image(height=256, width=256, encoding="rgb8", step=256 * 3, data=pixels.tobytes())
        self.node.create_timer(1.0 / IMAGE_HZ, self._publish_image)
        self.executor, self.executor_name = _client_executor(self.context, executor)
        self.executor.add_node(self.node)

    def _on_trajectory(self, _msg: Any) -> None:
        self.trajectory_at = time.perf_counter()

    def _publish_image(self) -> None:
        self.image.header.stamp = self.node.get_clock().now().to_msg()
        self.image_pub.publish(self.image)

    def goal(self, seed: int) -> Any:
        """A goal for N candidates with a fixed seed (same work every time)."""
        return self.GenerateTrajectory.Goal(candidate_count=CANDIDATES, use_seed=True, seed=seed)

    def spin_until(self, done: Any, timeout_s: float = GOAL_TIMEOUT_S) -> bool:
        """Spin until ``done()`` is true or ``timeout_s`` passes; returns ``done()``."""
        deadline = time.monotonic() + timeout_s
        while not done() and time.monotonic() < deadline:
            self.executor.spin_once(timeout_sec=0.05)
        return bool(done())

    def send(self, goal: Any, feedback: Any = None, *, floor: bool = False) -> Any:
        """Send ``goal`` (to the floor server with ``floor``), wait for acceptance; returns the accepted handle."""
        client = self.floor if floor else self.client
        assert client is not None, "no floor server configured"
        future = client.send_goal_async(goal, feedback_callback=feedback)
        if not self.spin_until(future.done) or not future.result().accepted:
            raise RuntimeError("the node did not accept a goal")
        return future.result()

    def result(self, handle: Any) -> Any:
        """Wait for the result of an accepted goal (``GetResult`` response: status and result)."""
        future = handle.get_result_async()
        if not self.spin_until(future.done):
            raise RuntimeError("no result within the goal timeout")
        return future.result()

    def close(self) -> None:
        """Stop spinning and shut the context down."""
        import rclpy

        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def _metrics(result: Any) -> dict[str, float]:
    out = {}
    for kv in result.metrics:
        try:
            out[kv.key] = float(kv.value)
        except ValueError:
            pass
    return out


def _timed_goal(client: _Client, seed: int, *, floor: bool) -> dict[str, Any]:
    """One goal, start to result, as the client sees it; raises unless it succeeded."""
    from action_msgs.msg import GoalStatus

    started = time.perf_counter()
    handle = client.send(client.goal(seed=seed), floor=floor)
    accepted_ms = (time.perf_counter() - started) * 1e3
    response = client.result(handle)
    finished = time.perf_counter()
    if response.status != GoalStatus.STATUS_SUCCEEDED:
        raise RuntimeError(f"{'floor ' if floor else ''}goal {seed} ended with status {response.status}: "
                           f"{response.result.error_message}")
    latency_ms = (finished - started) * 1e3
    m = _metrics(response.result)
    row: dict[str, Any] = {"latency_ms": latency_ms, "accept_ms": accepted_ms, "engine_total_ms": m["total_ms"],
                           "overhead_ms": latency_ms - m["total_ms"]}
    if not floor:
        # Only this goal's message counts: it cannot come before acceptance (a late one of the previous goal can).
        own_topic = started + accepted_ms / 1e3 < client.trajectory_at <= finished
        row.update({"result_after_topic_ms": (finished - client.trajectory_at) * 1e3 if own_topic else None,
                    "node_overhead_ms": m.get("node_overhead_ms"), "denoise_ms": m.get("denoise_ms"),
                    "physical_forwards": m.get("physical_forwards")})
    return row


def _finite(values: list[Any]) -> list[float]:
    return [float(v) for v in values if v is not None] or [float("nan")]


def measure_overhead(client: _Client, goals: int, log: Any, *, floor: bool = False) -> dict[str, Any]:
    """Goal-to-result latency minus engine ``total_ms`` over ``goals`` goals (after warm-up).

    With ``floor``, each node goal is followed by one goal to the floor server (:mod:`.ros_floor`), so both see the
    machine in the same state; their overhead is reported as ``floor``.
    """
    rows, floor_rows = [], []
    for i in range(WARMUP_GOALS + goals):
        row = _timed_goal(client, seed=i, floor=False)
        floor_row = _timed_goal(client, seed=i, floor=True) if floor else None
        if i < WARMUP_GOALS:
            continue
        rows.append(row)
        if floor_row is not None:
            floor_rows.append(floor_row)
        if (i - WARMUP_GOALS + 1) % 10 == 0:
            log(f"  {i - WARMUP_GOALS + 1}/{goals} goals: overhead p50 so far "
                f"{statistics.median(r['overhead_ms'] for r in rows):.2f} ms"
                + (f" (floor {statistics.median(r['overhead_ms'] for r in floor_rows):.2f} ms)" if floor_rows else ""))
    out: dict[str, Any] = {
        "goals": rows, "overhead_ms": percentiles([r["overhead_ms"] for r in rows]),
        "latency_ms": percentiles([r["latency_ms"] for r in rows]),
        "accept_ms": percentiles([r["accept_ms"] for r in rows]),
        "result_after_topic_ms": percentiles(_finite([r["result_after_topic_ms"] for r in rows])),
        "engine_total_ms": percentiles([r["engine_total_ms"] for r in rows]),
        "node_side_overhead_ms": percentiles(_finite([r["node_overhead_ms"] for r in rows])),
        "denoise_ms": percentiles(_finite([r["denoise_ms"] for r in rows])),
    }
    if floor_rows:
        out["floor"] = {"goals": floor_rows, "overhead_ms": percentiles([r["overhead_ms"] for r in floor_rows]),
                        "accept_ms": percentiles([r["accept_ms"] for r in floor_rows]),
                        "work_ms": percentiles([r["engine_total_ms"] for r in floor_rows])}
        # Paired by position: goal k to the node and goal k to the floor ran back to back.
        out["above_floor_ms"] = percentiles([r["overhead_ms"] - f["overhead_ms"] for r, f in zip(rows, floor_rows)])
    return out


def measure_cancel(client: _Client, trials: int, steps: int, log: Any) -> dict[str, Any]:
    """Cancel mid-denoising, time until the goal is CANCELED; per-step times from the feedback stream."""
    from action_msgs.msg import GoalStatus

    rows = []
    for trial in range(trials):
        step_times: list[tuple[int, float]] = []

        def feedback(msg: Any, times: list[tuple[int, float]] = step_times) -> None:
            fb = msg.feedback
            if fb.stage == "denoising":
                times.append((int(fb.step), time.perf_counter()))

        handle = client.send(client.goal(seed=10_000 + trial), feedback)
        result_future = handle.get_result_async()
        if not client.spin_until(lambda: bool(step_times) and step_times[-1][0] >= CANCEL_AT_STEP):
            raise RuntimeError(f"cancel trial {trial}: no denoising feedback at step {CANCEL_AT_STEP}")
        canceled_at = time.perf_counter()
        at_step = step_times[-1][0]
        handle.cancel_goal_async()
        if not client.spin_until(result_future.done):
            raise RuntimeError(f"cancel trial {trial}: no terminal state after cancel")
        terminal_ms = (time.perf_counter() - canceled_at) * 1e3
        status = result_future.result().status
        intervals = [(b[1] - a[1]) * 1e3 / max(b[0] - a[0], 1) for a, b in zip(step_times, step_times[1:])
                     if b[0] > a[0]]
        step_ms = statistics.median(intervals) if intervals else None
        rows.append({"cancel_to_terminal_ms": terminal_ms, "canceled_at_step": at_step, "total_steps": steps,
                     "status": "CANCELED" if status == GoalStatus.STATUS_CANCELED else str(status),
                     "feedback_step_ms": step_ms,
                     # Judged against this goal's own step time: the machine's load changes from goal to goal.
                     "within_own_step_plus_slack": step_ms is not None
                     and terminal_ms <= step_ms + CANCEL_SLACK_MS})
        log(f"  cancel {trial + 1}/{trials}: at step {at_step}/{steps}, terminal after {terminal_ms:.1f} ms "
            f"({rows[-1]['status']})")
        client.spin_until(lambda: False, 0.2)  # let the node release the goal before the next one
    step_ms = [r["feedback_step_ms"] for r in rows if r["feedback_step_ms"] is not None]
    return {"trials": rows, "cancel_to_terminal_ms": percentiles([r["cancel_to_terminal_ms"] for r in rows]),
            "within_own_step_plus_slack": sum(bool(r["within_own_step_plus_slack"]) for r in rows),
            "feedback_step_ms": percentiles(step_ms or [float("nan")]),
            "all_canceled": all(r["status"] == "CANCELED" for r in rows)}


def measure_deadline(client: _Client, goals: int, half_of_ms: float, log: Any) -> dict[str, Any]:
    """Goals with a deadline of half ``half_of_ms``: goal time against it, deadlines met, steps fitted and used."""
    from action_msgs.msg import GoalStatus

    deadline_ms = half_of_ms / 2.0
    nanos = int(deadline_ms * 1e6)
    rows = []
    for i in range(goals):
        goal = client.goal(seed=20_000 + i)
        goal.deadline.sec, goal.deadline.nanosec = divmod(nanos, 1_000_000_000)
        response = client.result(client.send(goal))
        result = response.result
        metrics = {kv.key: kv.value for kv in result.metrics}
        if response.status != GoalStatus.STATUS_SUCCEEDED:
            rows.append({"status": int(response.status), "error_code": int(result.error_code)})
            continue
        rows.append({"goal_ms": float(metrics["goal_ms"]), "engine_total_ms": float(metrics["total_ms"]),
                     "deadline_met": metrics.get("deadline_met") == "true", "steps_fitted": int(result.steps_fitted),
                     "steps_used": int(result.steps_used), "steps_planned": int(result.steps_planned)})
    served = [r for r in rows if "goal_ms" in r]
    log(f"  deadline {deadline_ms:.0f} ms: {len(served)}/{goals} served, "
        f"{sum(r['deadline_met'] for r in served)} met by the engine's account")
    return {"deadline_ms": deadline_ms, "goals": rows, "served": len(served),
            "goal_ms": percentiles([r["goal_ms"] for r in served] or [float("nan")]),
            "met": sum(r["deadline_met"] for r in served),
            "steps_fitted": percentiles([float(r["steps_fitted"]) for r in served] or [float("nan")]),
            "steps_used": percentiles([float(r["steps_used"]) for r in served] or [float("nan")])}


def _table(doc: dict[str, Any]) -> str:
    o, c = doc["overhead"], doc["cancel"]
    step = doc["step_ms"]
    lines = [
        f"bench --ros: tiny model, chunk {CHUNK}, N={CANDIDATES}, {doc['config']['num_inference_steps']} steps, "
        f"device {doc['config']['device']}, {o['overhead_ms']['n']} goals / {len(c['trials'])} cancels",
        f"{'measure':<44}{'p50':>10}{'p95':>10}{'max':>10}  target",
        f"{'goal-to-result latency (client) [ms]':<44}" + "".join(
            f"{o['latency_ms'][k]:>10.2f}" for k in ("p50", "p95", "max")),
        f"{'engine total_ms [ms]':<44}" + "".join(f"{o['engine_total_ms'][k]:>10.2f}" for k in ("p50", "p95", "max")),
        f"{'node overhead = latency - total_ms [ms]':<44}" + "".join(
            f"{o['overhead_ms'][k]:>10.2f}" for k in ("p50", "p95", "max"))
        + f"  p50 <= {OVERHEAD_TARGET_MS:g}: {'met' if doc['targets']['overhead_met'] else 'NOT met'}",
        f"{'goal request to acceptance (client) [ms]':<44}" + "".join(
            f"{o['accept_ms'][k]:>10.2f}" for k in ("p50", "p95", "max")),
        f"{'  of which inside the node (node_overhead_ms)':<44}" + "".join(
            f"{o['node_side_overhead_ms'][k]:>10.2f}" for k in ("p50", "p95", "max")),
        f"{'  ~/trajectory arrival to result arrival':<44}" + "".join(
            f"{o['result_after_topic_ms'][k]:>10.2f}" for k in ("p50", "p95", "max")),
        *([f"{'floor: do-nothing rclpy server, same client':<44}" + "".join(
            f"{o['floor']['overhead_ms'][k]:>10.2f}" for k in ("p50", "p95", "max")),
           f"{'node overhead above the floor (paired) [ms]':<44}" + "".join(
            f"{o['above_floor_ms'][k]:>10.2f}" for k in ("p50", "p95", "max"))] if "floor" in o else []),
        f"{'per denoising step (denoise_ms / steps) [ms]':<44}{step['p50']:>10.2f}{step['p95']:>10.2f}"
        f"{step['max']:>10.2f}",
        f"{'cancel to CANCELED [ms]':<44}" + "".join(
            f"{c['cancel_to_terminal_ms'][k]:>10.2f}" for k in ("p50", "p95", "max"))
        + f"  <= step + {CANCEL_SLACK_MS:g} = {doc['targets']['cancel_budget_ms']:.1f}: "
        + ("met" if doc["targets"]["cancel_met"] else "NOT met") + " (max)",
        f"{'cancels within their own goal step + 20 ms':<44}{c['within_own_step_plus_slack']:>10d} "
        f"of {len(c['trials'])}  (feedback step p50 {c['feedback_step_ms']['p50']:.1f} ms)",
    ]
    d = doc.get("deadline")
    if d is not None:
        lines += [
            f"{'goal_ms, deadline half the goal time [ms]':<44}" + "".join(
                f"{d['goal_ms'][k]:>10.2f}" for k in ("p50", "p95", "max"))
            + f"  deadline {d['deadline_ms']:.1f}: met {d['met']} of {d['served']} served ({len(d['goals'])} sent)",
            f"{'  steps fitted / used (p50 of ' + str(doc['config']['num_inference_steps']) + ')':<44}"
            f"{d['steps_fitted']['p50']:>10.1f}{d['steps_used']['p50']:>10.1f}",
        ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run the measurement (``args`` are ``bench``'s: ``--json``, ``--steps``, ``--device``, ``--client-executor``,
    ``--quiet``)."""
    from trajectory_ensemble_node.cli.launcher import NodeProcess, NodeStartError, pick_domain_id, ros_env

    steps = int(getattr(args, "steps", None) or DEFAULT_STEPS)
    device = str(getattr(args, "device", None) or "auto")
    json_path = Path(getattr(args, "json", None) or DEFAULT_JSON)
    quiet = bool(getattr(args, "quiet", False))

    def log(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    domain_id = pick_domain_id()
    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    # droid_lerobot (width 10) and mean, as in the first measurements, not the toy defaults.
    params = {"model": "tiny", "device": device, "domain_name": "droid_lerobot", "reducer": "mean",
              "chunk_size": CHUNK, "num_inference_steps": steps, "candidate_count": CANDIDATES,
              "goal_policy": "preempt"}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    node = NodeProcess(params, ros_env(domain_id), log_path=json_path.with_suffix(".node.log"))
    log(f"bench --ros: starting the node (tiny, chunk {CHUNK}, {steps} steps, device {device}, "
        f"ROS_DOMAIN_ID={domain_id})")
    try:
        node.start(ready_timeout_s=600)
    except NodeStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    client = None
    floor_server: subprocess.Popen[bytes] | None = None
    client_executor = "none"
    started = time.time()
    try:
        client = _Client(floor_namespace=FLOOR_NAMESPACE, executor=str(getattr(args, "client_executor", "events")))
        client_executor = client.executor_name
        if not client.client.wait_for_server(timeout_sec=30):
            print("error: node not reachable: no action server /trajectory_ensemble/generate_trajectory",
                  file=sys.stderr)
            return 3
        client.spin_until(lambda: False, 0.5)  # a few frames reach the node before the first goal
        # The floor server's goals take as long as the node's engine does here, so both idle the same way.
        work_ms = statistics.median(_timed_goal(client, seed=i, floor=False)["engine_total_ms"]
                                    for i in range(WARMUP_GOALS))
        floor_server = subprocess.Popen([sys.executable, "-m", "trajectory_ensemble_lab.bench.ros_floor",
                                         "--work-ms", f"{work_ms:.1f}"], env=ros_env(domain_id),
                                        stdout=subprocess.DEVNULL, start_new_session=True)
        floor = client.floor
        assert floor is not None
        # Spinning, not wait_for_server(): the camera timer must keep the node's observation fresh meanwhile.
        if not client.spin_until(floor.server_is_ready, 60):
            print(f"error: the floor server ({FLOOR_NAMESPACE}) did not come up", file=sys.stderr)
            return 3
        log(f"node overhead: {WARMUP_GOALS} warm-up + {GOALS} goals, each followed by one to the floor server "
            f"({work_ms:.0f} ms of work per goal)")
        overhead = measure_overhead(client, GOALS, log, floor=True)
        overhead["floor"]["work_ms_requested"] = work_ms
        log(f"cancel: {CANCEL_TRIALS} goals canceled at denoising step {CANCEL_AT_STEP}")
        cancel = measure_cancel(client, CANCEL_TRIALS, steps, log)
        log(f"deadline: {DEADLINE_GOALS} goals, each with half the p50 engine time as its deadline")
        deadline = measure_deadline(client, DEADLINE_GOALS, overhead["engine_total_ms"]["p50"], log)
    finally:
        if client is not None:
            client.close()
        if floor_server is not None:
            floor_server.send_signal(signal.SIGINT)
            try:
                floor_server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                floor_server.kill()
        node.stop()
    step_ms = percentiles([r["denoise_ms"] / steps for r in overhead["goals"] if r["denoise_ms"] is not None])
    budget = step_ms["p50"] + CANCEL_SLACK_MS
    doc = {
        "what": "node overhead over engine time and cancel latency, tiny model over DDS "
                "(trajectory-ensemble bench --ros)",
        "config": {"model": "tiny", "chunk_size": CHUNK, "candidate_count": CANDIDATES, "num_inference_steps": steps,
                   "device": device, "goals": GOALS, "warmup_goals": WARMUP_GOALS, "cancel_trials": CANCEL_TRIALS,
                   "cancel_at_step": CANCEL_AT_STEP, "deadline_goals": DEADLINE_GOALS, "rmw": os.environ.get("RMW_IMPLEMENTATION", "default"),
                   "client_executor": client_executor,
                   "ros_domain_id": domain_id},
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_1m_end": os.getloadavg()[0]},
        "started_unix": started, "wall_s": time.time() - started,
        "overhead": overhead, "cancel": cancel, "deadline": deadline, "step_ms": step_ms,
        "targets": {"overhead_p50_ms": OVERHEAD_TARGET_MS,
                    "overhead_met": overhead["overhead_ms"]["p50"] <= OVERHEAD_TARGET_MS,
                    "cancel_budget_ms": budget,
                    "cancel_met": cancel["all_canceled"] and cancel["cancel_to_terminal_ms"]["max"] <= budget},
    }
    write_json(json_path, doc)
    print(_table(doc))
    print(f"written: {json_path}")
    return 0
