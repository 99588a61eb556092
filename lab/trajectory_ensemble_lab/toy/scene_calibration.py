"""``trajectory-ensemble calibrate`` on toy scenes: a conformal threshold on the uncertainty score, tested on shifted
scenes.

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

3. **Novelty** (:mod:`trajectory_ensemble_node.calibration.novelty_calibration`): the observation-novelty scorer is
   fitted on the first half of the calibration scenes' embeddings (``Cosmos3ActionModel.observation_embedding``, the
   value a serving group scores) and written beside the JSON as ``<json>.novelty.safetensors``; both scores'
   thresholds are set for every alarm rule (``spread``, ``novelty``, ``either``, ``both``); the held-out and shifted
   groups are served with the scorer on, so their ``novelty_score`` comes from the engine. Every rule's false alarms,
   detections and failure AUROC (a collision of the served chunk, held-out and shifted scenes together, 95 % paired
   bootstrap of its margin over spread alone) are reported, a rule is recommended, and the group time with the scorer
   on and off is measured (alternating groups, medians).

Output: ``{"uncertainty": {"threshold", "alpha", "false_alarm_rate", "detection_rate", "auroc", ...}, "observation":
{"threshold", "false_alarm_rate", "detection_rate", "auroc", ...}, "combined": {"rule", "false_alarm_rate",
"detection_rate", "failure_auroc", "rules", ...}, "settings", "scores"}`` as JSON, plus a markdown summary beside it.
The node loads it as ``uncertainty_calibration_file`` (with ``novelty_scorer_file`` for the scorer).

This mode is an experiment on the bundled toy task, so it lives in the lab with its shifted scenes
(:mod:`.shifted`); the product's ``calibrate`` (:mod:`trajectory_ensemble_node.calibration.calibrate`) owns the
flags and imports this module by name when the lab is installed. With ``--bag BAG`` the episodes come from a team's
recorded successful episodes instead, scored by the node itself
(:mod:`trajectory_ensemble_node.calibration.bag_calibration`), and the lab is not needed.
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

from trajectory_ensemble_node.calibration import novelty_calibration
from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.metrics import GroupCounters
from trajectory_ensemble_node.novelty import EmbeddingSpec
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.stats import auroc, conformal_threshold, wilson
from trajectory_ensemble_node.toy import load_toy_pipeline, request_kwargs, task
from trajectory_ensemble_node.uncertainty import NoveltyCheck, UncertaintyReport

from .shifted import SHIFTED_SEED_BASE, collides_shifted, render_shifted, shifted_scenes
from ..records import write_json

CALIBRATION_SEED_BASE = task.HELDOUT_SEED_BASE + 100_000
"""Calibration and held-out evaluation scenes: away from training and from the quality bench's held-out range."""


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
            scores.append(float(UncertaintyReport.from_metrics(result.metrics).score))
            chunks.append(result.action.numpy().astype(np.float64))
            metrics.append(result.metrics)
        print(f"{label}: {len(scores)}/{len(images)} ({time.perf_counter() - started:.0f} s)", flush=True)
    return scores, chunks, metrics


def _rate(flags: Sequence[bool]) -> dict[str, Any]:
    hits = int(sum(flags))
    return {"rate": hits / max(len(flags), 1), "count": hits, "of": len(flags), "ci95": list(wilson(hits, len(flags)))}



def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (every flag that changes a figure)."""
    flags = [("--scenes", args.scenes), ("--scene-seed", args.scene_seed), ("--alpha", args.alpha),
             ("--heldout", args.heldout), ("--shifted", args.shifted), ("--family", args.family),
             ("--count", args.count), ("--reducer", args.reducer), ("--base-seed", args.base_seed),
             ("--scorer", args.scorer), ("--fit-share", args.fit_share), ("--cost-groups", args.cost_groups)]
    if args.embedding_grid is not None:
        flags.append(("--embedding-grid", args.embedding_grid))
    if args.pipeline is not None:
        flags.append(("--pipeline", args.pipeline))
    return " ".join(["trajectory-ensemble calibrate", *(f"{k} {v}" for k, v in flags), f"--json {args.json}"])


def _embeddings(model: Any, images: Sequence[np.ndarray], grid: int | None) -> tuple[EmbeddingSpec, torch.Tensor]:
    """The observation embedding of each image, as a serving group computes it (``[len(images), D]``)."""
    from trajectory_ensemble_node.models.cosmos3 import DEFAULT_EMBEDDING_GRID, EMBEDDING_NAME, embedding_dim

    grid = grid or DEFAULT_EMBEDDING_GRID
    rows = [model.observation_embedding(prompt=task.INSTRUCTION, action=request_kwargs(image)["action"], fps=task.FPS,
                                        guidance_scale=task.GUIDANCE_SCALE, grid=grid) for image in images]
    spec = EmbeddingSpec(EMBEDDING_NAME, grid, embedding_dim(int(model.pipe.vae.config.z_dim), grid))
    return spec, torch.stack(rows)


def _measure_cost(model: Any, image: np.ndarray, spec: CandidateTrajectorySpec, check: NoveltyCheck,
                  groups: int, base_seed: int) -> dict[str, Any]:
    """Group time (the engine's ``total_ms``) with the novelty scorer on and off: alternating groups on one image and
    seed, in one process; medians and their ratio. One warm-up group of each first."""
    from trajectory_ensemble_node.models.cosmos3 import observation_embedding

    times: dict[str, list[float]] = {"off": [], "on": []}
    for index in range(groups + 1):
        # Alternate which goes first, so a drift in machine load falls on both sides alike.
        for state in (("off", "on") if index % 2 == 0 else ("on", "off")):
            model.novelty = check if state == "on" else None
            result = model.generate(**request_kwargs(image), spec=spec, base_seed=base_seed)
            if index:
                times[state].append(float(GroupCounters.from_metrics(result.metrics).total_ms))
    model.novelty = check
    off, on = float(np.median(times["off"])), float(np.median(times["on"]))
    # The work the feature adds, timed alone (a group-time difference this small is below the machine's noise):
    # pooling the encoded latent and scoring it, what the engine runs once per group.
    conditioning = model.adapter.encode(model.make_request(**request_kwargs(image), spec=spec, base_seed=0).payload)
    grid = check.scorer.embedding.grid
    tap = []
    for _ in range(50):
        started = time.perf_counter()
        check.scorer.score(observation_embedding(conditioning, grid))
        tap.append(1e3 * (time.perf_counter() - started))
    tap_ms = float(np.median(tap))
    return {"groups_each": groups, "group_ms_off_median": off, "group_ms_on_median": on, "ratio_on_off": on / off,
            "acceptance_at_most": 1.05, "acceptance_met": on / off <= 1.05, "group_ms_off": times["off"],
            "group_ms_on": times["on"], "count": spec.count, "metric": "total_ms (engine, submission to result)",
            "tap_and_score_ms_median": tap_ms, "tap_and_score_share_of_group": tap_ms / off}


def _novelty_report(args: argparse.Namespace, model: Any, fit: novelty_calibration.NoveltyFit,
                    embedding: EmbeddingSpec, cal_embeddings: torch.Tensor, heldout: tuple, shifted: tuple,
                    in_spread: list[float], sh_spread: list[float],
                    spec: CandidateTrajectorySpec) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The ``observation`` and ``combined`` sections and the novelty scores (see the module docstring, step 3)."""
    (in_images, in_metrics, in_failed), (sh_images, sh_metrics, sh_failed) = heldout, shifted
    in_novelty = [float(UncertaintyReport.from_metrics(m).novelty_score) for m in in_metrics]
    sh_novelty = [float(UncertaintyReport.from_metrics(m).novelty_score) for m in sh_metrics]
    held_goals = novelty_calibration.Goals(in_spread, in_novelty, in_failed)
    shift_goals = novelty_calibration.Goals(sh_spread, sh_novelty, sh_failed)
    figures = novelty_calibration.evaluate_rules(fit.rules, held_goals, shift_goals, args.alpha, seed=args.base_seed)
    rule, why = novelty_calibration.recommend(figures)
    _, in_embeddings = _embeddings(model, in_images, embedding.grid)
    _, sh_embeddings = _embeddings(model, sh_images, embedding.grid)
    offline = [float(v) for v in fit.scorer.scores(torch.cat([in_embeddings, sh_embeddings]))]
    scorers = novelty_calibration.other_scorers(args.scorer, cal_embeddings, fit, embedding, in_embeddings,
                                                sh_embeddings, held_goals, shift_goals, args.alpha,
                                                seed=args.base_seed)
    novelty_rule = figures["novelty"]
    cost = _measure_cost(model, in_images[0], spec, NoveltyCheck(fit.scorer, fit.rules[rule]),
                         max(5, args.cost_groups), args.base_seed + 30_000)
    observation = {
        "threshold": fit.rules["novelty"].novelty_threshold,
        "alpha": args.alpha,
        "false_alarm_rate": novelty_rule["false_alarm_rate"],
        "detection_rate": novelty_rule["detection_rate"],
        "auroc": novelty_rule["auroc"],
        "failure_auroc": novelty_rule["failure_auroc"],
        "false_alarms": novelty_rule["false_alarms"],
        "detections": novelty_rule["detections"],
        "scorer": args.scorer,
        "embedding": embedding.name,
        "embedding_grid": embedding.grid,
        "embedding_dim": embedding.dim,
        "fit_scenes": fit.fit_count,
        "threshold_scenes": fit.threshold_count,
        "scorers": scorers,
        "served_vs_offline_max_abs": max(abs(a - b) for a, b in zip(in_novelty + sh_novelty, offline)),
        "cost": cost,
    }
    chosen = figures[rule]
    combined = {
        "rule": rule,
        "false_alarm_rate": chosen["false_alarm_rate"],
        "detection_rate": chosen["detection_rate"],
        "failure_auroc": chosen["failure_auroc"],
        "failure_auroc_ci95": chosen["failure_auroc_ci95"],
        "margin_over_spread": chosen["margin_over_spread"],
        "spread_threshold": chosen["spread_threshold"],
        "novelty_threshold": chosen["novelty_threshold"],
        "recommendation": why,
        "acceptance": {
            "false_alarm_at_most": args.alpha + novelty_calibration.FALSE_ALARM_MARGIN,
            "detection_at_least": novelty_calibration.DETECTION_TARGET,
            "false_alarm_met": chosen["false_alarm_ok"],
            "detection_met": chosen["detection_ok"],
            "beats_spread_outside_ci95": chosen["margin_over_spread"]["ci95"][0] > 0,
        },
        "rules": figures,
    }
    scores = {"calibration": fit.calibration_novelty, "heldout": in_novelty, "shifted": sh_novelty}
    return observation, combined, scores


def run(args: argparse.Namespace) -> int:
    """Calibrate, evaluate, print and write the JSON and markdown; returns 0.

    Args:
        args (`argparse.Namespace`): ``calibrate``'s flags (:func:`trajectory_ensemble_node.calibration.calibrate.
            add_arguments`), without ``--bag``.
    """
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
    cal_images = [task.render(s) for s in calibration]
    cal_scores, _, _ = _score(model, cal_images, spec, args.base_seed, batch, "calibration")
    threshold = conformal_threshold(cal_scores, args.alpha)
    embedding, cal_embeddings = _embeddings(model, cal_images, args.embedding_grid)
    fit = novelty_calibration.fit_thresholds(cal_scores, cal_embeddings, embedding, args.alpha, kind=args.scorer,
                                             fit_share=args.fit_share, seed=args.base_seed)
    scorer_path = args.scorer_out or args.json.with_suffix(".novelty.safetensors")
    scorer_sha = fit.scorer.save(scorer_path)
    # Held-out and shifted groups are served with the scorer on: their novelty_score is the engine's own.
    model.novelty = NoveltyCheck(fit.scorer, fit.rules["spread"])
    in_images = [task.render(s) for s in heldout]
    sh_images = [render_shifted(s) for s in shifted]
    in_scores, in_chunks, in_metrics = _score(model, in_images, spec, args.base_seed + 10_000, batch, "held-out")
    sh_scores, sh_chunks, sh_metrics = _score(model, sh_images, spec, args.base_seed + 20_000, batch,
                                              f"shifted ({args.family})")
    false_alarms = _rate([s > threshold for s in in_scores])
    detections = _rate([s > threshold for s in sh_scores])
    in_failed = [task.collides(s, c) for s, c in zip(heldout, in_chunks)]
    sh_failed = [collides_shifted(s, c) for s, c in zip(shifted, sh_chunks)]
    in_collisions, sh_collisions = _rate(in_failed), _rate(sh_failed)
    observation, combined, novelty_scores = _novelty_report(
        args, model, fit, embedding, cal_embeddings, (in_images, in_metrics, in_failed),
        (sh_images, sh_metrics, sh_failed), in_scores, sh_scores, spec)
    observation.update(scorer_file=str(scorer_path), scorer_sha256=scorer_sha)
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
    uncertainty["failure_auroc"] = combined["rules"]["spread"]["failure_auroc"]
    uncertainty["failure_auroc_ci95"] = combined["rules"]["spread"]["failure_auroc_ci95"]
    result = {
        "uncertainty": uncertainty,
        "observation": observation,
        "combined": combined,
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
            "novelty": f"novelty_score: {args.scorer} scorer on {embedding.name} pooled to {embedding.grid}x"
                       f"{embedding.grid} ({embedding.dim} values), fitted on {fit.fit_count} calibration scenes",
            "window": 1,
            "threads": args.threads,
            "command": _command(args),
            "seconds": round(time.perf_counter() - started, 1),
        },
        "scores": {"calibration": cal_scores, "heldout": in_scores, "shifted": sh_scores,
                   "novelty": novelty_scores, "collided": {"heldout": in_failed, "shifted": sh_failed}},
    }
    out: Path = args.json
    write_json(out, result)
    out.with_suffix(".md").write_text(markdown(result))
    print(json.dumps({"uncertainty": {k: uncertainty[k] for k in
                                      ("threshold", "alpha", "false_alarm_rate", "detection_rate", "auroc")},
                      "observation": {k: observation[k] for k in
                                      ("threshold", "false_alarm_rate", "detection_rate", "auroc")},
                      "combined": {k: combined[k] for k in
                                   ("rule", "false_alarm_rate", "detection_rate", "failure_auroc")}}))
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
    ] + (_novelty_markdown(result, pct) if "combined" in result else []))


def _novelty_markdown(result: dict[str, Any], pct: Any) -> list[str]:
    o, c, s = result["observation"], result["combined"], result["settings"]
    cost = o["cost"]

    def ci(values: list[float]) -> str:
        return f"[{values[0]:.3f}, {values[1]:.3f}]"

    lines = [
        "## Observation novelty and the alarm rules",
        "",
        f"Novelty: {s['novelty']}; threshold {o['threshold']:.4g} from the other {o['threshold_scenes']} calibration "
        f"scenes. Served and offline novelty scores agree within {o['served_vs_offline_max_abs']:.2g}.",
        "",
        "| rule | spread threshold | novelty threshold | false alarms (held-out) | detection (shifted) | "
        "failure AUROC [95%] | margin over spread [95%] |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, f in c["rules"].items():
        margin = f["margin_over_spread"]
        spread_t = "-" if name == "novelty" else f"{f['spread_threshold']:.4f}"
        novelty_t = "-" if name == "spread" else f"{f['novelty_threshold']:.4g}"
        lines.append(f"| `{name}`{' (recommended)' if name == c['rule'] else ''} | {spread_t} | {novelty_t} | "
                     f"{pct(f['false_alarms'])} | {pct(f['detections'])} | {f['failure_auroc']:.3f} "
                     f"{ci(f['failure_auroc_ci95'])} | {margin['delta']:+.3f} {ci(margin['ci95'])} |")
    lines += ["", "| scorer | false alarms | detection | AUROC (held-out vs shifted) | failure AUROC |",
              "|---|---|---|---|---|"]
    for kind, f in o["scorers"].items():
        lines.append(f"| `{kind}`{' (kept)' if f['kept'] else ''} | {100 * f['false_alarm_rate']:.0f}% | "
                     f"{100 * f['detection_rate']:.0f}% | {f['auroc']:.3f} | {f['failure_auroc']:.3f} |")
    a = c["acceptance"]
    lines += [
        "",
        f"Recommended rule: `{c['rule']}` ({c['recommendation']}). False alarms <= {a['false_alarm_at_most']:.2f}: "
        f"{'met' if a['false_alarm_met'] else 'NOT met'}; detection >= {a['detection_at_least']:.0%}: "
        f"{'met' if a['detection_met'] else 'NOT met'}; failure AUROC above spread alone outside the 95% interval: "
        f"{'met' if a['beats_spread_outside_ci95'] else 'NOT met'}. Failure AUROC: a collision of the served chunk, "
        "held-out and shifted scenes together; intervals by paired bootstrap over scenes.",
        "",
        f"Cost: median group time {cost['group_ms_off_median']:.0f} ms off, {cost['group_ms_on_median']:.0f} ms on "
        f"(ratio {cost['ratio_on_off']:.3f}; {cost['groups_each']} alternating groups each, N = {cost['count']}): "
        f"{'within' if cost['acceptance_met'] else 'ABOVE'} the 5% bound. The work it adds, timed alone (pool the "
        f"encoded latent, score it): {cost['tap_and_score_ms_median']:.3f} ms, "
        f"{100 * cost['tap_and_score_share_of_group']:.3f}% of a group.",
        "",
        f"Run: `{s['command']}` ({s['threads']} thread(s), {s['seconds']:.0f} s).",
        "",
    ]
    return lines
