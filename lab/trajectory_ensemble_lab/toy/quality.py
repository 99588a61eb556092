"""``trajectory-ensemble bench --quality``: does ensembling N candidates help on the bimodal toy task?

Procedure (fixed seeds, held-out scenes that training never sees):

1. For each held-out scene ``i`` and each N, draw N candidates ONCE through the real serving path,
   ``Cosmos3ActionModel(pipe).generate(..., spec=CandidateTrajectorySpec(count=N, ..., return_candidates=True),
   base_seed=base_seed + i)``, and apply every reducer valid for the ``pusht`` layout to the SAME candidates.
   ``single`` is candidate 0 alone (its seed is ``base_seed + i`` for every N).
2. Task metrics per (reducer, N) over the scenes: collision rate and final error of the reduced chunk
   (:mod:`.task`), and mode agreement: execute the first ``REPLAN_AFTER`` waypoints of the reduced chunk, draw N
   fresh candidates from the state reached (base seed ``base_seed + SECOND_CHUNK_SEED_OFFSET + i``), reduce them with
   the same reducer, and check both chunks pass the obstacle on the same side. The second draws cost up to one
   group per distinct reduced chunk, so agreement is measured at ``--agreement-ns`` (default N = 1, 2, 8) only, and
   on the first ``--agreement-scenes`` scenes (default: all), so a run with many scenes for the collision rates can
   keep agreement at a size it can afford.
3. 95% intervals: Wilson score intervals for rates; percentile bootstrap over scenes (2000 resamples, fixed seed)
   for the mean final error.

Output: JSON ``{"quality": {REDUCER: {"N": {"collision_rate": ..., "final_error": ..., "mode_agreement": ...}}},
"settings": ..., "definitions": ..., "diagnostics": ...}``, plus a markdown table and a PNG plot beside it. The
settings record the UTC date and the git commit of the run, and the markdown repeats them.
"""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.contract import CandidateTrajectorySpec, check_reducer
from trajectory_ensemble_node.errors import ReducerLayoutError
from trajectory_ensemble_node.provenance import git_commit
from trajectory_ensemble_node.reducers import get_reducer
from trajectory_ensemble_node.stats import bootstrap_mean, wilson
from trajectory_ensemble_node.toy import load_toy_pipeline, request_kwargs, task
from .report import write_markdown, write_plot
from ..records import write_json

DEFAULT_NS = (1, 2, 4, 8, 10)
SECOND_CHUNK_SEED_OFFSET = 500_000
"""Second-chunk base seeds are offset so they never coincide with a first chunk's."""
DEFAULT_JSON = Path("bench/results/quality-toy.json")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the quality-bench options (``bench --quality`` passes ``scenes``, ``scene_seed`` and ``json``)."""
    parser.add_argument("--scenes", type=int, default=50, help="held-out scenes")
    parser.add_argument("--scene-seed", type=int, default=0, help="first held-out scene offset")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="JSON output")
    add_quality_options(parser)


def add_quality_options(parser: argparse.ArgumentParser) -> None:
    """The options beyond ``--scenes/--scene-seed/--json`` (for a bench CLI that adds those itself)."""
    parser.add_argument("--ns", type=str, default=",".join(map(str, DEFAULT_NS)), help="candidate counts")
    parser.add_argument("--steps", type=int, default=task.NUM_INFERENCE_STEPS, help="denoising steps")
    parser.add_argument("--base-seed", type=int, default=0, help="candidate base seed of scene 0")
    parser.add_argument("--pipeline", type=Path, default=None, help="pipeline dir (default: the shipped toy)")
    parser.add_argument("--agreement-ns", type=str, default="1,2,8",
                        help="candidate counts at which mode agreement is measured ('' = none); each costs a second "
                             "draw per distinct reduced chunk")
    parser.add_argument("--agreement-scenes", type=int, default=None,
                        help="measure mode agreement on the first this many scenes only (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--scene-batch", type=int, default=1, help="scenes submitted together (throughput only)")


def valid_reducers(model: Any, width: int) -> list[str]:
    """Reducers the adapter declares that also accept a ``width``-wide action (drops ``pose_gripper`` for 2)."""
    names = []
    for name in model.valid_reducers():
        try:
            check_reducer(name, width, valid_reducers=model.valid_reducers())
        except ReducerLayoutError:
            continue
        names.append(name)
    return names


def reduce_all(candidates: torch.Tensor, reducers: Sequence[str]) -> dict[str, np.ndarray]:
    """``single`` (candidate 0) and every reducer applied to the same ``[N, H, 2]`` candidates."""
    out = {"single": candidates[0].numpy().astype(np.float64)}
    for name in reducers:
        out[name] = get_reducer(name)(candidates).numpy().astype(np.float64)
    return out


def _draw(model: Any, requests: Sequence[tuple[task.Scene, int, int]], steps: int) -> list[torch.Tensor]:
    """Candidates ``[N, H, 2]`` for each ``(scene, N, base_seed)`` request.

    Every group is submitted before any runs, so the engine co-batches them into shared forwards (candidate i still
    equals its own upstream run within the equivalence rule).
    """
    handles = []
    for scene, count, seed in requests:
        kwargs = request_kwargs(task.render(scene))
        kwargs["num_inference_steps"] = steps
        spec = CandidateTrajectorySpec(count=count, reducer="none" if count == 1 else "mean", return_candidates=True)
        handles.append(model.submit(**kwargs, spec=spec, base_seed=seed))
    model.run_until_idle()
    return [handle.result().candidates for handle in handles]


def _unique_chunks(chunks: dict[str, np.ndarray]) -> list[tuple[np.ndarray, list[str]]]:
    # Reducers that produced the identical chunk reach the identical state: its second chunk is drawn once.
    unique: list[tuple[np.ndarray, list[str]]] = []
    for name, chunk in chunks.items():
        for seen, owners in unique:
            if np.array_equal(seen, chunk):
                owners.append(name)
                break
        else:
            unique.append((chunk, [name]))
    return unique


def evaluate(
    model: Any,
    scenes: Sequence[task.Scene],
    ns: Sequence[int],
    *,
    steps: int,
    base_seed: int,
    agreement_ns: Sequence[int] = (1, 2, 8),
    agreement_scenes: int | None = None,
    scene_batch: int = 1,
    log=print,
) -> dict[str, Any]:
    """Per-scene records for every (reducer, N); see the module docstring for the procedure.

    Args:
        model (`Cosmos3ActionModel`): The served policy.
        scenes (`Sequence[task.Scene]`): Held-out initial scenes; scene ``i`` uses base seed ``base_seed + i``.
        ns (`Sequence[int]`): Candidate counts.
        steps (`int`): Denoising steps.
        base_seed (`int`): Base seed of scene 0.
        agreement_ns (`Sequence[int]`): Candidate counts at which the second chunks (mode agreement) are drawn.
        agreement_scenes (`int`, *optional*): Draw second chunks for the first this many scenes only (all if None).
        scene_batch (`int`): Scenes whose groups are submitted together (throughput only).
        log (`Callable[[str], None]`): Progress output.
    """
    reducers = valid_reducers(model, 2)
    names = ["single", *reducers]
    records: dict[str, dict[int, dict[str, list]]] = {
        name: {n: {"collision": [], "final_error": [], "agree": [], "clearance": []} for n in ns} for name in names
    }
    sides_at_max: list[list[int]] = []
    candidate_collisions = [0, 0]
    started = time.perf_counter()
    agreement_limit = len(scenes) if agreement_scenes is None else agreement_scenes
    for first in range(0, len(scenes), scene_batch):
        indexes = list(range(first, min(first + scene_batch, len(scenes))))
        keys = [(i, n) for i in indexes for n in ns]
        drawn = _draw(model, [(scenes[i], n, base_seed + i) for i, n in keys], steps)
        chunks = {key: reduce_all(candidates, reducers) for key, candidates in zip(keys, drawn)}
        for (i, n), candidates in zip(keys, drawn):
            scene = scenes[i]
            if n == max(ns):
                sides_at_max.append([task.side(scene, c.numpy()) for c in candidates])
                candidate_collisions[0] += sum(task.collides(scene, c.numpy()) for c in candidates)
                candidate_collisions[1] += len(candidates)
            for name, chunk in chunks[(i, n)].items():
                record = records[name][n]
                record["collision"].append(bool(task.collides(scene, chunk)))
                record["clearance"].append(float(task.clearance(scene, chunk)))
                record["final_error"].append(task.final_error(scene, chunk))
        if agreement_ns:
            jobs = [(i, n, chunk, owners) for i, n in keys if n in agreement_ns and i < agreement_limit
                    for chunk, owners in _unique_chunks(chunks[(i, n)])]
            seconds = _draw(
                model,
                [(task.replan_scene(scenes[i], chunk), n, base_seed + SECOND_CHUNK_SEED_OFFSET + i)
                 for i, n, chunk, _ in jobs],
                steps,
            )
            for (i, n, chunk, owners), second in zip(jobs, seconds):
                reduced = reduce_all(second, reducers)
                for name in owners:
                    records[name][n]["agree"].append(bool(task.mode_agreement(scenes[i], chunk, reduced[name])))
        log(f"scenes {indexes[-1] + 1}/{len(scenes)} done ({time.perf_counter() - started:.0f} s)")
    return {"records": records, "sides_at_max": sides_at_max, "candidate_collisions": candidate_collisions,
            "reducers": names, "seconds": time.perf_counter() - started}


def summarize(evaluation: dict[str, Any], ns: Sequence[int]) -> dict[str, Any]:
    """Rates and means with 95% intervals, keyed ``quality[reducer][str(N)]``."""
    quality: dict[str, dict[str, dict[str, Any]]] = {}
    for name, per_n in evaluation["records"].items():
        quality[name] = {}
        for n in ns:
            record = per_n[n]
            scenes = len(record["collision"])
            collisions = int(sum(record["collision"]))
            entry: dict[str, Any] = {
                "collision_rate": collisions / scenes,
                "collision_rate_ci95": list(wilson(collisions, scenes)),
                "collisions": collisions,
                "final_error": float(np.mean(record["final_error"])),
                "final_error_ci95": list(bootstrap_mean(record["final_error"], seed=n)),
                "min_clearance_median": float(np.median(record["clearance"])),
                "scenes": scenes,
            }
            if record["agree"]:
                agreed = int(sum(record["agree"]))
                entry["mode_agreement"] = agreed / len(record["agree"])
                entry["mode_agreement_ci95"] = list(wilson(agreed, len(record["agree"])))
                entry["mode_agreement_scenes"] = len(record["agree"])
            quality[name][str(n)] = entry
    sides = np.asarray(evaluation["sides_at_max"], dtype=np.float64)
    above = (sides > 0).mean(axis=1) if sides.size else np.zeros(0)
    collided, total = evaluation["candidate_collisions"]
    diagnostics = {
        "n_for_side_stats": max(ns),
        "fraction_above_per_scene": [float(a) for a in above],
        "scenes_with_both_sides": int(((above > 0) & (above < 1)).sum()),
        "candidate_collision_rate": collided / max(total, 1),
        "candidate_collision_rate_ci95": list(wilson(collided, total)),
        "eval_seconds": round(evaluation["seconds"], 1),
    }
    return {"quality": quality, "diagnostics": diagnostics}


DEFINITIONS = {
    "collision_rate": (
        f"share of scenes whose chunk polyline (planning position, then the {task.HORIZON} waypoints; every segment "
        f"checked) comes within {task.COLLISION_CLEARANCE} of the obstacle disk edge (normalized units, "
        "image = [-1, 1])"
    ),
    "final_error": "mean Euclidean distance from the chunk's last waypoint to the target (normalized units)",
    "mode_agreement": (
        f"share of scenes where, after executing the first {task.REPLAN_AFTER} waypoints of the reduced chunk and "
        "re-planning from the state reached (same N, same reducer, fresh seeds), both chunks pass the obstacle on the "
        "same side; side = sign of cross(target - episode start, q - obstacle centre), q the polyline point nearest "
        "the obstacle centre"
    ),
    "single": "candidate 0 of the same draw (seed = base seed), without reduction",
    "intervals": "95%: Wilson score interval for rates; percentile bootstrap over scenes (2000 resamples) for means",
}



def run(args: argparse.Namespace) -> int:
    """Run the quality bench and write JSON, markdown and PNG; returns 0."""
    torch.set_num_threads(getattr(args, "threads", 1))
    ns = [int(n) for n in str(getattr(args, "ns", ",".join(map(str, DEFAULT_NS)))).split(",") if n]
    steps = int(getattr(args, "steps", task.NUM_INFERENCE_STEPS))
    base_seed = int(getattr(args, "base_seed", 0))
    agreement_ns = [int(n) for n in str(getattr(args, "agreement_ns", "1,2,8")).split(",") if n]
    agreement_scenes = getattr(args, "agreement_scenes", None)
    # Taken before the run: the code may be committed or edited while a long run goes on.
    started = datetime.datetime.now(datetime.timezone.utc)
    commit = git_commit()
    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel

    pipe = load_toy_pipeline(path=getattr(args, "pipeline", None))
    model = Cosmos3ActionModel(pipe, max_batch_candidates=128)
    scenes = task.heldout_scenes(args.scenes, seed=args.scene_seed)
    evaluation = evaluate(model, scenes, ns, steps=steps, base_seed=base_seed,
                          agreement_ns=agreement_ns, agreement_scenes=agreement_scenes,
                          scene_batch=int(getattr(args, "scene_batch", 1)),
                          log=lambda m: print(m, flush=True))
    result = summarize(evaluation, ns)
    result["settings"] = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "scenes": args.scenes,
        "scene_seeds": [scenes[0].seed, scenes[-1].seed] if scenes else [],
        "base_seed": base_seed,
        "ns": ns,
        "agreement_ns": agreement_ns,
        "agreement_scenes": min(args.scenes, agreement_scenes) if agreement_scenes is not None else args.scenes,
        "threads": getattr(args, "threads", 1),
        "num_inference_steps": steps,
        "guidance_scale": task.GUIDANCE_SCALE,
        "domain_name": task.DOMAIN_NAME,
        "chunk_size": task.HORIZON,
        "pipeline": str(getattr(args, "pipeline", None) or "shipped toy_policy"),
        "path": "Cosmos3ActionModel.generate (batched candidates, one forward per step per group)",
    }
    result["definitions"] = DEFINITIONS
    out: Path = args.json or DEFAULT_JSON
    write_json(out, result)
    write_markdown(result, out.with_suffix(".md"))
    # Draw the example panel on the first scene whose candidates split across both sides, if any, with the same
    # seed as in the evaluation.
    above = result["diagnostics"]["fraction_above_per_scene"]
    pick = next((i for i, a in enumerate(above) if 0 < a < 1), 0)
    example = _draw(model, [(scenes[pick], max(ns), base_seed + pick)], steps)[0].numpy() if scenes else None
    write_plot(result, out.with_suffix(".png"), scenes[pick] if scenes else None, example)
    print(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
    print(out.with_suffix(".md").read_text())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trajectory_ensemble_lab.toy.quality``: the quality bench without the bench CLI."""
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.toy.quality", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
