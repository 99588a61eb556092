"""The reliability soak (``make soak``): the long storms of issue 20, against the node over real DDS.

Runs, each bounded in goals and in seconds, on loopback only:

- 500 goals on one node; RSS at goal 100 (after warm-up) and at goal 500, growth reported (target < 2 %);
- a 200-goal burst under each goal policy (``preempt``, ``queue``, ``reject``): answered, terminal, timings;
- cancel storms (every goal canceled right after acceptance, twice);
- clients killed (SIGKILL) mid-goal;
- a frame flood (good, malformed and oversized frames at full speed);
- hostile ``update_weights`` paths;
- each engine fault of ``serving/faults.py`` (``fault_injection``, test-only);
- a 1 MB instruction, and SIGTERM during a goal (seconds until the process is gone).

Writes the figures to ``bench/results/soak.json`` and a short ``docs/reliability.md``. Exit status 1 when a check
failed (the figures are written anyway). Usage::

    PYTHONPATH=. python tests/reliability/soak.py [--goals 500] [--burst 200]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE.parent))

from _node_harness import NS, serve_node  # noqa: E402
from _reliability_harness import fire_burst, rss_bytes  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402
from trajectory_ensemble_node.cli.launcher import pick_domain_id, ros_env  # noqa: E402

SUCCEEDED, CANCELED, ABORTED = 4, 5, 6
SOAK_PARAMS = {"num_inference_steps": 1, "candidate_count": 2, "max_observation_age_s": 600.0,
               "max_image_pixels": 640 * 480}


class Checks:
    """Named pass/fail checks, collected for the JSON and the exit status."""

    def __init__(self) -> None:
        self.results: dict[str, bool] = {}

    def __call__(self, name: str, ok: bool, detail: Any = "") -> None:
        self.results[name] = bool(ok)
        print(f"  [{'ok' if ok else 'FAIL'}] {name} {detail}", flush=True)


def goal_code(outcome: Any) -> int:
    return int(outcome.result.error_code)


def ensure_observation(client: Any, stamp: int, tries: int = 5) -> bool:
    """Publish a frame until a goal succeeds on it (the image subscription is best effort: a loaded host drops)."""
    for attempt in range(tries):
        client.publish_image(stamp + attempt)
        if client.run_goal(timeout=60.0).status == SUCCEEDED:
            return True
    return False


RSS_EVERY = 10
"""Goals between RSS samples of the soak."""


def soak_goals(node: Any, client: Any, goals: int, warmup: int, check: Checks) -> dict[str, Any]:
    ensure_observation(client, 1)
    rss: dict[int, int] = {}
    codes: dict[int, int] = {}
    started = time.monotonic()
    for i in range(1, goals + 1):
        if i % 50 == 0:
            client.publish_image(100 + i)
        outcome = client.run_goal(timeout=60.0)
        codes[goal_code(outcome)] = codes.get(goal_code(outcome), 0) + 1
        if i >= warmup and (i % RSS_EVERY == 0 or i == goals):
            rss[i] = rss_bytes(node.proc.pid)
    # The allocator lends and returns pages in bursts (a single sample can sit 10 % above its neighbours), so
    # growth compares the median of the first 100 goals after warm-up with the median of the last 100.
    window = min(100, max(RSS_EVERY, (goals - warmup) // 2))
    first = statistics.median(v for k, v in rss.items() if k <= warmup + window)
    last = statistics.median(v for k, v in rss.items() if k > goals - window)
    growth = (last - first) / first * 100.0
    check("soak: every goal succeeded", codes.get(0, 0) == goals, codes)
    check("soak: RSS growth after warm-up < 2 %", growth < 2.0, f"{growth:+.2f} %")
    return {"goals": goals, "warmup_goals": warmup, "codes": codes, "seconds": time.monotonic() - started,
            "rss_window_goals": window, "rss_median_mb_first": round(first / 2**20, 1),
            "rss_median_mb_last": round(last / 2**20, 1),
            "rss_mb_by_goal": {k: round(v / 2**20, 1) for k, v in rss.items() if k % 100 == 0 or k == warmup},
            "rss_growth_pct": round(growth, 2)}


def cancel_storm(client: Any, rounds: int, check: Checks) -> dict[str, Any]:
    statuses: dict[int, int] = {}
    for _ in range(rounds):
        outcome = client.send_goal(timeout=60.0)
        client.cancel(outcome)
        client.cancel(outcome)  # a second cancel must be answered too
        done = client.result(outcome, timeout=60.0)
        statuses[done.status] = statuses.get(done.status, 0) + 1
    after = client.run_goal(timeout=60.0)
    check("cancel storm: every goal terminal", sum(statuses.values()) == rounds, statuses)
    check("cancel storm: the node serves after", after.status == SUCCEEDED)
    return {"goals": rounds, "statuses": statuses}


_KILLED_CLIENT = textwrap.dedent("""
    import sys, time, rclpy
    from rclpy.action import ActionClient
    from trajectory_ensemble_msgs.action import GenerateTrajectory
    rclpy.init()
    node = rclpy.create_node("doomed_client")
    action = ActionClient(node, GenerateTrajectory, sys.argv[1])
    action.wait_for_server(timeout_sec=60)
    future = action.send_goal_async(GenerateTrajectory.Goal(candidate_count=8))
    rclpy.spin_until_future_complete(node, future, timeout_sec=60)
    print("accepted", flush=True)
    time.sleep(60)
""")


def killed_clients(client: Any, count: int, domain_id: int, check: Checks) -> dict[str, Any]:
    env = ros_env(domain_id)
    killed = 0
    for _ in range(count):
        proc = subprocess.Popen([sys.executable, "-c", _KILLED_CLIENT, f"{NS}/generate_trajectory"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = proc.stdout.readline() if proc.stdout else ""
            killed += line.strip() == "accepted"
        finally:
            proc.kill()
            proc.wait(10)
    after = client.run_goal(timeout=60.0)
    _, values = client.latest_status("goals", predicate=lambda v: v.get("goals_running") == "0")
    check("killed clients: goals accepted then killed", killed == count, f"{killed}/{count}")
    check("killed clients: the node serves after, nothing left running", after.status == SUCCEEDED, values)
    return {"clients": count, "killed_after_accept": killed}


def frame_flood(node: Any, client: Any, frames: int, check: Checks) -> dict[str, Any]:
    from _node_harness import image_msg

    pub = next(iter(client.image_pubs.values()))
    good, bad, big = image_msg(5), image_msg(6, encoding="yuv422", step=64 * 2, data=b"\0" * (64 * 2 * 48)), \
        image_msg(7, height=500, width=700)
    before = rss_bytes(node.proc.pid)
    started = time.monotonic()
    for i in range(frames):
        pub.publish((good, bad, big)[i % 3])
    seconds = time.monotonic() - started
    time.sleep(1.0)
    client.publish_image(9)
    after = client.run_goal(timeout=60.0)
    growth_mb = (rss_bytes(node.proc.pid) - before) / 2**20
    check("frame flood: the node serves after", after.status == SUCCEEDED, after.result.error_message)
    _, values = client.latest_status("observations")
    return {"frames": frames, "publish_seconds": round(seconds, 2), "rss_growth_mb": round(growth_mb, 1),
            "rejected": {k: v for k, v in values.items() if k.startswith("frames_rejected")}}


def hostile_weights(node: Any, client: Any, check: Checks) -> dict[str, Any]:
    paths = [f"/proc/{node.proc.pid}/environ", "/etc/shadow", "../../etc/passwd", "/", "", "x" * 5000,
             "missing.safetensors", "a/../../b.safetensors", "/dev/zero", "weights.pt"]
    refused = 0
    leaks = 0
    for path in paths:
        response = client.update_weights(path)
        refused += not response.success
        leaks += "/proc/" in response.message.replace(path, "") or "root:" in response.message
    after = client.run_goal(timeout=60.0)
    check("hostile weight paths: all refused, nothing revealed", refused == len(paths) and leaks == 0,
          f"{refused}/{len(paths)} refused, {leaks} leaks")
    check("hostile weight paths: the node serves after", after.status == SUCCEEDED)
    return {"paths": len(paths), "refused": refused, "leaks": leaks}


def engine_faults(client: Any, check: Checks) -> dict[str, Any]:
    expected = {"engine_exception": ErrorCode.ENGINE_FAILURE, "out_of_memory": ErrorCode.OUT_OF_MEMORY,
                "nan_candidates": ErrorCode.TOO_FEW_VALID_CANDIDATES}
    seen = {}
    for fault, code in expected.items():
        assert client.set_parameter("fault_injection", fault).successful
        outcome = client.run_goal(timeout=60.0)
        after = client.run_goal(timeout=60.0)
        seen[fault] = ErrorCode(goal_code(outcome)).name
        check(f"fault {fault}: aborted {code.name}, next goal succeeds",
              goal_code(outcome) == code and after.status == SUCCEEDED, seen[fault])
    return seen


def oversized_instruction(client: Any, check: Checks) -> dict[str, Any]:
    sent = time.monotonic()
    outcome = client.run_goal(timeout=60.0, instruction="x" * 1_000_000)
    seconds = time.monotonic() - sent
    after = client.run_goal(timeout=60.0)
    check("1 MB instruction refused within 1 s", goal_code(outcome) == ErrorCode.INSTRUCTION_TOO_LONG and seconds < 1,
          f"{seconds:.2f} s")
    check("1 MB instruction: the next goal succeeds", after.status == SUCCEEDED)
    return {"refused_in_s": round(seconds, 3), "code": ErrorCode(goal_code(outcome)).name}


def sigterm_during_goal(node: Any, client: Any, check: Checks) -> dict[str, Any]:
    outcome = client.send_goal(timeout=60.0, candidate_count=8)
    node.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    while node.proc.poll() is None and time.monotonic() - sent < 30.0:
        time.sleep(0.02)
    seconds = time.monotonic() - sent
    check("SIGTERM during a goal: process gone within 5 s", node.proc.poll() is not None and seconds < 5.0,
          f"{seconds:.2f} s")
    try:
        status = client.result(outcome, timeout=5.0).status
    except TimeoutError:
        status = -1
    return {"exit_s": round(seconds, 2), "exit_code": node.proc.returncode, "goal_status": status}


def burst(tmp: Path, domain_id: int, policy: str, count: int, check: Checks) -> dict[str, Any]:
    gen = serve_node(tmp / f"burst_{policy}", domain_id, {**SOAK_PARAMS, "goal_policy": policy})
    (tmp / f"burst_{policy}").mkdir(exist_ok=True)
    node, client = next(gen)
    try:
        ensure_observation(client, 1)
        report = fire_burst(client, count, answer_timeout_s=60.0, terminal_timeout_s=60.0)
        after_ok = ensure_observation(client, 100)
    finally:
        gen.close()
    check(f"burst {policy}: {count}/{count} answered", report.unanswered == 0, report.as_dict())
    check(f"burst {policy}: every accepted goal terminal within 60 s", report.terminal == report.accepted)
    check(f"burst {policy}: the node serves after", after_ok)
    return report.as_dict()


def write_doc(path: Path, figures: dict[str, Any]) -> None:
    s, b = figures["soak"], figures["bursts"]
    lines = [
        "# Reliability: latest soak figures",
        "",
        f"`make soak` (`tests/reliability/soak.py`), {figures['date']}, commit `{figures['commit']}`, "
        f"{figures['machine']}; {figures['seconds']:.0f} s in all. Raw figures: `bench/results/soak.json`.",
        "",
        "**Method.** The node runs as a subprocess (the random `tiny` model, 1 step, 2 candidates, CPU) and is "
        "driven over real DDS on loopback by a test client, as `tests/reliability` does; every loop is bounded "
        f"in goals and seconds. `make soak` is meant to take under 20 minutes; this run took "
        f"{figures['seconds'] / 60:.1f} minutes, {s['seconds']:.0f} s of it in the {s['goals']} goals "
        f"({s['seconds'] / s['goals']:.2f} s per goal).",
        "",
        "| check | figure |",
        "| --- | --- |",
        f"| {s['goals']} goals ({s['seconds']:.0f} s), RSS growth after goal {s['warmup_goals']}: median of the "
        f"last {s['rss_window_goals']} goals against the first {s['rss_window_goals']} (RSS every {RSS_EVERY} goals) | "
        f"{s['rss_growth_pct']:+.2f} % ({s['rss_median_mb_first']} -> {s['rss_median_mb_last']} MB); RSS in MB by "
        f"goal: {s['rss_mb_by_goal']} |",
    ]
    for policy, r in b.items():
        lines.append(f"| burst of {r['sent']} goals, `{policy}` | {r['accepted']} accepted + {r['rejected']} rejected, "
                     f"{r['unanswered']} unanswered; all answered in {r['answer_s']:.1f} s, {r['terminal']} terminal "
                     f"in {r['terminal_s']:.1f} s |")
    lines += [
        f"| cancel storm | {figures['cancel_storm']} |",
        f"| clients killed mid-goal | {figures['killed_clients']} |",
        f"| frame flood | {figures['frame_flood']} |",
        f"| hostile weight paths | {figures['hostile_weights']} |",
        f"| engine faults | {figures['engine_faults']} |",
        f"| 1 MB instruction | {figures['oversized_instruction']} |",
        f"| SIGTERM during a goal | {figures['sigterm']} |",
        "",
        f"**Checks:** {sum(figures['checks'].values())} of {len(figures['checks'])} passed"
        + ("" if all(figures["checks"].values()) else
           "; failed: " + ", ".join(k for k, v in figures["checks"].items() if not v)) + ".",
        "",
        "A burst needs deep queues at both ends: the node's goal/cancel/result queues are "
        "`ros/guards.py:ACTION_SERVICE_QOS` (KEEP_LAST 1000); a client that fires hundreds of goals at once "
        "must give its own `ActionClient` the same, because with rclpy's default (KEEP_LAST 10) its own request "
        "writer drops requests before the node can see them.",
        "",
    ]
    path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--goals", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "soak.json")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "reliability.md")
    parser.add_argument("--doc-only", action="store_true", help="rewrite --doc from --json without running")
    args = parser.parse_args()
    if args.doc_only:
        write_doc(args.doc, json.loads(args.json.read_text()))
        return 0
    domain_id = pick_domain_id(environ={})
    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    check = Checks()
    started = time.monotonic()
    figures: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip(),
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start",
    }
    with tempfile.TemporaryDirectory(prefix="soak_") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "main").mkdir()
        (tmp / "main" / "weights").mkdir()
        (tmp / "main" / "weights" / "weights.pt").write_bytes(b"x")
        gen = serve_node(tmp / "main", domain_id, {**SOAK_PARAMS, "enable_weight_updates": True,
                                                   "weights_dir": str(tmp / "main" / "weights")})
        node, client = next(gen)
        try:
            print("soak: goals", flush=True)
            figures["soak"] = soak_goals(node, client, args.goals, args.warmup, check)
            print("soak: cancel storm", flush=True)
            figures["cancel_storm"] = cancel_storm(client, 50, check)
            print("soak: killed clients", flush=True)
            figures["killed_clients"] = killed_clients(client, 5, domain_id, check)
            print("soak: frame flood", flush=True)
            figures["frame_flood"] = frame_flood(node, client, 1500, check)
            print("soak: hostile weight paths", flush=True)
            figures["hostile_weights"] = hostile_weights(node, client, check)
            print("soak: engine faults", flush=True)
            figures["engine_faults"] = engine_faults(client, check)
            print("soak: 1 MB instruction", flush=True)
            figures["oversized_instruction"] = oversized_instruction(client, check)
            print("soak: SIGTERM during a goal", flush=True)
            figures["sigterm"] = sigterm_during_goal(node, client, check)
        finally:
            gen.close()
        figures["bursts"] = {}
        for policy in ("preempt", "queue", "reject"):
            print(f"soak: burst {policy}", flush=True)
            figures["bursts"][policy] = burst(tmp, domain_id, policy, args.burst, check)
    figures["seconds"] = round(time.monotonic() - started, 1)
    figures["checks"] = check.results
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n")
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    write_doc(args.doc, figures)
    print(f"soak: {sum(check.results.values())}/{len(check.results)} checks passed in {figures['seconds']:.0f} s; "
          f"{args.json}, {args.doc}", flush=True)
    return 0 if all(check.results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
