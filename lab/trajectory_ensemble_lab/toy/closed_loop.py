"""``trajectory-ensemble bench --closed-loop``: chunks executed back to back on the toy task, in-process.

A point robot (:mod:`.task`) executes position waypoints at ``dt = 1 / FPS``. Every chunk is drawn through the real
serving path (``Cosmos3ActionModel.generate``), from the image rendered at the robot's position when it is requested.

The timeline (``H = 8`` actions per chunk, ``s = H / 2`` executed per chunk, inference delay ``d`` steps) and the
methods (``sync``, ``naive_async``, ``temporal_ensemble``, ``weighted_average``, ``bid``, ``guided``,
``guided_mode``, ``rtc_vjp``; ``guided_mask`` and ``guided_bid`` with ``--methods``) are those of
:mod:`trajectory_ensemble_lab.chunk_execution`, which PushT's bench shares; the first chunk is the same for every
method. ``--context-guidance mask`` serves the gradient-free methods (``guided``, ``guided_mode``, ``guided_bid``) with
``"mask"`` guidance instead of ``"prefix"``: for a policy trained with clean action prefixes
(``train-toy --prefix-conditioning``), which reads a frozen prefix given through the action mask.

Episodes end at the target (robot centre within ``TARGET_RADIUS``), on a collision (an executed segment closer
than ``COLLISION_CLEARANCE`` to the obstacle edge) or at ``STEP_BUDGET`` steps. Candidate seeds are common to all
methods (held-out scene ``i``, i.e. seed ``HELDOUT_SEED_BASE + i``, chunk ``c``: ``base_seed + 1000 i + c``), so methods differ by what they do, not by luck.
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
from trajectory_ensemble_node.engine.context import ExecutionContext
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.reducers import ContinuityReference, get_reducer
from trajectory_ensemble_node.toy import load_toy_pipeline, request_kwargs, task
from trajectory_ensemble_node.toy.episodes import EXECUTE, STEP_BUDGET, Episode, scene_seed, summarize

from ..chunk_execution import (  # noqa: F401 - the method table is importable from here, as before
    EXTRA_METHODS, GRADIENT_FREE, METHODS, TE_M, WA_OLD, ChunkPlan, Method, method_table)

DT = 1.0 / task.FPS
DEFAULT_JSON = Path("bench/results/closed_loop-toy.json")
DEFAULT_METHODS = tuple(METHODS)


class Drawer:
    """Draws one reduced chunk through the served model.

    Identical draws (same position, count, seeds and context) are answered from a memo of their candidates, e.g. every
    method's first chunk, or ``sync`` and ``naive_async`` at ``d = 0``; a memo hit with another reducer applies that
    reducer to the same candidates, as the engine would.
    """

    def __init__(self, model: Any, steps: int) -> None:
        self.model, self.steps = model, steps
        self.memo: dict[tuple, tuple[torch.Tensor, dict[str, np.ndarray], float]] = {}
        self.group_ms: dict[tuple[int, str], list[float]] = {}

    def __call__(self, scene: task.Scene, position: np.ndarray, method: Method, seed: int,
                 context: ExecutionContext | None) -> tuple[np.ndarray, float]:
        ckey = None if context is None else (context.previous.numpy().tobytes(), context.frozen, context.shift,
                                              context.guidance)
        key = (scene.seed, np.asarray(position).tobytes(), method.count, seed, ckey)
        if key not in self.memo:
            kwargs = request_kwargs(task.render(scene.with_robot(position)))
            kwargs["num_inference_steps"] = self.steps
            spec = CandidateTrajectorySpec(count=method.count, reducer=method.reducer, return_candidates=True)
            started = time.perf_counter()
            result = self.model.generate(**kwargs, spec=spec, base_seed=seed, context=context)
            elapsed = (time.perf_counter() - started) * 1e3
            mode = "-" if context is None else context.guidance
            self.group_ms.setdefault((method.count, mode), []).append(elapsed)
            self.memo[key] = (result.candidates, {method.reducer: result.action.numpy().astype(np.float64)}, elapsed)
        candidates, reduced, elapsed = self.memo[key]
        if method.reducer not in reduced:
            reference = None
            if context is not None:
                reference = ContinuityReference(context.target(task.HORIZON), context.weights(task.HORIZON))
            reducer = get_reducer(method.reducer)
            reduced[method.reducer] = reducer(candidates, reference).numpy().astype(np.float64)
        return reduced[method.reducer], elapsed


def _segment_collides(scene: task.Scene, start: np.ndarray, end: np.ndarray) -> bool:
    return task.clearance(scene, end[None], start=start) < task.COLLISION_CLEARANCE


def _context(previous: np.ndarray, previous_time: int, now: int, delay: int, guidance: str) -> ExecutionContext:
    return ExecutionContext(torch.from_numpy(previous).float(), previous_time * DT, DT, delay, now * DT,
                            guidance=guidance)


def run_episode(draw: Drawer, scene: task.Scene, method: Method, delay: int, seed: int) -> Episode:
    """Simulate one episode of ``method`` with inference delay ``delay`` (control steps)."""
    position = scene.robot.copy()
    episode = Episode(positions=[position.copy()])
    chunk, ms = draw(scene, position, method, seed, None)
    episode.group_ms.append(ms)
    episode.sides.append(task.passing_side(scene, chunk, start=position))
    plan = ChunkPlan(chunk)
    current, current_time = chunk, 0
    pending: tuple[int, np.ndarray] | None = None
    t, index = 0, 0

    def advance(target: np.ndarray) -> bool:
        nonlocal t, position
        collided = _segment_collides(scene, position, target)
        position = np.asarray(target, dtype=np.float64).copy()
        episode.positions.append(position.copy())
        t += 1
        if collided:
            episode.collided = True
        elif np.linalg.norm(position - scene.target) <= task.TARGET_RADIUS:
            episode.reached = True
        return episode.collided or episode.reached

    if method.execution == "sync":
        while t < STEP_BUDGET:
            for k in range(EXECUTE):
                if advance(current[k]) or t >= STEP_BUDGET:
                    return episode
            index += 1
            for _ in range(delay):  # standing still while the next chunk is computed
                if advance(position) or t >= STEP_BUDGET:
                    return episode
            new, ms = draw(scene, position, method, seed + index, None)
            episode.group_ms.append(ms)
            episode.switches.append(t)
            episode.seams.append(float(np.linalg.norm(new[0] - current[EXECUTE])))
            episode.sides.append(task.passing_side(scene, new, start=position))
            current = new
        return episode

    while t < STEP_BUDGET:
        if t > 0 and t % EXECUTE == 0:
            index += 1
            context = None
            if method.guidance is not None:
                context = _context(current, current_time, t, delay, method.guidance)
            new, ms = draw(scene, position, method, seed + index, context)
            episode.group_ms.append(ms)
            pending = (t, new)
        if pending is not None and t == pending[0] + delay:
            planned_at, new = pending
            pending = None
            episode.switches.append(t)
            episode.seams.append(plan.take_over(method.execution, planned_at, new, delay, t, position))
            episode.sides.append(task.passing_side(scene, new, start=position))
            current, current_time = new, planned_at
        if advance(plan.target(t, position)):
            return episode
    return episode


def evaluate(model: Any, scenes: Sequence[task.Scene], methods: Sequence[str], delays: Sequence[int], *,
             steps: int, base_seed: int, log=print, on_scene=None,
             context_guidance: str = "prefix") -> dict[str, dict[int, list[Episode]]]:
    """Episodes per method and delay (held-out scene ``i`` uses seeds ``base_seed + 1000 i + chunk``, whatever the run it is in).

    ``on_scene(done, episodes, group_ms)`` is called after every scene (the bench writes its files there, so a run
    cut short still leaves the scenes it finished).
    """
    draw = Drawer(model, steps)
    table = method_table(context_guidance)
    out: dict[str, dict[int, list[Episode]]] = {name: {d: [] for d in delays} for name in methods}
    started = time.perf_counter()
    for i, scene in enumerate(scenes):
        for name in methods:
            for delay in delays:
                out[name][delay].append(run_episode(draw, scene, table[name], delay, scene_seed(base_seed, scene)))
        log(f"scene {i + 1}/{len(scenes)} done ({time.perf_counter() - started:.0f} s)")
        if on_scene is not None:
            on_scene(i + 1, out, median_group_ms(draw))
    return out


def median_group_ms(draw: Drawer) -> dict[str, float]:
    """Median wall time of the drawn groups per (N, guidance mode), in ms."""
    return {f"N={n} guidance={g}": float(np.median(v)) for (n, g), v in sorted(draw.group_ms.items())}


DEFINITIONS = {
    "s": f"actions executed per chunk ({EXECUTE} of {task.HORIZON}); the next chunk is requested while the other "
         f"{task.HORIZON - EXECUTE} are ahead",
    "success_rate": f"target reached (robot centre within {task.TARGET_RADIUS}) without collision within "
                    f"{STEP_BUDGET} steps",
    "collision_rate": f"an executed segment came within {task.COLLISION_CLEARANCE} of the obstacle edge",
    "mode_flips_per_episode": "changes of obstacle side between consecutive chunks of an episode (task.side of each "
                              "chunk's polyline from its planning position), over the chunks planned before the "
                              "robot passed the obstacle's far edge (task.passing_side)",
    "seam_jump_mean": "at each chunk switch, distance between the first waypoint executed under the new plan and the "
                      "waypoint the old plan had for that step (normalized units); mean over all switches",
    "seam_jump_max": "largest such jump over all switches",
    "jerk": "mean squared jerk of the executed path, ||third difference / dt^3||^2 (normalized units / s^3)",
    "steps_to_target": "control steps (waits included) of the episodes that reached the target",
    "intervals": "95%: Wilson for rates; percentile bootstrap over episodes (pooled switches for seams)",
}



def run(args: argparse.Namespace) -> int:
    """Run the closed-loop bench and write JSON, markdown and PNG; returns 0."""
    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
    from .closed_loop_report import write_markdown, write_plot

    torch.set_num_threads(int(getattr(args, "threads", None) or 1))
    delays = [int(d) for d in str(getattr(args, "delays", "0,2")).split(",") if d.strip()]
    methods = [m for m in str(getattr(args, "methods", ",".join(DEFAULT_METHODS))).split(",") if m.strip()]
    context_guidance = str(getattr(args, "context_guidance", None) or "prefix")
    table = method_table(context_guidance)
    unknown = [m for m in methods if m not in table]
    if unknown or any(d < 0 or d + EXECUTE > task.HORIZON for d in delays):
        raise SystemExit(f"unknown methods {unknown} or delays {delays} outside [0, {task.HORIZON - EXECUTE}]")
    steps = int(getattr(args, "steps", None) or task.NUM_INFERENCE_STEPS)
    base_seed = int(getattr(args, "base_seed", 0) or 0)
    pipeline = getattr(args, "pipeline", None)
    model = Cosmos3ActionModel(load_toy_pipeline(path=pipeline), max_batch_candidates=64)
    scenes = task.heldout_scenes(args.scenes, seed=args.scene_seed)
    log = (lambda m: None) if getattr(args, "quiet", False) else (lambda m: print(m, flush=True))
    out: Path = getattr(args, "json", None) or DEFAULT_JSON
    out.parent.mkdir(parents=True, exist_ok=True)
    started = utc_now()
    commit = git_commit()  # the code that runs, read once: HEAD may move while a long run goes on

    def write(done: int, episodes: dict[str, dict[int, list[Episode]]], group_ms: dict[str, float]) -> None:
        result: dict[str, Any] = {
            "closed_loop": {name: {str(d): summarize(episodes[name][d]) for d in delays} for name in methods},
            "settings": {
                "date": started, "commit": commit, "pipeline": str(pipeline or "shipped toy_policy"), "scenes": done,
                "scene_seeds": [scenes[0].seed, scenes[done - 1].seed], "base_seed": base_seed,
                "delays": delays, "s": EXECUTE, "chunk": task.HORIZON, "dt": DT, "step_budget": STEP_BUDGET,
                "num_inference_steps": steps, "context_guidance": context_guidance, "temporal_ensemble_m": TE_M,
                "weighted_average_old": WA_OLD,
                "methods": {name: vars(table[name]) for name in methods},
                "median_group_ms": group_ms, "torch_threads": torch.get_num_threads(),
            },
            "definitions": DEFINITIONS,
            "episodes": {name: {str(d): [e.record() for e in episodes[name][d]] for d in delays} for name in methods},
        }
        out.write_text(json.dumps(result))
        write_markdown(result, out.with_suffix(".md"))
        if done == len(scenes) or done % 10 == 0:
            write_plot(result, episodes, scenes[:done], out.with_suffix(".png"))

    evaluate(model, scenes, methods, delays, steps=steps, base_seed=base_seed, log=log, on_scene=write,
             context_guidance=context_guidance)
    log(f"wrote {out}, {out.with_suffix('.md')}, {out.with_suffix('.png')}")
    log(out.with_suffix(".md").read_text())
    return 0


MERGE_KEYS = ("pipeline", "num_inference_steps", "context_guidance", "delays", "s", "chunk", "step_budget",
              "base_seed", "methods")
"""Settings that runs must share to be merged (date and commit may differ)."""


def scene_ranges(settings: dict[str, Any]) -> list[tuple[int, int]]:
    """The held-out scene seed ranges ``(first, last)`` of a result: one for a run, several for a merged result."""
    seeds = settings["scene_seeds"]
    pairs = seeds if seeds and isinstance(seeds[0], (list, tuple)) else [seeds]
    return [(int(first), int(last)) for first, last in pairs]


def _check_mergeable(documents: Sequence[dict[str, Any]], paths: Sequence[Path]) -> None:
    """Refuse runs that differ in a :data:`MERGE_KEYS` setting or cover overlapping scenes."""
    first = documents[0]["settings"]
    for path, document in zip(paths[1:], documents[1:]):
        for key in MERGE_KEYS:
            mine, theirs = first.get(key), document["settings"].get(key)
            if mine != theirs:
                raise ValueError(f"cannot merge {str(path)!r} with {str(paths[0])!r}: {key} {theirs!r} != {mine!r}")
    ranges = sorted((first, last, str(p)) for d, p in zip(documents, paths)
                    for first, last in scene_ranges(d["settings"]))
    for (_, end, left), (start, _, right) in zip(ranges, ranges[1:]):
        if start <= end:
            raise ValueError(f"cannot merge {right!r} with {left!r}: their held-out scenes overlap (seed {start})")


def merge(paths: Sequence[Path], out: Path) -> dict[str, Any]:
    """Merge runs over disjoint scene ranges (same settings) into one result, re-summarized from their episodes."""
    from .closed_loop_report import write_markdown, write_plot

    documents = [json.loads(Path(p).read_text()) for p in paths]
    _check_mergeable(documents, paths)
    first = documents[0]
    episodes: dict[str, dict[int, list[Episode]]] = {}
    for document in documents:
        for name, per_delay in document["episodes"].items():
            for delay, records in per_delay.items():
                episodes.setdefault(name, {}).setdefault(int(delay), []).extend(map(Episode.from_record, records))
    settings = dict(first["settings"])
    settings["scenes"] = sum(d["settings"]["scenes"] for d in documents)
    settings["scene_seeds"] = [list(pair) for d in documents for pair in scene_ranges(d["settings"])]
    settings["median_group_ms"] = {k: float(np.median([d["settings"]["median_group_ms"].get(k, np.nan)
                                                       for d in documents]))
                                   for k in first["settings"]["median_group_ms"]}
    settings["merged_from"] = [str(p) for p in paths]
    # Runs may come from different commits (MERGE_KEYS leaves the code out); name every one, in run order.
    commits = list(dict.fromkeys(str(d["settings"].get("commit", "?")) for d in documents))
    settings["commit"] = ", ".join(commits)
    result = {
        "closed_loop": {name: {str(d): summarize(v) for d, v in per.items()} for name, per in episodes.items()},
        "settings": settings, "definitions": first["definitions"],
        "episodes": {name: {str(d): [e.record() for e in v] for d, v in per.items()} for name, per in episodes.items()},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result))
    write_markdown(result, out.with_suffix(".md"))
    scenes = [task.make_scene(seed) for d in documents for first, last in scene_ranges(d["settings"])
              for seed in range(first, last + 1)]
    write_plot(result, episodes, scenes, out.with_suffix(".png"))
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenes", type=int, default=50, help="held-out scenes")
    parser.add_argument("--scene-seed", type=int, default=0, help="first held-out scene offset")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="JSON output")
    parser.add_argument("--pipeline", type=Path, default=None, help="pipeline dir (default: the shipped toy)")
    add_closed_loop_options(parser)


def add_closed_loop_options(parser: argparse.ArgumentParser) -> None:
    """Options beyond ``--scenes/--scene-seed/--json`` (the bench CLI adds those itself)."""
    parser.add_argument("--delays", type=str, default="0,2", help="inference delays d in control steps")
    parser.add_argument("--methods", type=str, default=",".join(DEFAULT_METHODS),
                        help=f"comma-separated; extra: {', '.join(EXTRA_METHODS)}")
    parser.add_argument("--context-guidance", choices=GRADIENT_FREE, default="prefix",
                        help="guidance of the gradient-free methods (guided, guided_mode, guided_bid); 'mask' suits "
                             "a policy trained with clean action prefixes (train-toy --prefix-conditioning)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.toy.closed_loop", description=__doc__)
    add_arguments(parser)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="merge these result files (disjoint scene ranges) into --json instead of running")
    args = parser.parse_args(argv)
    if args.merge:
        try:
            merge(args.merge, args.json)
        except ValueError as exc:
            raise SystemExit(f"error: {exc}") from exc
        print(args.json.with_suffix(".md").read_text())
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
