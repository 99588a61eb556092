"""DAgger for the toy policy (``train-toy --dagger-rounds K``): train on the states the policy itself visits.

A policy trained on expert states only has never seen where its own chunks take the robot: a little off a detour,
late, short of the target, circling it. DAgger (Ross et al. 2011) closes that gap. Each round:

1. **Roll out** the current policy in closed loop on training scenes, through the in-process bench's serving path
   (:func:`.closed_loop.run_episode` on ``Cosmos3ActionModel``), with the methods users run (``--dagger-methods``,
   default ``guided_mode`` and ``naive_async``) at the delays that matter (``--dagger-delays``, default 0 and 2).
2. **Relabel** the positions the robot passed through (every ``--dagger-stride`` steps, nearer than
   :data:`DEDUP_DISTANCE` to none kept before in that scene) with what the expert would do from there
   (:func:`relabel`): the time-consistent continuation of the expert detour the robot is nearest to, returning to it
   at :data:`RETURN_SPEED` per step. Positions where the robot has not yet committed to a side keep both detours.
3. **Aggregate** the encoded states with every earlier round's and with the base dataset (initial scenes with both
   detours, expert mid-episode and closed-loop states, recovery states near the target: ``train-toy``'s own
   options), and **fine-tune** the current policy on all of it (``--dagger-steps``, ``--dagger-lr``), drawing
   ``--bimodal-share`` of every batch from the states with both detours, so ``mean`` still averages two valid
   detours into a collision.

Round 0 is the plain ``train-toy`` run the options describe (``--init``, ``--steps``...; ``--steps 0`` starts from
``--init`` as it is). Scenes: round ``r`` rolls out training seeds ``(r - 1) M .. r M - 1`` modulo ``--scenes``
(``M`` = ``--dagger-scenes``), all in the task's training range; held-out seeds are for evaluation only. Every round
keeps its policy, its visited states (JSON), their encoding and a summary under ``--work-dir``/``round_<r>``; a
rerun with the same options resumes after the last finished round.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.toy import load_toy_pipeline, task
from trajectory_ensemble_node.toy.episodes import Episode, summarize
from .closed_loop import Drawer, method_table, run_episode
from .data import ToyDataset, build_dataset, concat_datasets, encode_labelled
from .objective import fit
from .pipeline import load_for_training, save_pipeline
from .validation import open_loop, validation_scenes
from ..records import write_json

RETURN_SPEED = 0.1
"""How fast (normalized units per control step) a relabelled chunk takes the robot back onto its expert detour.
Time-consistent: executing ``s`` actions and relabelling from there gives the rest of the same chunk."""
DEDUP_DISTANCE = 0.01
"""A visited position nearer than this to one already kept in the same scene adds no state."""
PROGRESS_GRID = np.linspace(0.0, 1.0, 401)
"""Path times at which the nearest point of an expert detour is searched (1/50 of a control step apart)."""
DAGGER_SEED_BASE = 20_000_000
"""Candidate seeds of round ``r``, training scene ``i``, chunk ``c``: ``DAGGER_SEED_BASE + 1_000_000 r + 1000 i + c``."""
DEFAULT_METHODS = ("guided_mode", "naive_async")
DEFAULT_DELAYS = (0, 2)


# --- relabelling -----------------------------------------------------------------------------------------------------


def nearest_progress(initial: task.Scene, side_sign: int, position: np.ndarray) -> tuple[float, np.ndarray, float]:
    """Where ``position`` is along the expert detour on ``side_sign`` planned from the episode's start.

    Args:
        initial (`task.Scene`): The episode's initial scene (``robot == start``).
        side_sign (`int`): The detour, +1 or -1 (:func:`task.side`).
        position (`np.ndarray` of shape `[2]`): The robot.

    Returns:
        `tuple`: progress in control steps (``0 .. HORIZON``), the detour's point there ``[2]``, and its distance.
    """
    points = task.expert_curve(initial, side_sign, PROGRESS_GRID)
    distances = np.linalg.norm(points - np.asarray(position, dtype=np.float64), axis=1)
    i = int(np.argmin(distances))
    return float(PROGRESS_GRID[i] * task.HORIZON), points[i], float(distances[i])


def continuation_from(initial: task.Scene, side_sign: int, position: np.ndarray,
                      speed: float = RETURN_SPEED) -> np.ndarray:
    """The expert chunk ``[H, 2]`` of a robot at ``position`` near the detour ``side_sign``.

    It is :func:`task.expert_continuation` from the nearest point of that detour, plus the robot's offset from that
    point shrinking by ``speed`` per step: the detour at the expert's own speed, rejoined from where the robot is.
    """
    progress, point, _ = nearest_progress(initial, side_sign, position)
    path = task.expert_continuation(initial, side_sign, progress)
    offset = np.asarray(position, dtype=np.float64) - point
    norm = float(np.linalg.norm(offset))
    if norm == 0.0:
        return path
    keep = np.clip(1.0 - speed * np.arange(1, task.HORIZON + 1) / norm, 0.0, 1.0)
    return path + keep[:, None] * offset


def relabel(initial: task.Scene, position: np.ndarray) -> list[np.ndarray]:
    """The expert's chunks for a robot at ``position`` in the episode of ``initial``: one per side it may take.

    - Not yet past the obstacle (:func:`task.passing_side`) and about as near one detour as the other (within
      :data:`task.BIMODAL_BAND`, e.g. at the start): both detours, as in an initial scene.
    - Otherwise the detour the robot is nearest to (past the obstacle both end at the target).

    A chunk is kept only if it keeps :data:`task.EXPERT_CLEARANCE` from the obstacle, or, for a robot already
    closer, the robot's own clearance, less 0.01 either way (the expert's continuations from fractional progress
    keep at least 0.115: their chords fall between the waypoints the expert's bump was fitted to): a label never
    leads nearer the obstacle than the robot is.

    Args:
        initial (`task.Scene`): The episode's initial scene.
        position (`np.ndarray` of shape `[2]`): The robot.

    Returns:
        `list[np.ndarray]`: zero to two chunks ``[H, 2]``; none for a robot in collision or with no safe chunk.
    """
    position = np.asarray(position, dtype=np.float64)
    state = initial.with_robot(position)
    own = float(np.linalg.norm(position - initial.obstacle)) - initial.radius
    if own < task.COLLISION_CLEARANCE:
        return []
    distance = {side_sign: nearest_progress(initial, side_sign, position)[2] for side_sign in (1, -1)}
    passed = task.passing_side(initial, position[None], start=position) == 0
    if not passed and abs(distance[1] - distance[-1]) < task.BIMODAL_BAND:
        sides = (1, -1)
    else:
        sides = (min(distance, key=distance.get),)
    required = min(task.EXPERT_CLEARANCE, own) - 0.01
    chunks = [continuation_from(initial, side_sign, position) for side_sign in sides]
    return [chunk for chunk in chunks if task.clearance(state, chunk) >= required]


# --- rollouts --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Visit:
    """A position the robot passed through in a rollout.

    Args:
        seed (`int`): The training scene seed (``task.make_scene``).
        position (`np.ndarray` of shape `[2]`): The robot.
        method (`str`): The closed-loop method of the episode.
        delay (`int`): Its inference delay (control steps).
        step (`int`): The control step the robot was there.
    """

    seed: int
    position: np.ndarray
    method: str
    delay: int
    step: int

    def record(self) -> dict[str, Any]:
        return {"seed": self.seed, "position": [float(v) for v in self.position], "method": self.method,
                "delay": self.delay, "step": self.step}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Visit:
        return cls(int(record["seed"]), np.asarray(record["position"], dtype=np.float64), str(record["method"]),
                   int(record["delay"]), int(record["step"]))


def visited(episode: Episode, stride: int) -> list[tuple[int, np.ndarray]]:
    """``(step, position)`` every ``stride`` steps of an episode, the start left out (the base dataset has it)."""
    return [(t, np.asarray(p, dtype=np.float64)) for t, p in enumerate(episode.positions) if t > 0 and t % stride == 0]


def rollout(model: Any, seeds: Sequence[int], methods: Sequence[str], delays: Sequence[int], *, round_index: int,
            stride: int = 2, steps: int = task.NUM_INFERENCE_STEPS,
            log=print) -> tuple[list[Visit], dict[str, dict[int, list[Episode]]]]:
    """Closed-loop episodes of ``model`` on training scenes, and the positions they visited.

    Args:
        model: A ``Cosmos3ActionModel`` serving the policy.
        seeds (`Sequence[int]`): Training scene seeds.
        methods (`Sequence[str]`): Closed-loop method names (:data:`.closed_loop.METHODS`).
        delays (`Sequence[int]`): Inference delays in control steps.
        round_index (`int`): The DAgger round (part of the candidate seeds, :data:`DAGGER_SEED_BASE`).
        stride (`int`): Keep a position every this many steps.
        steps (`int`): Denoising steps per chunk.

    Returns:
        `tuple`: the kept visits (deduplicated per scene within :data:`DEDUP_DISTANCE`) and the episodes per method
        and delay.
    """
    draw = Drawer(model, steps)
    table = method_table()
    episodes: dict[str, dict[int, list[Episode]]] = {name: {d: [] for d in delays} for name in methods}
    visits: list[Visit] = []
    started = time.perf_counter()
    for n, seed in enumerate(seeds):
        scene = task.make_scene(task.TRAIN_SEED_BASE + seed)
        base_seed = DAGGER_SEED_BASE + 1_000_000 * round_index + 1000 * seed
        kept: list[np.ndarray] = [scene.robot]
        for name in methods:
            for delay in delays:
                episode = run_episode(draw, scene, table[name], delay, base_seed)
                episodes[name][delay].append(episode)
                for t, position in visited(episode, stride):
                    if min(float(np.linalg.norm(position - k)) for k in kept) < DEDUP_DISTANCE:
                        continue
                    kept.append(position)
                    visits.append(Visit(seed, position, name, delay, t))
        if (n + 1) % 10 == 0 or n + 1 == len(seeds):
            log(f"rolled out {n + 1}/{len(seeds)} scenes, {len(visits)} visits ({time.perf_counter() - started:.0f} s)")
    return visits, episodes


def label_visits(visits: Sequence[Visit]) -> list[tuple[task.Scene, list[np.ndarray]]]:
    """The visits :func:`relabel` gives a chunk, as ``(state, chunks)`` for :func:`.data.encode_labelled`."""
    labelled = []
    for visit in visits:
        initial = task.make_scene(task.TRAIN_SEED_BASE + visit.seed)
        chunks = relabel(initial, visit.position)
        if chunks:
            labelled.append((initial.with_robot(visit.position), chunks))
    return labelled


# --- the loop --------------------------------------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in method_table()]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"must name closed-loop methods out of {sorted(method_table())}, got {text!r}")
    return names


def _delays(text: str) -> tuple[int, ...]:
    try:
        delays = tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        delays = ()
    if not delays or any(not 0 <= d <= task.HORIZON // 2 for d in delays):
        raise argparse.ArgumentTypeError(f"must be delays in [0, {task.HORIZON // 2}], got {text!r}")
    return delays


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the DAgger options of ``train-toy``."""
    parser.add_argument("--dagger-rounds", type=int, default=0,
                        help="after the run the options describe (round 0), this many DAgger rounds: roll out, "
                             "relabel with the expert, aggregate, fine-tune (0 = none)")
    parser.add_argument("--dagger-scenes", type=_positive, default=128, help="training scenes rolled out per round")
    parser.add_argument("--dagger-methods", type=_names, default=DEFAULT_METHODS,
                        help="closed-loop methods of the rollouts (comma-separated)")
    parser.add_argument("--dagger-delays", type=_delays, default=DEFAULT_DELAYS,
                        help="inference delays of the rollouts (comma-separated control steps)")
    parser.add_argument("--dagger-stride", type=_positive, default=2, help="keep a visited position every N steps")
    parser.add_argument("--dagger-steps", type=_positive, default=1000, help="fine-tuning steps per round")
    parser.add_argument("--dagger-lr", type=float, default=1e-4, help="peak learning rate of each round's fine-tune")
    parser.add_argument("--dagger-validate", type=int, default=0, metavar="S",
                        help="after every round, open-loop checks of its policy on S validation scenes (training-range "
                             "seeds no run trains on; .validation); 0 = none")


def _round_args(args: argparse.Namespace, round_index: int) -> argparse.Namespace:
    """The options of round ``round_index``'s fine-tune: DAgger's steps and rate, a seed of its own."""
    fine = copy.copy(args)
    fine.steps, fine.lr, fine.seed = args.dagger_steps, args.dagger_lr, args.seed + 100 * round_index
    return fine


def _settings(args: argparse.Namespace) -> dict[str, str]:
    # What a finished round must have been run with for a rerun to resume after it.
    keep = ("init", "scenes", "mid_probability", "closed_loop_states", "recovery_states", "bimodal_share", "steps",
            "lr", "batch", "seed", "sigma_shift", "vision_weight", "ema", "dagger_scenes", "dagger_methods",
            "dagger_delays", "dagger_stride", "dagger_steps", "dagger_lr", "dagger_validate")
    return {k: str(getattr(args, k)) for k in keep}


def _outcomes(episodes: dict[str, dict[int, list[Episode]]]) -> dict[str, dict[str, dict[str, float]]]:
    return {name: {str(d): {k: summarize(v)[k] for k in ("success_rate", "collision_rate", "seam_jump_mean")}
                   for d, v in per.items()} for name, per in episodes.items()}


def _validate(policy: Path, scenes: int, log) -> dict[str, float] | None:
    if scenes <= 0:
        return None
    started = time.perf_counter()
    result = open_loop(Cosmos3ActionModel(load_toy_pipeline(path=policy), max_batch_candidates=64),
                       validation_scenes(scenes))
    log(f"{policy} on {scenes} validation scenes: {json.dumps(result)} ({time.perf_counter() - started:.0f} s)")
    return result


def _finished(round_dir: Path, settings: dict[str, str]) -> dict[str, Any] | None:
    summary = round_dir / "summary.json"
    if not summary.exists() or not (round_dir / "policy" / "model_index.json").exists():
        return None
    record = json.loads(summary.read_text())
    return record if record.get("settings") == settings else None


def run_dagger(args: argparse.Namespace) -> int:
    """Round 0 (the plain run), then ``args.dagger_rounds`` DAgger rounds; the last policy is saved to ``args.out``.

    Writes ``--work-dir``/``dagger.json``: per round its scenes, visits, states, rollout outcomes on those training
    scenes (success, collisions, seams per method and delay: the policy's progress where it is trained), loss and
    wall times.
    """
    log = lambda message: print(message, flush=True)  # noqa: E731
    work_dir: Path = args.work_dir
    work_dir.mkdir(parents=True, exist_ok=True)
    settings = _settings(args)
    started = time.perf_counter()
    torch.set_num_threads(args.encode_threads)
    report: dict[str, Any] = {"date": utc_now(), "commit": git_commit(), "settings": settings, "rounds": []}

    round0 = work_dir / "round_0"
    record = _finished(round0, settings)
    pipe = load_for_training(args.init, args.seed)
    base = build_dataset(pipe, args.scenes, mid_probability=args.mid_probability,
                         closed_loop_states=args.closed_loop_states, recovery_states=args.recovery_states,
                         cache_dir=work_dir, log=log)
    if record is None:
        round_started = time.perf_counter()
        if args.steps > 0:
            result = fit(pipe, base, args, round0 / "policy", work_dir)
        else:
            save_pipeline(pipe, round0 / "policy", getattr(torch, args.save_dtype))
            result = {"states": base.num_states, "examples": len(base.actions)}
        record = {"round": 0, "settings": settings, **result,
                  "wall_seconds": round(time.perf_counter() - round_started, 1),
                  "validation": _validate(round0 / "policy", args.dagger_validate, log)}
        write_json(round0 / "summary.json", record)
    else:
        log(f"round 0 already done ({round0})")
    report["rounds"].append(record)
    parts: list[ToyDataset] = [base]
    policy = round0 / "policy"

    for r in range(1, args.dagger_rounds + 1):
        round_dir = work_dir / f"round_{r}"
        round_dir.mkdir(parents=True, exist_ok=True)
        record = _finished(round_dir, settings)
        encoded = round_dir / "states.pt"
        if record is not None and encoded.exists():
            log(f"round {r} already done ({round_dir})")
            parts.append(ToyDataset(**torch.load(encoded, weights_only=False)))
            report["rounds"].append(record)
            policy = round_dir / "policy"
            continue
        round_started = time.perf_counter()
        torch.set_num_threads(args.threads)
        seeds = [(s % args.scenes) for s in range((r - 1) * args.dagger_scenes, r * args.dagger_scenes)]
        model = Cosmos3ActionModel(load_toy_pipeline(path=policy), max_batch_candidates=64)
        log(f"round {r}: rolling out {policy} on training scenes {seeds[0]}..{seeds[-1]}")
        visits, episodes = rollout(model, seeds, args.dagger_methods, args.dagger_delays, round_index=r,
                                   stride=args.dagger_stride, log=log)
        rollout_s = time.perf_counter() - round_started
        outcomes = _outcomes(episodes)
        log(f"round {r} rollouts: {json.dumps(outcomes)}")
        labelled = label_visits(visits)
        (round_dir / "visits.json").write_text(json.dumps({"visits": [v.record() for v in visits],
                                                           "labelled": len(labelled)}))
        del model
        pipe = load_for_training(policy, args.seed)
        torch.set_num_threads(args.encode_threads)
        encode_started = time.perf_counter()
        new = encode_labelled(pipe, labelled, log=log)
        torch.save(new.__dict__, encoded)
        encode_s = time.perf_counter() - encode_started
        parts.append(new)
        data = concat_datasets(parts)
        result = fit(pipe, data, _round_args(args, r), round_dir / "policy", work_dir)
        record = {"round": r, "settings": settings, "scenes": [seeds[0], seeds[-1]], "visits": len(visits),
                  "new_states": new.num_states, "new_examples": len(new.actions), "rollouts": outcomes,
                  "rollout_seconds": round(rollout_s, 1), "encode_seconds": round(encode_s, 1), **result,
                  "wall_seconds": round(time.perf_counter() - round_started, 1),
                  "validation": _validate(round_dir / "policy", args.dagger_validate, log)}
        write_json(round_dir / "summary.json", record)
        report["rounds"].append(record)
        policy = round_dir / "policy"
        log(f"round {r} done in {record['wall_seconds'] / 60:.1f} min: {len(visits)} visits, {new.num_states} "
            f"states; final loss {result['final_loss']}")

    # The last round's policy as saved (fp16), file for file.
    shutil.copytree(policy, args.out, dirs_exist_ok=True)
    size = sum(f.stat().st_size for f in Path(args.out).rglob("*") if f.is_file())
    report["wall_seconds"] = round(time.perf_counter() - started, 1)
    report["saved_bytes"] = size
    write_json(work_dir / "dagger.json", report)
    log(f"saved {args.out} ({size / 1e6:.2f} MB) from {policy} after {report['wall_seconds'] / 60:.1f} min")
    last = report["rounds"][-1].get("final_loss")
    return 0 if last is None or math.isfinite(last["loss"]) else 1
