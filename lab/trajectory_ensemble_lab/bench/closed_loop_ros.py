"""``trajectory-ensemble bench --closed-loop --ros``: the toy closed loop through the real node and the simulated robot.

Every scene runs once per execution setting (:data:`BENCH_RUNS`) through one serving node on sim time
(:func:`trajectory_ensemble_node.demo.sim_report.simulate`, the same episodes ``make demo`` runs), and the JSON
carries the in-process bench's metric keys per setting.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.demo.sim_model import EpisodeRecord, SimSettings
from trajectory_ensemble_node.demo.sim_report import BENCH_RTF, finite, serving_node, simulate, summary
from trajectory_ensemble_node.toy import task
from ..records import write_json

DEFAULT_JSON = Path("bench/results/closed_loop-ros-toy.json")

BENCH_RUNS: dict[str, dict[str, Any]] = {
    "continue": {"execute": 4, "continue_previous": True},
    "naive": {"execute": 4, "continue_previous": False},
    "sync": {"execute": None, "continue_previous": False},
}
"""Execution settings of ``bench --closed-loop --ros``: s = 4 with and without continuity, and synchronous."""


def run(args: argparse.Namespace) -> int:
    """``bench --closed-loop --ros``: episodes through the node per execution setting; JSON with the in-process
    bench's metric keys per setting (``closed_loop``), settings, and the episode records."""
    scenes = task.heldout_scenes(int(getattr(args, "scenes", 3) or 3), seed=int(getattr(args, "scene_seed", 0) or 0))
    names = [m for m in str(getattr(args, "methods", None) or ",".join(BENCH_RUNS)).split(",") if m.strip()]
    unknown = [m for m in names if m not in BENCH_RUNS]
    if unknown:
        raise SystemExit(f"error: --closed-loop --ros runs {list(BENCH_RUNS)}, got unknown {unknown}")
    out: Path = getattr(args, "json", None) or DEFAULT_JSON
    out.parent.mkdir(parents=True, exist_ok=True)
    base = SimSettings(real_time_factor=BENCH_RTF)
    log = (lambda m: None) if getattr(args, "quiet", False) else (lambda m: print(m, flush=True))
    started, commit, wall0 = utc_now(), git_commit(), time.monotonic()
    results: dict[str, list[EpisodeRecord]] = {}
    with serving_node(base, Path("out/bench/closed_loop-ros"), device=str(getattr(args, "device", None) or "cpu"),
                      log=log):
        for name in names:
            settings = replace(base, **BENCH_RUNS[name])
            results[name] = simulate(scenes, settings, log=log)
            document = {
                "closed_loop_ros": {n: summary(r) for n, r in results.items()},
                "settings": {"date": started, "commit": commit, "scenes": len(scenes),
                             "scene_seeds": [scenes[0].seed, scenes[-1].seed], "real_time_factor": BENCH_RTF,
                             "runs": {n: {**asdict(replace(base, **BENCH_RUNS[n])), "mode": replace(
                                 base, **BENCH_RUNS[n]).mode} for n in results},
                             "wall_s": round(time.monotonic() - wall0, 1)},
                "episodes": {n: [e.to_json() for e in r] for n, r in results.items()},
            }
            write_json(out, finite(document))
    log(f"wrote {out}")
    for name, records in results.items():
        s = summary(records)
        log(f"{name:>9}: success {s['success_rate']:.2f}, collisions {s['collision_rate']:.2f}, seam "
            f"{s['seam_jump_mean']:.3f} (node {s['seam_jump_node_mean']}), flips {s['mode_flips_per_episode']:.2f}, "
            f"jerk {s['jerk']:.0f}, latency {s['latency_steps_mean']} steps")
    return 0
