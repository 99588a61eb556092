"""``trajectory-ensemble bench-steps``: what fewer denoising steps cost on the toy task (the price of a deadline).

A deadline makes the engine plan fewer denoising steps (``engine/deadline.py``); the re-scheduled group runs exactly
the schedule of a request for that many steps. So for each step count k (default 2, 4, 6, 10) this draws N = 8
candidates per held-out scene through ``Cosmos3ActionModel.generate(num_inference_steps=k)`` (candidate base seed
``base_seed + i`` for scene i, the same at every k) and scores ``single`` (candidate 0) and ``mode`` on the same
candidates: collision rate (Wilson 95%) and mean final error of the reduced chunk.

Then it serves ``--deadline-goals`` goals at the full step count with a deadline of half the measured normal goal
time and reports how many finished in time, their p50/p95 engine time, and the steps they used.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine.deadline import StepsReport
from trajectory_ensemble_node.metrics import GroupCounters
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.reducers import get_reducer
from trajectory_ensemble_node.toy import load_toy_pipeline, request_kwargs, task
from trajectory_ensemble_node.stats import wilson
from ..records import write_json

DEFAULT_JSON = Path("bench/results/steps-toy.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenes", type=int, default=50, help="held-out scenes")
    parser.add_argument("--scene-seed", type=int, default=0, help="first held-out scene offset")
    parser.add_argument("--steps", type=str, default="2,4,6,10", help="denoising step counts")
    parser.add_argument("--count", type=int, default=8, help="candidates per scene")
    parser.add_argument("--base-seed", type=int, default=0, help="candidate base seed of scene 0")
    parser.add_argument("--deadline-goals", type=int, default=20, help="goals served with half-time deadlines")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="JSON output (markdown beside it)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--scene-batch", type=int, default=4, help="scenes submitted together (throughput only)")


def _draw(model: Any, scenes: Sequence[task.Scene], steps: int, count: int, base_seed: int,
          batch: int) -> list[torch.Tensor]:
    spec = CandidateTrajectorySpec(count=count, reducer="mean", return_candidates=True)
    out = []
    for first in range(0, len(scenes), batch):
        handles = []
        for j, scene in enumerate(scenes[first:first + batch]):
            kwargs = request_kwargs(task.render(scene))
            kwargs["num_inference_steps"] = steps
            handles.append(model.submit(**kwargs, spec=spec, base_seed=base_seed + first + j))
        model.run_until_idle()
        out += [handle.result().candidates for handle in handles]
    return out


def _deadline_goals(model: Any, scenes: Sequence[task.Scene], count: int, goals: int) -> dict[str, Any]:
    """Serve goals one at a time: first without a deadline (the normal time), then with half of it."""
    spec = CandidateTrajectorySpec(count=count, reducer="mode")
    images = [task.render(scenes[i % len(scenes)]) for i in range(goals)]
    normal = [model.generate(**request_kwargs(im), spec=spec, base_seed=i).report(GroupCounters).total_ms
              for i, im in enumerate(images[: max(3, goals // 4)])]
    deadline_s = float(np.median(normal)) / 2000.0
    results = [model.generate(**request_kwargs(im), spec=spec, base_seed=i, deadline_s=deadline_s)
               for i, im in enumerate(images)]
    steps = [r.report(StepsReport) for r in results]
    totals = np.array([r.report(GroupCounters).total_ms for r in results])
    return {
        "normal_goal_ms_median": float(np.median(normal)),
        "deadline_ms": 1000.0 * deadline_s,
        "goals": goals,
        "met": int(sum(bool(s.deadline_met) for s in steps)),
        "total_ms_p50": float(np.percentile(totals, 50)),
        "total_ms_p95": float(np.percentile(totals, 95)),
        "steps_planned": steps[0].planned,
        "steps_fitted": sorted({int(s.fitted) for s in steps}),
        "steps_used": sorted({int(s.used) for s in steps}),
        "steps_used_mean": float(np.mean([s.used for s in steps])),
    }


def run(args: argparse.Namespace) -> int:
    commit = git_commit()  # the code that runs is the code checked out now, not at the end of a long run
    torch.set_num_threads(args.threads)
    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel

    model = Cosmos3ActionModel(load_toy_pipeline(), max_batch_candidates=128)
    scenes = task.heldout_scenes(args.scenes, seed=args.scene_seed)
    step_counts = [int(s) for s in args.steps.split(",") if s]
    mode = get_reducer("mode")
    table: dict[str, dict[str, Any]] = {"single": {}, "mode": {}}
    started = time.perf_counter()
    for steps in step_counts:
        drawn = _draw(model, scenes, steps, args.count, args.base_seed, max(1, args.scene_batch))
        for name, pick in (("single", lambda c: c[0]), ("mode", mode)):
            chunks = [pick(c).numpy().astype(np.float64) for c in drawn]
            hits = [bool(task.collides(s, c)) for s, c in zip(scenes, chunks)]
            table[name][str(steps)] = {
                "collision_rate": sum(hits) / len(hits),
                "collision_rate_ci95": list(wilson(sum(hits), len(hits))),
                "collisions": sum(hits),
                "final_error": float(np.mean([task.final_error(s, c) for s, c in zip(scenes, chunks)])),
                "scenes": len(hits),
            }
        print(f"steps {steps}: single {table['single'][str(steps)]['collision_rate']:.2f}, mode "
              f"{table['mode'][str(steps)]['collision_rate']:.2f} ({time.perf_counter() - started:.0f} s)", flush=True)
    deadlines = _deadline_goals(model, scenes, args.count, args.deadline_goals) if args.deadline_goals else None
    result = {
        "steps": table,
        "deadline": deadlines,
        "settings": {
            "date": utc_now(),
            "commit": commit,
            "scenes": args.scenes,
            "scene_seeds": [scenes[0].seed, scenes[-1].seed],
            "count": args.count,
            "base_seed": args.base_seed,
            "step_counts": step_counts,
            "threads": args.threads,
            "seconds": round(time.perf_counter() - started, 1),
        },
    }
    out: Path = args.json
    write_json(out, result)
    out.with_suffix(".md").write_text(markdown(result))
    print(out.with_suffix(".md").read_text())
    return 0


def markdown(result: dict[str, Any]) -> str:
    s, table = result["settings"], result["steps"]
    counts = s["step_counts"]
    lines = [
        f"# Collision rate against denoising steps, toy task ({s['date']}, commit {s['commit']})",
        "",
        f"{s['scenes']} held-out scenes (seeds {s['scene_seeds']}), N = {s['count']} candidates drawn once per step "
        "count (same seeds), `single` = candidate 0, `mode` = the mode reducer on the same candidates. "
        "Collision rate with Wilson 95% interval; lower is better.",
        "",
        "| reducer | " + " | ".join(f"{k} steps" for k in counts) + " |",
        "|---|" + "---|" * len(counts),
    ]
    for name in ("single", "mode"):
        cells = []
        for k in counts:
            e = table[name][str(k)]
            cells.append(f"{100 * e['collision_rate']:.0f}% [{100 * e['collision_rate_ci95'][0]:.0f}, "
                         f"{100 * e['collision_rate_ci95'][1]:.0f}]")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Final error (mean, normalized units):", "",
              "| reducer | " + " | ".join(f"{k} steps" for k in counts) + " |", "|---|" + "---|" * len(counts)]
    for name in ("single", "mode"):
        lines.append(f"| {name} | " + " | ".join(f"{table[name][str(k)]['final_error']:.3f}" for k in counts) + " |")
    d = result.get("deadline")
    if d:
        lines += ["", f"Deadline = half the normal goal time ({d['deadline_ms']:.0f} ms of "
                      f"{d['normal_goal_ms_median']:.0f} ms, `mode`, N = {s['count']}, one goal at a time): "
                      f"{d['met']}/{d['goals']} met; engine time p50 {d['total_ms_p50']:.0f} ms, p95 "
                      f"{d['total_ms_p95']:.0f} ms; steps planned {d['steps_planned']}, fitted "
                      f"{d['steps_fitted']}, used {d['steps_used']} (mean {d['steps_used_mean']:.1f})."]
    return "\n".join(lines) + "\n"
