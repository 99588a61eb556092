"""``trajectory-ensemble bench --clock-rate``: does a fast ``/clock`` slow the node down? (issue 36)

Two node processes run side by side on the bundled toy policy, N = 4 candidates: one with ``use_sim_time`` while
this process publishes ``/clock`` at 1 kHz (Gazebo's default) from a ``SimClock`` at real-time factor 1, one on the
host's clock. For the goals a camera thread at :data:`CAMERA_HZ` feeds both, stamped on each node's clock; goals
alternate between them, one at a time, so each runs on an otherwise idle engine and both see the same machine load.

- **Engine time**: the result's ``total_ms`` (encode + steps + post-processing, as the engine measures it), median
  over ``--goals`` goals per node after two warm-up goals each; target: sim time at 1 kHz <= 1.5x the host-clock node.
  ``goal_ms`` (acceptance to result, in the node) is reported beside it.
- **Idle CPU** of the sim-time node's process with ``/clock`` at 0, 100 and 1000 Hz (and of the host-clock node, as
  the floor): ``utime + stime`` from ``/proc/<pid>/stat`` over :data:`IDLE_WINDOW_S` s, per cent of one core.

Writes ``--json`` (default ``bench/results/clock_rate-toy.json``) and the markdown beside it, both with the date and
commit of the run. rclpy is imported only in :func:`run`.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trajectory_ensemble_node.provenance import git_commit, utc_now
from ..records import write_json

CANDIDATES = 4
CAMERA_HZ = 10.0
GOALS = 10
WARMUP_GOALS = 2
RATES_HZ = (0.0, 100.0, 1000.0)
IDLE_WINDOW_S = 10.0
SETTLE_S = 2.0
"""After the /clock rate changes, before the idle window: the node's clock feed and executor reach steady state."""
TARGET_RATIO = 1.5
DEFAULT_JSON = Path("bench/results/clock_rate-toy.json")
LOG_DIR = Path("out/bench")
"""The two nodes' logs (not results: kept out of ``bench/results``)."""
GOAL_TIMEOUT_S = 300.0
NS_PER_S = 1_000_000_000
NODES = {"sim": "/clock_sim", "host": "/clock_host"}
"""Namespaces of the two nodes: ``sim`` (``use_sim_time``, fed the 1 kHz clock) and ``host`` (the host's clock)."""


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` has used, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_percent(pid: int, window_s: float) -> float:
    """Per cent of one core the process used over ``window_s`` seconds of wall time (it should be idle)."""
    before, started = process_cpu_s(pid), time.monotonic()
    time.sleep(window_s)
    return 100.0 * (process_cpu_s(pid) - before) / (time.monotonic() - started)


class _Client:
    """This process's side: a ``/clock`` publisher, and per node an image publisher and an action client."""

    def __init__(self) -> None:
        import rclpy
        from rclpy.action import ActionClient
        from rclpy.context import Context
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import QoSProfile
        from sensor_msgs.msg import Image
        from trajectory_ensemble_msgs.action import GenerateTrajectory

        from trajectory_ensemble_node.demo.clock_publisher import ClockPublisher
        from trajectory_ensemble_node.demo.sim_model import SimClock

        self.context = Context()
        rclpy.init(context=self.context)
        self.node = rclpy.create_node("clock_rate_bench", context=self.context)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.Goal, self.Image = GenerateTrajectory.Goal, Image
        self.images = {name: self.node.create_publisher(Image, f"{ns}/trajectory_ensemble/observation/image",
                                                        QoSProfile(depth=10)) for name, ns in NODES.items()}
        self.actions = {name: ActionClient(self.node, GenerateTrajectory,
                                           f"{ns}/trajectory_ensemble/generate_trajectory")
                        for name, ns in NODES.items()}
        self.clock = ClockPublisher(self.node, SimClock(1.0, start_ns=100 * NS_PER_S))
        self._running = True
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()
        self._camera = threading.Thread(target=self._film, daemon=True)

    def start_camera(self) -> None:
        """Frames at :data:`CAMERA_HZ` to both nodes from now on (not during the idle measurements)."""
        self._camera.start()
        time.sleep(0.5)

    def _spin(self) -> None:
        while self._running and self.context.ok():
            self.executor.spin_once(timeout_sec=0.05)

    def _film(self) -> None:
        import numpy as np

        pixels = np.random.default_rng(0).integers(0, 256, 64 * 64 * 3, dtype=np.uint8).tobytes()
        while self._running:
            for name, publisher in self.images.items():
                stamp = self.clock.clock.now_ns() if name == "sim" else time.time_ns()
                msg = self.Image(height=64, width=64, encoding="rgb8", step=64 * 3, data=pixels)
                msg.header.stamp.sec, msg.header.stamp.nanosec = stamp // NS_PER_S, stamp % NS_PER_S
                publisher.publish(msg)
            time.sleep(1.0 / CAMERA_HZ)

    def wait(self, predicate: Any, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return False

    def goal(self, name: str, seed: int) -> dict[str, float]:
        """One goal to node ``name`` on the camera's latest frame; returns its engine and goal time (ms)."""
        goal = self.Goal(candidate_count=CANDIDATES, use_seed=True, seed=seed)
        future = self.actions[name].send_goal_async(goal)
        if not self.wait(future.done, GOAL_TIMEOUT_S) or not future.result().accepted:
            raise RuntimeError(f"{name}: the goal was not accepted")
        result_future = future.result().get_result_async()
        if not self.wait(result_future.done, GOAL_TIMEOUT_S):
            raise RuntimeError(f"{name}: no result within {GOAL_TIMEOUT_S:g} s")
        result = result_future.result().result
        if result.error_code != 0:
            raise RuntimeError(f"{name}: goal failed: {result.error_message}")
        metrics = {kv.key: kv.value for kv in result.metrics}
        return {"total_ms": float(metrics["total_ms"]), "goal_ms": float(metrics["goal_ms"])}

    def close(self) -> None:
        import rclpy

        self.clock.stop()
        self._running = False
        self._thread.join(5)
        if self._camera.is_alive():
            self._camera.join(5)
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)


def _table(doc: dict[str, Any]) -> str:
    engine, idle = doc["engine_ms"], doc["idle_cpu_percent"]
    lines = [
        f"Clock rate and the node (`trajectory-ensemble bench --clock-rate`): toy policy, N = {CANDIDATES}, "
        f"{doc['config']['goals']} goals per node after {WARMUP_GOALS} warm-up goals each, alternating. "
        f"Run {doc['date']} at commit {doc['commit']} on {doc['host']['cpus']} CPUs "
        f"(load average {doc['host']['load_avg_1m_start']:.1f} at the start).",
        "",
        "| node | engine time p50 (ms) | goal time p50 (ms) | engine min / max (ms) |",
        "|---|---|---|---|",
    ]
    for name, label in (("sim", "use_sim_time, /clock at 1 kHz"), ("host", "host clock")):
        e = engine[name]
        lines.append(f"| {label} | {e['total_ms_p50']:.0f} | {e['goal_ms_p50']:.0f} | {e['total_ms_min']:.0f} / "
                     f"{e['total_ms_max']:.0f} |")
    lines += ["", f"Engine time ratio (1 kHz sim time / host clock, medians): **{doc['ratio']:.2f}** "
              f"(target <= {TARGET_RATIO:g}: {'met' if doc['ratio_met'] else 'NOT met'}).", "",
              "| /clock rate | idle CPU of the use_sim_time node (% of one core) |", "|---|---|"]
    for rate, percent in idle["sim"].items():
        lines.append(f"| {float(rate):g} Hz | {percent:.1f} |")
    lines.append(f"| (host-clock node, no /clock subscription) | {idle['host']:.1f} |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Run the measurement (``args``: ``--json``, ``--quiet``)."""
    from trajectory_ensemble_node.cli.launcher import NodeProcess, NodeStartError, pick_domain_id, ros_env

    json_path = Path(getattr(args, "json", None) or DEFAULT_JSON)
    if json_path.suffix != ".json":
        json_path = DEFAULT_JSON
    goals = GOALS
    quiet = bool(getattr(args, "quiet", False))

    def log(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    date, commit, load = utc_now(), git_commit(), os.getloadavg()[0]
    domain_id = pick_domain_id()
    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    params = {"model": "toy", "device": "cpu", "candidate_count": CANDIDATES, "max_observation_age_s": 5.0}
    nodes = {name: NodeProcess({**params, "use_sim_time": name == "sim"}, ros_env(domain_id), namespace=ns,
                               log_path=LOG_DIR / f"clock_rate-{name}.node.log")
             for name, ns in NODES.items()}
    client = None
    started = time.monotonic()
    try:
        for name, node in nodes.items():
            log(f"bench --clock-rate: starting the {name} node (ROS_DOMAIN_ID={domain_id})")
            node.start(ready_timeout_s=600)
        client = _Client()
        for name, action in client.actions.items():
            if not action.wait_for_server(timeout_sec=60):
                raise NodeStartError(f"no action server for the {name} node")
        client.wait(lambda: all(p.get_subscription_count() > 0 for p in client.images.values()), 60)
        client.wait(lambda: client.clock.subscribers() > 0, 60)
        time.sleep(0.5)  # the nodes' readers match ours a moment after ours match theirs
        pids = {name: node.proc.pid for name, node in nodes.items()}
        idle: dict[str, Any] = {"sim": {}}
        for rate in RATES_HZ:
            client.clock.stop()
            if rate:
                client.clock.start(rate)
            time.sleep(SETTLE_S)
            idle["sim"][str(rate)] = idle_cpu_percent(pids["sim"], IDLE_WINDOW_S)
            if rate == RATES_HZ[0]:
                idle["host"] = idle_cpu_percent(pids["host"], IDLE_WINDOW_S)
            log(f"idle CPU at {rate:g} Hz: {idle['sim'][str(rate)]:.1f} %")
        # /clock stays at the last rate (1 kHz) for the goals.
        client.start_camera()
        samples: dict[str, list[dict[str, float]]] = {"sim": [], "host": []}
        for i in range(WARMUP_GOALS + goals):
            for name in ("sim", "host") if i % 2 == 0 else ("host", "sim"):
                timed = client.goal(name, seed=i)
                if i >= WARMUP_GOALS:
                    samples[name].append(timed)
            if i >= WARMUP_GOALS:
                log(f"goal {i + 1 - WARMUP_GOALS}/{goals}: engine {samples['sim'][-1]['total_ms']:.0f} ms on sim "
                    f"time, {samples['host'][-1]['total_ms']:.0f} ms on the host clock")
        published = client.clock.published
    except NodeStartError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    finally:
        if client is not None:
            client.close()
        for node in nodes.values():
            node.stop()
    engine = {name: {"total_ms_p50": statistics.median(s["total_ms"] for s in runs),
                     "goal_ms_p50": statistics.median(s["goal_ms"] for s in runs),
                     "total_ms_min": min(s["total_ms"] for s in runs), "total_ms_max": max(s["total_ms"] for s in runs),
                     "total_ms": [s["total_ms"] for s in runs]}
              for name, runs in samples.items()}
    ratio = engine["sim"]["total_ms_p50"] / engine["host"]["total_ms_p50"]
    doc = {
        "what": "engine time of an N=4 goal under a 1 kHz /clock (use_sim_time) vs on the host clock, and idle CPU "
                "of the use_sim_time node at 0, 100 and 1000 Hz (trajectory-ensemble bench --clock-rate)",
        "date": date, "commit": commit,
        "config": {"model": "toy", "candidate_count": CANDIDATES, "goals": goals, "warmup_goals": WARMUP_GOALS,
                   "rates_hz": list(RATES_HZ), "idle_window_s": IDLE_WINDOW_S, "clock_messages": published,
                   "rmw": os.environ.get("RMW_IMPLEMENTATION", "default"), "ros_domain_id": domain_id},
        "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_1m_start": load,
                 "load_avg_1m_end": os.getloadavg()[0]},
        "wall_s": time.monotonic() - started,
        "engine_ms": engine, "ratio": ratio, "ratio_met": ratio <= TARGET_RATIO, "target_ratio": TARGET_RATIO,
        "idle_cpu_percent": idle,
    }
    write_json(json_path, doc)
    table = _table(doc)
    json_path.with_suffix(".md").write_text(table, encoding="utf-8")
    print(table)
    print(f"written: {json_path}, {json_path.with_suffix('.md')}")
    return 0
