"""``trajectory-ensemble bench --pusht``: reducers and continuity methods on PushT, closed loop, paired by seed.

    trajectory-ensemble bench --pusht --policy DIR --episodes K --seed S --methods single,mean,mode --count 8 \\
        [--delays 0,2,4 --continuity sync,naive_async,guided_mode] [--through process|openpi] --json PATH

Every episode is ``gym_pusht/PushT-v0`` as published; episode ``i`` uses reset seed ``S + i``, and its request ``c``
the base seed :func:`~.evaluate.request_seed` ``(S + i, c)``, so every method of one start draws from the same seeds
and the comparison is paired. Requests are the OpenPI wire's dicts, answered by the server's own policy in this
process (``--through process``, the default) or by openpi-client against a running ``serve-openpi``
(``--through openpi``): the same requests give the same episodes through both.

- **Reducers** (``--methods``, the ``pusht`` block): the env waits for each chunk (``d = 0``), executes its first 8 of
  16 rows, and asks again. ``single`` is candidate 0 of the same group of ``--count`` candidates (the reply's
  ``candidates[0]``); every other method is that reducer over the group.
- **Continuity** (``--continuity`` at ``--delays``, the ``continuity`` block): the methods of
  :mod:`trajectory_ensemble_lab.chunk_execution`, the ensemble ones (``bid``, ``guided_mode``) at N = ``--count``.
  A method with guidance continues the session's last chunk
  (``continue_previous``, ``inference_delay: d``, its ``guidance``, aligned by ``stamp``); the seam jump is the
  distance (env pixels) between the next target before and after a chunk takes over. A method with guidance does
  not run at ``d = 0``: ``inference_delay: 0`` asks for the server's latency estimate, not for no frozen rows.

Per method: mean max coverage with a bootstrap 95 % interval, success (coverage > 0.95, the env's ``is_success``)
with its Wilson interval, seams, and the chunk latency per candidate count against the 100 ms control period. A
method the server refuses (a reducer this model does not declare, a guidance it cannot serve) is named on stderr and
left out of the JSON, never reported as zero. ``--concurrent K`` plays K episodes at once, co-batched by the engine:
the same episodes, in about two thirds of the time on this CPU at K = 4.
"""

from __future__ import annotations

import argparse
import concurrent.futures as concurrent_futures
import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.errors import TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.stats import bootstrap_mean, wilson

from ..chunk_execution import ChunkPlan, Method, method_table
from . import INSTRUCTION, VALIDATION_SEED_BASE
from .bench_records import BenchEpisode
from .evaluate import (
    EXECUTE,
    IMAGE_KEY,
    SPLITS,
    ChunkPolicy,
    InProcessPolicy,
    WirePolicy,
    check_served,
    describe_error_frame,
    request_seed,
    serve_params,
)
from .policy_state import request_state
from .sim import CONTROL_HZ, MAX_STEPS, PushTError, make_env, read_state
from ..records import write_json

REDUCER_METHODS = ("single", "mean", "median", "medoid", "mode")
"""``--methods`` by default: every reducer at N, and ``single``, candidate 0 of the same group."""
CONTINUITY_METHODS = ("sync", "naive_async", "temporal_ensemble", "bid", "guided_mode")
OTHER_REDUCERS = ("first", "pose_gripper")
"""Reducers ``--methods`` also takes (one the model does not declare is refused by the server, named, left out)."""
THROUGH = ("process", "openpi", "node")
CONTROL_PERIOD_MS = 1000.0 / CONTROL_HZ


class MethodRefused(Exception):
    """The server refused a method's request with a named error: the method cannot run on this server."""


class Drawer:
    """Asks ``policy`` for one chunk of one method, in the wire's words, and times it.

    Args:
        policy (`ChunkPolicy`): Answers OpenPI request dicts.
        count (`int`): Candidates of the reducer methods' groups.
    """

    def __init__(self, policy: ChunkPolicy, count: int) -> None:
        self.policy, self.count = policy, count
        self.metadata = getattr(policy, "metadata", None) or {}
        self.latency_ms: dict[int, list[float]] = {}

    def reset(self, session: str) -> None:
        """Forget the session's chunk (a replayed start must not continue its last episode)."""
        self.policy.infer({"endpoint": "reset", "session_id": session})

    def __call__(self, frame: np.ndarray, *, seed: int, step: int, session: str, count: int, reducer: str,
                 first_candidate: bool = False, delay: int | None = None, guidance: str = "",
                 agent_pos: np.ndarray | None = None, block: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """The chunk ``[H, 2]`` (env pixels, float64) for the frame at ``step``, and the request's wall time in ms.
        ``agent_pos`` (env pixels) and ``block`` (the T's pose, for a lab ``pose`` model) are sent as the state when
        the served model takes one (:func:`.policy_state.request_state`).

        Raises:
            MethodRefused: the server refused the request with a named error.
        """
        request: dict[str, Any] = {IMAGE_KEY: frame, "prompt": INSTRUCTION, "seed": seed, "num_candidates": count,
                                   "reducer": reducer, "session_id": session, "stamp": step / CONTROL_HZ,
                                   "return_candidates": first_candidate,
                                   **(request_state(self.metadata, agent_pos, block) if agent_pos is not None else {})}
        if delay is not None:
            request.update(continue_previous=True, inference_delay=delay, guidance=guidance)
        started = time.perf_counter()
        try:
            reply = self.policy.infer(request)
        except TrajectoryEnsembleError as error:
            raise MethodRefused(describe_error(error)) from None
        except RuntimeError as error:  # openpi-client raises the server's error frame as RuntimeError
            raise MethodRefused(describe_error_frame(str(error))) from None
        elapsed = (time.perf_counter() - started) * 1000.0
        self.latency_ms.setdefault(count, []).append(elapsed)
        chunk = reply["candidates"][0] if first_candidate else reply["actions"]
        return np.asarray(chunk, dtype=np.float64), elapsed


def run_episode(draw: Drawer, env: Any, env_seed: int, method: Method, delay: int, *, name: str,
                first_candidate: bool = False, execute: int = EXECUTE, max_steps: int = MAX_STEPS) -> BenchEpisode:
    """Play one episode of ``method`` with inference delay ``delay`` (control steps) from reset seed ``env_seed``.

    Args:
        draw (`Drawer`): Serves the chunks.
        env: A ``make_env(pixels=True)`` env.
        env_seed (`int`): The reset seed; request ``c`` has base seed ``request_seed(env_seed, c)``.
        method (`Method`): Candidates, reducer, guidance and execution.
        delay (`int`): Steps the env goes on with the old chunk while the next is inferred (``sync``: stands still).
        name (`str`): The method's name (its session).
        first_candidate (`bool`): Execute candidate 0 of the group instead of the reduced chunk (``single``).
        execute (`int`): Rows of each chunk executed before the next request.
        max_steps (`int`): Step cap (the env's own limit is 300).
    """
    obs, _ = env.reset(seed=env_seed)
    episode = BenchEpisode(env_seed)
    session = f"bench-pusht-{name}-{delay}-{env_seed}"
    draw.reset(session)
    index = 0

    def request(t: int, continued: bool) -> np.ndarray:
        nonlocal index
        chunk, ms = draw(obs["pixels"], seed=request_seed(env_seed, index), step=t, session=session,
                         count=method.count, reducer=method.reducer, first_candidate=first_candidate,
                         delay=delay if continued else None, guidance=method.guidance or "",
                         agent_pos=obs["agent_pos"], block=read_state(env).block)
        index += 1
        episode.group_ms.append(ms)
        return chunk

    def advance(target: np.ndarray) -> bool:
        nonlocal obs
        obs, _, terminated, truncated, info = env.step(np.asarray(target, dtype=np.float32))
        episode.steps += 1
        episode.actions.append([float(v) for v in target])
        episode.max_coverage = max(episode.max_coverage, float(info["coverage"]))
        episode.success = episode.success or bool(info["is_success"])
        return bool(terminated or truncated) or episode.steps >= max_steps

    current = request(0, False)
    if method.execution == "sync":
        while True:
            for k in range(execute):
                if advance(current[k]):
                    return episode
            for _ in range(delay):  # standing still (at the last target) while the next chunk is computed
                if advance(current[execute - 1]):
                    return episode
            new = request(episode.steps, method.guidance is not None)
            episode.seams.append(float(np.linalg.norm(new[0] - current[execute])))
            current = new

    plan = ChunkPlan(current)
    hold = current[0]
    pending: tuple[int, np.ndarray] | None = None
    t = 0
    while True:
        if t > 0 and t % execute == 0:
            pending = (t, request(t, method.guidance is not None))
        if pending is not None and t == pending[0] + delay:
            planned_at, new = pending
            pending = None
            episode.seams.append(plan.take_over(method.execution, planned_at, new, delay, t, hold))
        hold = plan.target(t, hold)
        if advance(hold):
            return episode
        t += 1


def summarize(episodes: Sequence[BenchEpisode], *, trace: bool = False) -> dict[str, Any]:
    """One method's figures: coverage and success with their intervals, seams, requests, per-episode records."""
    successes = sum(e.success for e in episodes)
    coverage = [e.max_coverage for e in episodes]
    seams = [s for e in episodes for s in e.seams]
    low, high = wilson(successes, len(episodes))
    cov_low, cov_high = bootstrap_mean(coverage)
    keep = (lambda e: asdict(e)) if trace else (lambda e: {k: v for k, v in asdict(e).items() if k != "actions"})
    return {
        "episodes": len(episodes), "coverage_mean": float(np.mean(coverage)), "coverage_mean_ci95": [cov_low, cov_high],
        "success_rate": successes / len(episodes), "success_rate_ci95": [low, high], "successes": successes,
        "seam_jump_mean": float(np.mean(seams)) if seams else 0.0,
        "seam_jump_max": float(np.max(seams)) if seams else 0.0,
        "requests": sum(len(e.group_ms) for e in episodes),
        "per_episode": [keep(e) for e in episodes],
    }


def reducer_method(name: str, count: int) -> Method:
    """``single``: candidate 0 of a group of ``count``; any other name: that reducer over the group."""
    return Method(count, "mode" if name == "single" else name, None, "switch")


def bench(draw: Drawer, seeds: Sequence[int], *, methods: Sequence[str], continuity: Sequence[str],
          delays: Sequence[int], count: int, max_steps: int, trace: bool = False, concurrent: int = 1,
          log: Callable[[str], None] = print, refused: Callable[[str, str], None]) -> dict[str, Any]:
    """Every method on every start; a method the server refuses is reported to ``refused(name, why)`` and left out.

    Args:
        concurrent (`int`): Episodes played at once, each on its own env and session, so that the engine co-batches
            their groups. An episode's chunks depend only on its own frames and seeds, so the episodes are the
            ones a serial run plays; only the latency, which then includes co-batched work, differs.

    Returns:
        `dict`: ``{"pusht": {METHOD: figures}, "continuity": {METHOD: {d: figures}}}`` (``continuity`` only when
        methods are named).
    """
    runs = askable(plan_runs(methods, continuity, delays, count), refused)
    jobs = [(seed, run) for seed in seeds for run in runs]
    played: dict[tuple[int, str, str, int], BenchEpisode] = {}
    dropped: set[tuple[str, str]] = set()
    envs = threading.local()

    def play(job: tuple[int, tuple[str, str, Method, int, bool]]) -> None:
        seed, (block, name, method, delay, first) = job
        if (block, name) in dropped:
            return
        if not hasattr(envs, "env"):
            envs.env = make_env(pixels=True)
        try:
            episode = run_episode(draw, envs.env, seed, method, delay, name=name, first_candidate=first,
                                  max_steps=max_steps)
        except MethodRefused as why:
            if (block, name) not in dropped:
                dropped.add((block, name))
                refused(name, str(why))
            return
        played[(seed, block, name, delay)] = episode
        log(f"seed {seed} {name} d={delay}: max coverage {episode.max_coverage:.3f} "
            f"{'success' if episode.success else 'failure'} in {episode.steps} steps")

    with concurrent_futures.ThreadPoolExecutor(concurrent, thread_name_prefix="pusht-episode") as pool:
        for done in [pool.submit(play, job) for job in jobs]:
            done.result()
    episodes: dict[tuple[str, str, int], list[BenchEpisode]] = {}
    for seed, (block, name, _, delay, _) in jobs:  # in seed order, whatever order they finished in
        if (block, name) not in dropped and (seed, block, name, delay) in played:
            episodes.setdefault((block, name, delay), []).append(played[(seed, block, name, delay)])
    return collect(episodes, continuity=bool(continuity), trace=trace)


def askable(runs: Sequence[tuple[str, str, Method, int, bool]],
            refused: Callable[[str, str], None]) -> list[tuple[str, str, Method, int, bool]]:
    """The runs a request can express; the others go to ``refused(name, why)``.

    A continued request (guidance) at ``d = 0`` cannot be asked: ``inference_delay: 0``, over the wire as in a goal,
    means the server's latency estimate, measured on wall time against the sim's stamps. Its frozen rows would follow
    the host's speed, and the episode would not be the seed's.
    """
    kept = []
    for run in runs:
        _, name, method, delay, _ = run
        if delay == 0 and method.guidance is not None:
            refused(name, "not at d = 0: a continued request's inference_delay 0 asks for the server's latency "
                          "estimate (wall time), so no request freezes exactly 0 rows (run it at d >= 1)")
            continue
        kept.append(run)
    return kept


def plan_runs(methods: Sequence[str], continuity: Sequence[str], delays: Sequence[int],
              count: int) -> list[tuple[str, str, Method, int, bool]]:
    """``(block, name, method, delay, single)`` for every reducer method (at ``d = 0``) and continuity method and
    delay, the ensemble methods at N = ``count``."""
    table = method_table()
    runs = [("pusht", name, reducer_method(name, count), 0, name == "single") for name in methods]
    # The ensemble methods (bid, guided_mode) draw N = --count candidates, as the reducers do.
    ensemble = {name: dataclasses.replace(table[name], count=count) if table[name].count > 1 else table[name]
                for name in continuity}
    runs += [("continuity", name, ensemble[name], d, False) for name in continuity for d in delays]
    return runs


def collect(episodes: dict[tuple[str, str, int], list[BenchEpisode]], *, continuity: bool,
            trace: bool) -> dict[str, Any]:
    """The ``pusht`` and (with ``continuity``) ``continuity`` blocks of the JSON from each run's episodes."""
    out: dict[str, Any] = {"pusht": {}}
    if continuity:
        out["continuity"] = {}
    for (block, name, delay), found in episodes.items():
        if block == "pusht":
            out["pusht"][name] = summarize(found, trace=trace)
        else:
            out["continuity"].setdefault(name, {})[str(delay)] = summarize(found, trace=trace)
    return out


def latency(per_count_ms: dict[int, list[float]], concurrent: int = 1) -> dict[str, Any]:
    """Median and p95 wall time of a chunk per candidate count (a request, or a goal through the node), beside the
    control period; ``concurrent`` episodes shared the engine (above 1 it is no robot's per-chunk latency)."""
    per_count = {str(n): {"median_ms": float(np.median(v)), "p95_ms": float(np.percentile(v, 95)),
                          "requests": len(v)} for n, v in sorted(per_count_ms.items()) if v}
    return {"per_count": per_count, "control_period_ms": CONTROL_PERIOD_MS, "concurrent": concurrent}


def _names(text: str, choices: Sequence[str], flag: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in names if n not in choices]
    if bad:
        raise PushTError(f"{flag}: {bad} not among {list(choices)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--pusht`` mode's own flags (``--methods``, ``--delays``, ``--steps``, ``--through`` and ``--json`` are
    the bench's shared ones)."""
    group = parser.add_argument_group("--pusht")
    group.add_argument("--episodes", type=int, default=10, help="--pusht: episodes, reset seeds SEED .. SEED + K - 1")
    group.add_argument("--seed", type=int, default=None,
                       help=f"--pusht: first reset seed and base seed (default {VALIDATION_SEED_BASE}, the first "
                            "validation start)")
    group.add_argument("--count", type=int, default=8, help="--pusht: candidates N of the reducer methods (8)")
    group.add_argument("--policy", type=Path, default=None,
                       help="--pusht --through process|node: a PushT checkpoint (train-pusht's --out); default: the "
                            "bundled model: pusht")
    group.add_argument("--continuity", type=str, default="",
                       help=f"--pusht: continuity methods at --delays, comma-separated (of {list(CONTINUITY_METHODS)} "
                            "and the rest of chunk_execution's)")
    group.add_argument("--url", default="ws://127.0.0.1:8000", help="--pusht --through openpi: serve-openpi's address")
    group.add_argument("--api-key", default=None, help="--pusht --through openpi: the server's key")
    group.add_argument("--max-steps", type=int, default=MAX_STEPS, help="--pusht: step cap per episode (300)")
    group.add_argument("--trace", action="store_true", help="--pusht: keep each episode's executed actions")
    group.add_argument("--concurrent", type=int, default=1,
                       help="--pusht --through process|openpi: episodes played at once, co-batched by the engine "
                            "(the same episodes as one at a time; the latency then includes the others' work)")


def run(args: argparse.Namespace) -> int:
    """Run ``bench --pusht``; 0 done, 2 a refused setting (``NAME (code): message`` on stderr), 3 the node (``--through
    node``) did not come up or answer."""
    from trajectory_ensemble_node.cli.launcher import NodeStartError
    from trajectory_ensemble_node.cli.ros_client import NodeUnreachableError

    try:
        return _run(args)
    except TrajectoryEnsembleError as error:
        print(f"error: {describe_error(error)}", file=sys.stderr)
        return 2
    except (NodeStartError, NodeUnreachableError, TimeoutError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 3


def shipped_policy() -> Path:
    """The bundled ``model: pusht`` weights' folder, which ``--pusht`` serves without ``--policy``.

    Raises:
        PushTError: the installed package has no PushT weights (the message says how to build a checkpoint).
    """
    from trajectory_ensemble_node.bundled import bundled_policy

    bundled = bundled_policy("pusht")
    if bundled is None or not (bundled.directory / "model_index.json").is_file():
        raise PushTError("bench --pusht without --policy serves the bundled model: pusht, whose weights this install "
                         "lacks; give --policy DIR (a train-pusht checkpoint)")
    return bundled.directory


def _run(args: argparse.Namespace) -> int:
    # The code that ran is the code at the start: a long run can outlive commits made beside it.
    started, commit = utc_now(), git_commit()
    episodes, steps = args.episodes, args.steps or 10
    args.through = args.through or "process"
    if args.through not in THROUGH:
        raise PushTError(f"--pusht runs --through {' or '.join(THROUGH)}, got {args.through!r}")
    first = VALIDATION_SEED_BASE if args.seed is None else int(args.seed)
    low, high = SPLITS["validation"][0], SPLITS["heldout"][1]
    if episodes < 1 or first < 0 or first + episodes > high:
        raise PushTError(f"--seed {first} with --episodes {episodes} must stay in 0..{high - 1}")
    if first < low:
        print(f"bench --pusht: note: seeds {first}.. are demonstration starts (validation starts at {low})",
              file=sys.stderr)
    methods = _names(args.methods or ",".join(REDUCER_METHODS), REDUCER_METHODS + OTHER_REDUCERS, "--methods")
    continuity = _names(args.continuity, tuple(method_table()), "--continuity") if args.continuity else ()
    delays = tuple(int(d) for d in str(args.delays).split(",") if d.strip()) if continuity else (0,)
    count = args.count
    if count < 1 or any(not 0 <= d < EXECUTE for d in delays) or not 1 <= args.max_steps <= MAX_STEPS:
        raise PushTError(f"--count must be >= 1, --delays in 0..{EXECUTE - 1} and --max-steps in 1..{MAX_STEPS}; "
                         f"got {count}, {list(delays)} and {args.max_steps}")
    if args.concurrent < 1:
        raise PushTError(f"--concurrent must be >= 1, got {args.concurrent}")
    if args.through in ("process", "node") and args.policy is None:
        args.policy = shipped_policy()
    seeds = range(first, first + episodes)

    def report(line: str) -> None:
        print(line, flush=True)

    def refused(name: str, why: str) -> None:
        print(f"bench --pusht: method {name} cannot run: {why}", file=sys.stderr, flush=True)

    if args.through == "node":
        from .bench_node import play

        runs = askable(plan_runs(methods, continuity, delays, count), refused)
        log_dir = (args.json.parent if args.json is not None else Path("out/pusht")) / "bench_node"
        found = play(args.policy, runs, seeds, steps=steps, count=count, execute=EXECUTE, max_steps=args.max_steps,
                     log_dir=log_dir, log=report, refused=refused)
        result = collect(found, continuity=bool(continuity), trace=args.trace)
        per_count: dict[int, list[float]] = {}
        for (block, name, delay), episodes_found in found.items():
            method = next(m for b, n, m, d, _ in runs if (b, n, d) == (block, name, delay))
            per_count.setdefault(1 if name == "single" else method.count, []).extend(
                ms for e in episodes_found for ms in e.group_ms)
        result["latency"] = latency(per_count)
        served = {"model": str(args.policy.resolve())}
    else:
        if args.through == "process":
            from trajectory_ensemble_node.serving.params import validate

            policy: ChunkPolicy = InProcessPolicy(validate(serve_params(
                args.policy, num_inference_steps=steps, candidate_count=count, reducer="mode",
                groups_at_once=args.concurrent)))
        else:
            policy = WirePolicy(args.url, args.api_key)
        try:
            check_served(policy.metadata, EXECUTE, max(delays))
            draw = Drawer(policy, count)
            result = bench(draw, seeds, methods=methods, continuity=continuity, delays=delays, count=count,
                           max_steps=args.max_steps, trace=args.trace, concurrent=args.concurrent, log=report,
                           refused=refused)
            served = {k: policy.metadata.get(k) for k in ("model", "weights", "weights_version", "action_shape")}
        finally:
            policy.close()
        result["latency"] = latency(draw.latency_ms, args.concurrent)
    result["settings"] = {"through": args.through, "policy": str(args.policy) if args.policy else None,
                          "url": args.url if args.through == "openpi" else None, "seed": first,
                          "episodes": episodes, "methods": list(methods), "continuity": list(continuity),
                          "delays": list(delays), "count": count, "execute": EXECUTE, "max_steps": args.max_steps,
                          "concurrent": args.concurrent if args.through != "node" else 1,
                          "steps": steps if args.through == "process" else None, "served": served,
                          "env": "gym_pusht/PushT-v0 (gym-pusht 0.1.8)"}
    result["started"], result["date"], result["commit"] = started, utc_now(), commit
    for name, figures in result["pusht"].items():
        low, high = figures["success_rate_ci95"]
        print(f"{name}@{count}: mean max coverage {figures['coverage_mean']:.3f}, success {figures['successes']}/"
              f"{figures['episodes']} (95 % {low:.0%}..{high:.0%})", flush=True)
    if args.json is not None:
        write_json(args.json, result)
    return 0
