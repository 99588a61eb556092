"""``trajectory-ensemble bench --warmup``: the first goal after start-up against the steady median, warm and cold.

For each variant (``warm``: the node's default ``warmup_counts``; ``cold``: ``[-1]``, no warm-up) and each repetition
a fresh node serves the bundled toy policy over DDS: this process publishes a camera frame at 4 Hz and sends, once
the node is ready, one goal (8 candidates, fixed seed), then :data:`STEADY_GOALS` more. The figure is the first
goal's time over the median of the steady ones, both as the client sees them (goal sent to result received) and as
the node reports them (``goal_ms``). The variants alternate, so the host's load falls on both alike. Target: the warm
first goal at most :data:`TARGET_RATIO` of the steady median.

Writes ``--json`` (default ``bench/results/warmup-toy.json``) and a markdown table beside it, with date and commit.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from trajectory_ensemble_node.provenance import git_commit, utc_now

from .ros_overhead import _Client, _metrics
from ..records import write_json

DEFAULT_JSON = Path("bench/results/warmup-toy.json")
STEADY_GOALS = 10
REPS = 3
TARGET_RATIO = 1.3
VARIANTS = {"warm": None, "cold": [-1]}
"""``warmup_counts`` of each variant (``None``: the node's default)."""


def _goal_ms(client: _Client, seed: int) -> tuple[float, float]:
    from action_msgs.msg import GoalStatus

    started = time.perf_counter()
    response = client.result(client.send(client.goal(seed=seed)))
    latency = (time.perf_counter() - started) * 1e3
    if response.status != GoalStatus.STATUS_SUCCEEDED:
        raise RuntimeError(f"goal {seed} ended with status {response.status}: {response.result.error_message}")
    return latency, _metrics(response.result)["goal_ms"]


def one_run(variant: str, log_dir: Path, device: str) -> dict[str, Any]:
    """Start a node of ``variant``, time its first goal and :data:`STEADY_GOALS` more, stop it."""
    from trajectory_ensemble_node.cli.launcher import NodeProcess, pick_domain_id, ros_env

    domain_id = pick_domain_id()
    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    params: dict[str, Any] = {"model": "toy", "device": device}
    if VARIANTS[variant] is not None:
        params["warmup_counts"] = VARIANTS[variant]
    node = NodeProcess(params, ros_env(domain_id), log_path=log_dir / f"warmup-{variant}.node.log")
    started = time.monotonic()
    node.start(ready_timeout_s=600)
    ready_s = time.monotonic() - started
    client = _Client()
    try:
        if not client.client.wait_for_server(timeout_sec=30):
            raise RuntimeError("no action server")
        client.spin_until(lambda: False, 1.0)  # frames reach the node before the first goal
        first = _goal_ms(client, seed=0)
        steady = [_goal_ms(client, seed=i + 1) for i in range(STEADY_GOALS)]
    finally:
        client.close()
        node.stop()
    client_median = statistics.median(s[0] for s in steady)
    node_median = statistics.median(s[1] for s in steady)
    return {"variant": variant, "ready_s": ready_s, "first_client_ms": first[0], "first_goal_ms": first[1],
            "steady_client_ms": [s[0] for s in steady], "steady_goal_ms": [s[1] for s in steady],
            "ratio_client": first[0] / client_median, "ratio_goal_ms": first[1] / node_median}


def _table(doc: dict[str, Any]) -> str:
    lines = [f"# First goal after start-up, warm and cold ({doc['settings']['date']}, commit "
             f"{doc['settings']['commit']})", "",
             "Toy policy over DDS, 8 candidates, 10 steps, CPU. Ratio = first goal over the median of the next "
             f"{STEADY_GOALS} (medians over {doc['settings']['reps']} fresh nodes each).", "",
             "| variant | first / steady (client) | first / steady (node goal_ms) | first goal ms | steady median ms | "
             "start-up to ready s |", "|---|--:|--:|--:|--:|--:|"]
    for name, row in doc["summary"].items():
        lines.append(f"| {name} | {row['ratio_client']:.2f} | {row['ratio_goal_ms']:.2f} | {row['first_client_ms']:.0f} "
                     f"| {row['steady_client_ms']:.0f} | {row['ready_s']:.1f} |")
    lines += ["", f"Target: warm first goal <= {TARGET_RATIO}x the steady median (client view): "
                  f"{'met' if doc['target_met'] else 'not met'}."]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    """Measure both variants ``REPS`` times, alternating; write the JSON and the table."""
    json_path = Path(getattr(args, "json", None) or DEFAULT_JSON)
    device = str(getattr(args, "device", None) or "cpu")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    log_dir = Path("out/bench")
    log_dir.mkdir(parents=True, exist_ok=True)
    date, commit, wall0 = utc_now(), git_commit(), time.monotonic()
    runs: list[dict[str, Any]] = []
    for rep in range(REPS):
        for variant in (VARIANTS if rep % 2 == 0 else reversed(list(VARIANTS))):
            row = one_run(variant, log_dir, device)
            runs.append(row)
            print(f"{variant} #{rep + 1}: first {row['first_client_ms']:.0f} ms, ratio {row['ratio_client']:.2f} "
                  f"(node {row['ratio_goal_ms']:.2f})", file=sys.stderr, flush=True)
    summary = {}
    for variant in VARIANTS:
        rows = [r for r in runs if r["variant"] == variant]
        summary[variant] = {key: statistics.median(r[key] for r in rows)
                            for key in ("ratio_client", "ratio_goal_ms", "first_client_ms", "ready_s")}
        summary[variant]["steady_client_ms"] = statistics.median(
            statistics.median(r["steady_client_ms"]) for r in rows)
    doc = {"warmup": summary, "summary": summary, "runs": runs,
           "target_ratio": TARGET_RATIO, "target_met": summary["warm"]["ratio_client"] <= TARGET_RATIO,
           "settings": {"date": date, "commit": commit, "reps": REPS, "steady_goals": STEADY_GOALS, "device": device,
                        "model": "toy", "wall_s": round(time.monotonic() - wall0, 1),
                        "load_avg_1m_end": os.getloadavg()[0]}}
    write_json(json_path, doc)
    json_path.with_suffix(".md").write_text(_table(doc))
    print(_table(doc))
    return 0
