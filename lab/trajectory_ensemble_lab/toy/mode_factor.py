"""How ``mode``'s relative cut was chosen (issue 60): collisions of every factor on toy scenes no results file uses.

For each scene (``task.heldout_scenes(count, seed=--scene-offset)``: offsets 10000.. by default, which no
``bench/results`` file reaches), N = ``max(--ns)`` candidates are drawn ONCE through the serving path (base seed
``--base-seed + i``); a smaller N is the first N of them (candidate ``i``'s seed does not depend on N). Every cut is
applied to the same candidates: one sample (candidate 0), ``mean``, ``mode`` at a fixed 0.2 (the former default), and
``mode`` at ``factor`` times the group's scale (:func:`~trajectory_ensemble_node.reducers.relative_mode_threshold`)
for each ``--factors`` (the whole cluster's mean, one scale), and ``mode`` with its core
(:func:`~trajectory_ensemble_node.reducers.mode_core`) at each ``--core-fractions``. Collision rate (Wilson 95 %)
and mean final error per (cut, N).

``python -m trajectory_ensemble_lab.toy.mode_factor --scenes 200 --json bench/results/mode_factor-toy.json``;
``--candidates FILE`` reads (or, when absent, writes) the drawn groups, so the evaluation can be rerun alone.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.reducers import MODE_DISTANCE_THRESHOLD, mode_reduce, relative_mode_threshold
from trajectory_ensemble_node.stats import wilson
from trajectory_ensemble_node.toy import task
from ..records import write_json

DEFAULT_FACTORS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5)


def draw(scenes: Sequence[task.Scene], count: int, base_seed: int, scene_batch: int = 4) -> list[torch.Tensor]:
    """``count`` candidates per scene (``[count, H, 2]``, normalized), scene ``i`` at base seed ``base_seed + i``."""
    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
    from trajectory_ensemble_node.toy import load_toy_pipeline
    from .quality import _draw

    model = Cosmos3ActionModel(load_toy_pipeline(), max_batch_candidates=128)
    groups: list[torch.Tensor] = []
    for first in range(0, len(scenes), scene_batch):
        batch = range(first, min(first + scene_batch, len(scenes)))
        groups += [c.clone() for c in _draw(model, [(scenes[i], count, base_seed + i) for i in batch],
                                             task.NUM_INFERENCE_STEPS)]
        print(f"drawn {len(groups)}/{len(scenes)}", flush=True)
    return groups


def cuts(factors: Sequence[float], core_fractions: Sequence[float] = ()) -> dict[str, Any]:
    """``{label: fn([N, H, D] float64) -> [H, D]}``."""
    table: dict[str, Any] = {"single": lambda c: c[0], "mean": lambda c: c.mean(dim=0),
                             f"fixed {MODE_DISTANCE_THRESHOLD:g}": lambda c: mode_reduce(c, MODE_DISTANCE_THRESHOLD)}
    for factor in factors:
        table[f"{factor:g}x"] = (lambda f: lambda c: mode_reduce(c, relative_mode_threshold(c, f)))(factor)
    for fraction in core_fractions:
        table[f"core {fraction:g}"] = (lambda f: lambda c: mode_reduce(c, core_fraction=f))(fraction)
    return table


def evaluate(scenes: Sequence[task.Scene], groups: Sequence[torch.Tensor], ns: Sequence[int],
             factors: Sequence[float], core_fractions: Sequence[float] = ()) -> dict[str, dict[str, dict[str, Any]]]:
    """``{cut: {str(N): {"collision_rate", "collision_rate_ci95", "collisions", "final_error", "scenes"}}}``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for label, fn in cuts(factors, core_fractions).items():
        out[label] = {}
        for n in ns:
            chunks = [fn(group[:n].to(torch.float64)).numpy() for group in groups]
            hits = sum(bool(task.collides(s, c)) for s, c in zip(scenes, chunks))
            errors = [task.final_error(s, c) for s, c in zip(scenes, chunks)]
            out[label][str(n)] = {"collision_rate": hits / len(scenes), "collisions": hits, "scenes": len(scenes),
                                  "collision_rate_ci95": list(wilson(hits, len(scenes))),
                                  "final_error": float(np.mean(errors))}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.toy.mode_factor", description=__doc__)
    parser.add_argument("--scenes", type=int, default=200)
    parser.add_argument("--scene-offset", type=int, default=10_000, help="first scene offset (held-out seed base +)")
    parser.add_argument("--base-seed", type=int, default=10_000, help="candidate base seed of scene 0")
    parser.add_argument("--ns", default="2,4,8,10")
    parser.add_argument("--factors", default=",".join(f"{f:g}" for f in DEFAULT_FACTORS))
    parser.add_argument("--core-fractions", default="", help="mode with its core at these radius fractions")
    parser.add_argument("--candidates", type=Path, default=None, help="drawn groups: read if present, else written")
    parser.add_argument("--json", type=Path, default=Path("bench/results/mode_factor-toy.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    ns = [int(n) for n in args.ns.split(",")]
    factors = [float(f) for f in args.factors.split(",")]
    core_fractions = [float(f) for f in args.core_fractions.split(",") if f]
    commit, date = git_commit(), utc_now()
    scenes = task.heldout_scenes(args.scenes, seed=args.scene_offset)
    if args.candidates is not None and args.candidates.exists():
        stored = torch.load(args.candidates)
        if [seed for seed, _ in stored[: args.scenes]] != [s.seed for s in scenes]:
            raise SystemExit(f"error: {args.candidates} holds other scenes than offsets {args.scene_offset}..")
        groups = [group for _, group in stored[: args.scenes]]
    else:
        groups = draw(scenes, max(ns), args.base_seed)
        if args.candidates is not None:
            torch.save([(s.seed, g) for s, g in zip(scenes, groups)], args.candidates)
    result = {"quality": evaluate(scenes, groups, ns, factors, core_fractions),
              "settings": {"date": date, "commit": commit, "scenes": args.scenes,
                           "scene_seeds": [scenes[0].seed, scenes[-1].seed], "base_seed": args.base_seed, "ns": ns,
                           "drawn": max(ns), "factors": factors, "core_fractions": core_fractions, "num_inference_steps": task.NUM_INFERENCE_STEPS,
                           "candidates": str(args.candidates) if args.candidates else None,
                           "pipeline": "shipped toy_policy"}}
    write_json(args.json, result)
    for label, per_n in result["quality"].items():
        print(f"{label:>10} " + "  ".join(f"N={n} {v['collision_rate']:.3f}" for n, v in per_n.items()))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
