"""Quick checks of toy policies on validation scenes, to choose between training runs without the held-out scenes.

Validation scenes use training-range seeds from :data:`VALIDATION_SEED_BASE` on: above every ``train-toy --scenes``
run, below :data:`task.HELDOUT_SEED_BASE`. The reported benches (``bench --quality``, ``bench --closed-loop``) use
held-out seeds only, so a choice made here is never tuned on them.

- **open loop**: N candidates per scene through the serving path; collisions of candidate 0, of all candidates, of
  ``mode`` and ``mean``, the share of scenes with candidates on both sides, and ``mode``'s final error;
- **closed loop**: the in-process bench's episodes (:func:`.closed_loop.run_episode`) for some methods and delays.

``python -m trajectory_ensemble_lab.toy.validation DIR [DIR ...] --json out/validation.json`` compares pipelines.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.reducers import get_reducer
from trajectory_ensemble_node.toy import load_toy_pipeline, task
from trajectory_ensemble_node.toy.episodes import summarize
from .closed_loop import Drawer, method_table, run_episode
from .quality import _draw
from ..records import write_json

VALIDATION_SEED_BASE = 500_000
"""First validation scene seed: in the training range, never reached by ``train-toy --scenes``."""
OPEN_SEED_BASE = 40_000_000
"""Candidate base seed of open-loop validation scene ``i``: ``OPEN_SEED_BASE + i``."""
CLOSED_SEED_BASE = 50_000_000
"""Candidate base seed of closed-loop validation scene ``i``, chunk ``c``: ``CLOSED_SEED_BASE + 1000 i + c``."""


def validation_scenes(count: int, offset: int = 0) -> list[task.Scene]:
    """``count`` validation scenes, seeds ``VALIDATION_SEED_BASE + offset + i``."""
    return [task.make_scene(VALIDATION_SEED_BASE + offset + i) for i in range(count)]


def open_loop(model: Any, scenes: Sequence[task.Scene], count: int = 8,
              steps: int = task.NUM_INFERENCE_STEPS) -> dict[str, float]:
    """Open-loop collision rates of ``count`` candidates per scene (see the module docstring)."""
    candidates = _draw(model, [(scene, count, OPEN_SEED_BASE + i) for i, scene in enumerate(scenes)], steps)
    single = every = both = 0
    reduced = {"mode": 0, "mean": 0}
    error = []
    for scene, group in zip(scenes, candidates, strict=True):
        chunks = group.numpy().astype(np.float64)
        hits = [task.collides(scene, c) for c in chunks]
        single += hits[0]
        every += sum(hits)
        both += len({task.side(scene, c) for c in chunks}) == 2
        for name in reduced:
            chunk = get_reducer(name)(group).numpy().astype(np.float64)
            reduced[name] += task.collides(scene, chunk)
            if name == "mode":
                error.append(task.final_error(scene, chunk))
    n = len(scenes)
    return {"scenes": n, "count": count, "single": single / n, "candidates": every / (n * count),
            "mode": reduced["mode"] / n, "mean": reduced["mean"] / n, "both_sides": both / n,
            "mode_final_error": float(np.mean(error))}


def closed_loop(model: Any, scenes: Sequence[task.Scene], methods: Sequence[str],
                delays: Sequence[int]) -> dict[str, dict[str, dict[str, Any]]]:
    """The in-process bench's metrics per method and delay on ``scenes``."""
    draw = Drawer(model, task.NUM_INFERENCE_STEPS)
    table = method_table()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name in methods:
        out[name] = {}
        for delay in delays:
            episodes = [run_episode(draw, scene, table[name], delay, CLOSED_SEED_BASE + 1000 * i)
                        for i, scene in enumerate(scenes)]
            summary = summarize(episodes)
            out[name][str(delay)] = {k: summary[k] for k in ("success_rate", "collision_rate",
                                                             "mode_flips_per_episode", "seam_jump_mean")}
            out[name][str(delay)]["stalled"] = sum(not e.reached and not e.collided for e in episodes) / len(episodes)
    return out


def validate(pipeline: Path, *, open_scenes: int, closed_scenes: int, methods: Sequence[str],
             delays: Sequence[int], flow_shift: float | None = None, steps: int = task.NUM_INFERENCE_STEPS,
             log=print) -> dict[str, Any]:
    """Both checks for one pipeline directory (``flow_shift``: serve it with another schedule shift)."""
    pipe = load_toy_pipeline(path=pipeline)
    if flow_shift is not None:
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, flow_shift=flow_shift)
    model = Cosmos3ActionModel(pipe, max_batch_candidates=64)
    started = time.perf_counter()
    result: dict[str, Any] = {"pipeline": str(pipeline), "flow_shift": pipe.scheduler.config.flow_shift,
                              "steps": steps}
    if open_scenes:
        result["open_loop"] = open_loop(model, validation_scenes(open_scenes), steps=steps)
        log(f"{pipeline} open loop: {json.dumps(result['open_loop'])} ({time.perf_counter() - started:.0f} s)")
    if closed_scenes:
        result["closed_loop"] = closed_loop(model, validation_scenes(closed_scenes), methods, delays)
        log(f"{pipeline} closed loop: {json.dumps(result['closed_loop'])} ({time.perf_counter() - started:.0f} s)")
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.toy.validation", description=__doc__)
    parser.add_argument("pipelines", type=Path, nargs="+", help="toy pipeline directories")
    parser.add_argument("--open-scenes", type=int, default=96, help="open-loop validation scenes (0 = none)")
    parser.add_argument("--closed-scenes", type=int, default=24, help="closed-loop validation scenes (0 = none)")
    parser.add_argument("--methods", type=str, default="guided_mode,naive_async,sync")
    parser.add_argument("--delays", type=str, default="2")
    parser.add_argument("--flow-shift", type=float, default=None,
                        help="serve with this scheduler shift instead of the pipeline's own")
    parser.add_argument("--steps", type=int, default=task.NUM_INFERENCE_STEPS, help="denoising steps (open loop)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="append the results to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m]
    delays = [int(d) for d in args.delays.split(",") if d]
    results = [validate(p, open_scenes=args.open_scenes, closed_scenes=args.closed_scenes, methods=methods,
                        delays=delays, flow_shift=args.flow_shift, steps=args.steps, log=lambda m: print(m, flush=True))
               for p in args.pipelines]
    if args.json is not None:
        previous = json.loads(args.json.read_text()) if args.json.exists() else []
        stamp = {"date": utc_now(), "commit": git_commit()}
        write_json(args.json, previous + [{**stamp, **r} for r in results])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
