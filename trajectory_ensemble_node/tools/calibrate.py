"""``trajectory-ensemble calibrate``: a conformal threshold on the uncertainty score, tested on shifted scenes.

Procedure (fixed seeds; every score comes from the real serving path, ``Cosmos3ActionModel.generate``, whose
engine computes ``uncertainty_score`` from the candidates in normalized space, see
:mod:`trajectory_ensemble_node.uncertainty`):

1. **Calibrate** on K in-distribution scenes (seeds ``CALIBRATION_SEED_BASE + S + i``): threshold = the
   ``ceil((1 - alpha)(K + 1))``-th smallest score, i.e. the ``(1 - alpha)(1 + 1/K)`` empirical quantile (split
   conformal; +inf when that rank exceeds K). For a new exchangeable in-distribution scene,
   ``P(score > threshold) <= alpha``.
2. **Evaluate** on held-out in-distribution scenes (seeds ``CALIBRATION_SEED_BASE + S + K + i``) and on a shifted
   family (:mod:`.shifted`, seeds ``SHIFTED_SEED_BASE + S + i``) the policy never saw: false-alarm rate (in-dist
   scores above the threshold), detection rate (shifted scores above it), AUROC of the score separating the two
   (Mann-Whitney, ties count 1/2). Rates carry Wilson 95% intervals.

Output: ``{"uncertainty": {"threshold", "alpha", "false_alarm_rate", "detection_rate", "auroc", ...}, "settings",
"scores", "definitions"}`` as JSON, plus a markdown summary beside it.

With ``--bag BAG`` the episodes come from a team's recorded successful episodes instead of toy scenes, scored by the
node itself (:mod:`.bag_calibration`).
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

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.stats import auroc, conformal_threshold, wilson
from trajectory_ensemble_node.toy import load_toy_pipeline, request_kwargs, task
from trajectory_ensemble_node.tools import bag_calibration
from trajectory_ensemble_node.toy.shifted import FAMILIES, SHIFTED_SEED_BASE, collides_shifted, render_shifted, shifted_scenes

CALIBRATION_SEED_BASE = task.HELDOUT_SEED_BASE + 100_000
"""Calibration and held-out evaluation scenes: away from training and from the quality bench's held-out range."""
DEFAULT_JSON = Path("bench/results/uncertainty-toy.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenes", type=int, default=100, help="calibration scenes K (in distribution)")
    parser.add_argument("--scene-seed", type=int, default=0, help="scene seed offset S")
    parser.add_argument("--alpha", type=float, default=0.05, help="target false-alarm rate")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="JSON output (markdown beside it)")
    parser.add_argument("--heldout", type=int, default=100, help="held-out in-distribution evaluation scenes")
    parser.add_argument("--shifted", type=int, default=100, help="shifted evaluation scenes")
    parser.add_argument("--family", choices=FAMILIES, default="two_obstacles", help="shifted scene family")
    parser.add_argument("--count", type=int, default=8, help="candidates per scene")
    parser.add_argument("--reducer", default="mode", help="reducer (its output is scored for collisions)")
    parser.add_argument("--base-seed", type=int, default=0, help="candidate base seed of the first scene")
    parser.add_argument("--pipeline", type=Path, default=None, help="pipeline dir (default: the shipped toy)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--scene-batch", type=int, default=4, help="scenes submitted together (throughput only)")
    bag_calibration.add_bag_arguments(parser)


def _score(model: Any, images: Sequence[np.ndarray], spec: CandidateTrajectorySpec, base_seed: int,
           batch: int, label: str) -> tuple[list[float], list[np.ndarray], list[dict[str, Any]]]:
    """Uncertainty scores, reduced chunks and metrics of one group per image (groups co-batched ``batch`` at once)."""
    scores, chunks, metrics = [], [], []
    started = time.perf_counter()
    for first in range(0, len(images), batch):
        handles = [model.submit(**request_kwargs(image), spec=spec, base_seed=base_seed + first + j)
                   for j, image in enumerate(images[first:first + batch])]
        model.run_until_idle()
        for handle in handles:
            result = handle.result()
            scores.append(float(result.metrics["uncertainty_score"]))
            chunks.append(result.action.numpy().astype(np.float64))
            metrics.append(result.metrics)
        print(f"{label}: {len(scores)}/{len(images)} ({time.perf_counter() - started:.0f} s)", flush=True)
    return scores, chunks, metrics


def _rate(flags: Sequence[bool]) -> dict[str, Any]:
    hits = int(sum(flags))
    return {"rate": hits / max(len(flags), 1), "count": hits, "of": len(flags), "ci95": list(wilson(hits, len(flags)))}



def run(args: argparse.Namespace) -> int:
    """Calibrate, evaluate, print and write the JSON and markdown; returns 0."""
    if getattr(args, "bag", None):  # episodes from a team's bags instead of toy scenes
        return bag_calibration.run(args, toy_json=DEFAULT_JSON)
    if args.scenes < 1 or args.heldout < 1 or args.shifted < 1:
        raise SystemExit(f"--scenes, --heldout and --shifted must be >= 1, got {args.scenes}, {args.heldout}, "
                         f"{args.shifted}")
    commit = git_commit()  # the code that runs is the code checked out now, not at the end of a long run
    torch.set_num_threads(args.threads)
    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel

    model = Cosmos3ActionModel(load_toy_pipeline(path=args.pipeline), max_batch_candidates=128)
    spec = CandidateTrajectorySpec(count=args.count, reducer=args.reducer)
    seed0 = CALIBRATION_SEED_BASE + args.scene_seed
    calibration = [task.make_scene(seed0 + i) for i in range(args.scenes)]
    heldout = [task.make_scene(seed0 + args.scenes + i) for i in range(args.heldout)]
    shifted = shifted_scenes(args.shifted, seed=args.scene_seed, family=args.family)
    batch = max(1, args.scene_batch)
    started = time.perf_counter()
    cal_scores, _, _ = _score(model, [task.render(s) for s in calibration], spec, args.base_seed, batch, "calibration")
    threshold = conformal_threshold(cal_scores, args.alpha)
    in_scores, in_chunks, _ = _score(model, [task.render(s) for s in heldout], spec, args.base_seed + 10_000, batch,
                                     "held-out")
    sh_scores, sh_chunks, _ = _score(model, [render_shifted(s) for s in shifted], spec, args.base_seed + 20_000,
                                     batch, f"shifted ({args.family})")
    false_alarms = _rate([s > threshold for s in in_scores])
    detections = _rate([s > threshold for s in sh_scores])
    in_collisions = _rate([task.collides(s, c) for s, c in zip(heldout, in_chunks)])
    sh_collisions = _rate([collides_shifted(s, c) for s, c in zip(shifted, sh_chunks)])
    uncertainty = {
        "threshold": threshold,
        "alpha": args.alpha,
        "false_alarm_rate": false_alarms["rate"],
        "detection_rate": detections["rate"],
        "auroc": auroc(in_scores, sh_scores),
        "false_alarms": false_alarms,
        "detections": detections,
        "calibration_scenes": len(cal_scores),
        "heldout_scenes": len(in_scores),
        "shifted_scenes": len(sh_scores),
        "acceptance_false_alarm_at_most": args.alpha + 0.05,
        "acceptance_met": false_alarms["rate"] <= args.alpha + 0.05,
        "collision_rate_heldout": in_collisions,
        "collision_rate_shifted": sh_collisions,
    }
    result = {
        "uncertainty": uncertainty,
        "settings": {
            "date": utc_now(),
            "commit": commit,
            "family": args.family,
            "count": args.count,
            "reducer": args.reducer,
            "num_inference_steps": task.NUM_INFERENCE_STEPS,
            "calibration_seeds": [seed0, seed0 + args.scenes - 1],
            "heldout_seeds": [seed0 + args.scenes, seed0 + args.scenes + args.heldout - 1],
            "shifted_seeds": [SHIFTED_SEED_BASE + args.scene_seed,
                              SHIFTED_SEED_BASE + args.scene_seed + args.shifted - 1],
            "base_seed": args.base_seed,
            "score": "uncertainty_score: mean RMS distance (normalized space) from each candidate to its nearest other",
            "seconds": round(time.perf_counter() - started, 1),
        },
        "scores": {"calibration": cal_scores, "heldout": in_scores, "shifted": sh_scores},
    }
    out: Path = args.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result))
    print(json.dumps({"uncertainty": {k: uncertainty[k] for k in
                                      ("threshold", "alpha", "false_alarm_rate", "detection_rate", "auroc")}}))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def markdown(result: dict[str, Any]) -> str:
    """A short human summary of a calibrate result."""
    u, s = result["uncertainty"], result["settings"]
    fa, det = u["false_alarms"], u["detections"]

    def pct(entry: dict[str, Any]) -> str:
        low, high = entry["ci95"]
        return f"{100 * entry['rate']:.0f}% [{100 * low:.0f}, {100 * high:.0f}] ({entry['count']}/{entry['of']})"

    return "\n".join([
        f"# Uncertainty calibration on the toy task ({s['date']}, commit {s['commit']})",
        "",
        f"N = {s['count']} candidates, reducer `{s['reducer']}`, {s['num_inference_steps']} steps. Score: "
        f"{s['score']}. Split-conformal threshold at alpha = {u['alpha']} from {u['calibration_scenes']} "
        f"in-distribution scenes (seeds {s['calibration_seeds']}).",
        "",
        "| figure | value |",
        "|---|---|",
        f"| threshold | {u['threshold']:.4f} |",
        f"| false-alarm rate, {u['heldout_scenes']} held-out in-distribution scenes | {pct(fa)} |",
        f"| detection rate, {u['shifted_scenes']} shifted scenes (`{s['family']}`) | {pct(det)} |",
        f"| AUROC (held-out vs shifted) | {u['auroc']:.3f} |",
        f"| collision rate of the reduced chunk, held-out | {pct(u['collision_rate_heldout'])} |",
        f"| collision rate of the reduced chunk, shifted | {pct(u['collision_rate_shifted'])} |",
        "",
        f"Acceptance (false alarms <= alpha + 0.05 = {u['acceptance_false_alarm_at_most']:.2f}): "
        f"{'met' if u['acceptance_met'] else 'NOT met'}. Intervals: Wilson 95%.",
        "",
    ])
