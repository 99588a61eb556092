"""``trajectory-ensemble pusht-dagger``: a DAgger round for the PushT policy, the expert taking over where it went.

The policy plays demonstration starts closed loop (in process, as ``bench --pusht`` serves it: N candidates, a
reducer, 8 of 16 rows executed). Every ``--every`` steps of its episode, the expert takes over from the exact state
the policy reached (positions and velocities, :func:`~.sim.set_env_state`) and plays ``--horizon`` clean steps from
there with a fresh plan. Each takeover is written as a state-only episode (``DIR/states``, the format of
``pusht-demos --states-only``) whose ``takeover_step`` says where it began; ``train-pusht --states DIR/states`` then
trains on it beside the demonstrations (:func:`.oracle.training_episodes` keeps every takeover, success or not: its
labels are the expert's). This is DAgger with the expert's own rollout as the label of each visited state, rather
than one action per state: the labels stay chunks of the expert's plan, as the demonstrations' are.

Only demonstration starts (below 100 000) are played: validation and held-out starts never become training data.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.errors import TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.provenance import git_commit, utc_now

from . import VALIDATION_SEED_BASE
from .demos import Episode
from .demos import run_episode as run_demo
from .evaluate import ChunkPolicy, EpisodeRecord, run_episode
from .sim import MAX_STEPS, PushTError, PushTState, make_env, read_state
from .state_demos import write_episode
from ..records import write_json

TAKEOVER_SEED_BASE = 10_000
"""A takeover's expert seed is ``TAKEOVER_SEED_BASE + step`` (its file name, and the seed of the expert's plan), so
the takeovers of one round never collide with each other or with a demonstration's seeds 0, 1, 2."""


def visited_states(env_seed: int, actions: Sequence[Sequence[float]], env: Any = None) -> list[PushTState]:
    """The full state at reset and after each executed action of an episode, replayed (gym-pusht is deterministic).

    Returns:
        `list[PushTState]` of length ``len(actions) + 1``.
    """
    env = env if env is not None else make_env()
    env.reset(seed=env_seed)
    states = [read_state(env)]
    for action in actions:
        env.step(np.asarray(action, dtype=np.float32))
        states.append(read_state(env))
    return states


def takeover(env_seed: int, state: PushTState, step: int, horizon: int, env: Any = None) -> Episode:
    """The expert's clean episode of at most ``horizon`` steps from ``state``, reached at ``step`` of start
    ``env_seed`` (:func:`.demos.run_episode` from that state); its plan budget is what the env's 300 steps leave.

    Raises:
        PushTError: ``horizon`` below 1, or ``step`` outside the env's 300 steps.
    """
    if horizon < 1 or not 0 <= step < MAX_STEPS:
        raise PushTError(f"takeover needs horizon >= 1 and 0 <= step < {MAX_STEPS}, got {horizon} and {step}")
    return run_demo(env_seed, TAKEOVER_SEED_BASE + step, max_steps=min(horizon, MAX_STEPS - step), env=env,
                    start=state, takeover_step=step)


def dagger_round(policy: ChunkPolicy, starts: Sequence[int], out: Path, *, every: int = 8, horizon: int = 64,
                 count: int = 8, reducer: str = "mode", log: Callable[[str], None] = print) -> dict[str, Any]:
    """Play each start with ``policy`` and write the expert's takeovers of its episode under ``out/states``.

    A start whose record (``out/episodes/<start>.json``, written after its takeovers) exists is skipped, its policy
    episode not played again, so a stopped round resumes.

    Args:
        policy (`ChunkPolicy`): The policy being improved, served with its state input if it declares one.
        starts (`Sequence[int]`): Demonstration starts (reset seeds below 100 000).
        out (`Path`): The round's folder.
        every (`int`): Steps between takeovers (8: every request of the policy's episode).
        horizon (`int`): Steps of each takeover.
        count (`int`), reducer (`str`): How the policy's chunks are drawn.

    Returns:
        `dict`: per start, the policy's episode (steps, max coverage, success) and the takeovers written.

    Raises:
        PushTError: a start outside the demonstration range, or ``every`` below 1.
    """
    bad = [s for s in starts if not 0 <= s < VALIDATION_SEED_BASE]
    if bad or every < 1:
        raise PushTError(f"a DAgger round plays demonstration starts 0..{VALIDATION_SEED_BASE - 1} with every >= 1, "
                         f"got start {bad[0] if bad else starts[0]} and every {every}")
    folder = out / "states"
    env, pixels_env = make_env(), make_env(pixels=True)
    episodes: list[dict[str, Any]] = []
    for start in starts:
        marker = out / "episodes" / f"{start:06d}.json"
        if marker.is_file():
            episodes.append(json.loads(marker.read_text()))
            continue
        record: EpisodeRecord = run_episode(policy, start, count=count, reducer=reducer, env=pixels_env)
        states = visited_states(start, record.actions, env)
        written = []
        for step in range(0, min(len(states) - 1, MAX_STEPS), every):
            if record.success and step >= record.steps:
                break
            ep = takeover(start, states[step], step, horizon, env)
            write_episode(folder, ep)
            written.append({"step": step, "steps": ep.steps, "max_coverage": round(ep.max_coverage, 4),
                            "success": ep.success})
        entry = {"env_seed": start, "steps": record.steps, "max_coverage": round(record.max_coverage, 4),
                 "success": record.success, "takeovers": written}
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(entry) + "\n")
        episodes.append(entry)
        log(f"start {start}: policy {record.steps} steps, max coverage {record.max_coverage:.3f}"
            f"{' (success)' if record.success else ''}; {len(written)} takeovers")
    takeovers = sum(len(e["takeovers"]) for e in episodes)
    return {"starts": len(episodes), "policy_successes": sum(e["success"] for e in episodes),
            "policy_mean_max_coverage": round(float(np.mean([e["max_coverage"] for e in episodes])), 4),
            "takeovers": takeovers,
            "takeover_steps": sum(t["steps"] for e in episodes for t in e["takeovers"]),
            "episodes": episodes}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``pusht-dagger`` options on ``parser``."""
    parser.add_argument("--policy", type=Path, required=True, help="a train-pusht checkpoint (--out)")
    parser.add_argument("--seed", type=int, default=0, help="first demonstration start")
    parser.add_argument("--episodes", type=int, default=50, help="starts played")
    parser.add_argument("--out", type=Path, default=Path("out/pusht/dagger1"),
                        help="the round's folder: states/ (train-pusht --states) and the round's record")
    parser.add_argument("--every", type=int, default=8, help="steps between takeovers")
    parser.add_argument("--horizon", type=int, default=64, help="steps of each takeover")
    parser.add_argument("--count", type=int, default=8, help="candidates per chunk of the policy")
    parser.add_argument("--reducer", default="mode", help="the policy's reducer")
    parser.add_argument("--steps", type=int, default=10, help="denoising steps")


def run(args: argparse.Namespace) -> int:
    """Play the round; write ``OUT/round.json``. A refused setting prints ``NAME (code): message`` and returns 2."""
    from trajectory_ensemble_node.serving.params import validate

    from .evaluate import InProcessPolicy, serve_params

    try:
        policy = InProcessPolicy(validate(serve_params(args.policy, num_inference_steps=args.steps,
                                                       candidate_count=args.count, reducer=args.reducer)))
        try:
            started, commit = utc_now(), git_commit()
            result = dagger_round(policy, range(args.seed, args.seed + args.episodes), args.out, every=args.every,
                                  horizon=args.horizon, count=args.count, reducer=args.reducer,
                                  log=lambda line: print(line, flush=True))
        finally:
            policy.close()
    except TrajectoryEnsembleError as error:
        print(f"error: {describe_error(error)}", file=sys.stderr)
        return 2
    result.update(policy=str(args.policy), every=args.every, horizon=args.horizon, count=args.count,
                  reducer=args.reducer, started=started, date=utc_now(), commit=commit)
    write_json(args.out / "round.json", result)
    print(f"{result['starts']} starts: policy {result['policy_successes']} successes, mean max coverage "
          f"{result['policy_mean_max_coverage']}; {result['takeovers']} takeovers, {result['takeover_steps']} steps",
          flush=True)
    return 0
