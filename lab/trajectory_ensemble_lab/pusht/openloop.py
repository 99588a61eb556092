"""Open-loop error of a PushT checkpoint on expert demonstrations, beside holding the agent still.

    python -m trajectory_ensemble_lab.pusht.openloop --policy DIR --bags out/pusht/demos/bags --heldout-bags VAL \\
        --episodes 10 --every 4 --json bench/results/pusht_openloop.json
    python -m trajectory_ensemble_lab.pusht.openloop --policy DIR --states out/pusht/oracle_demos/states \\
        --heldout-states out/pusht/encoder/val/states --episodes 10 --every 4 --json OUT.json

``--states`` takes state-only episodes (``pusht-demos --states-only``) instead of bags: the frame is drawn from the
state, and the expert's labels (a DART episode's clean plan) are the reference. A policy that takes the agent's
position is sent it with each frame (:func:`.policy_state.request_state`), from bags and states alike.

For every ``--every``-th control step of each demonstration the policy (``OpenPIPolicy`` in process, one candidate,
or with ``--candidates N`` the mean of N; seed ``1000 + k`` for the k-th request) answers the recorded frame; the
error is the mean distance in env pixels between its first 8 rows (the executed ones) and the expert's next 8
targets. The baseline holds the agent where it is. A policy that fits its data beats the baseline on the training bags; one that does so there but not on the
validation bags does not generalize.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.provenance import git_commit, utc_now

from ..training import TrainingError
from .evaluate import EXECUTE, IMAGE_KEY, InProcessPolicy, serve_params
from .policy_state import request_state
from .recording import read_demo_bag
from .sim import PushTError, make_env, render_states
from .state_demos import read_episode
from .train import chunk_at, demo_bags, state_episode_files
from ..records import write_json


def chunk_errors(policy: Any, bag_paths: Sequence[Path], *, every: int = 4, seed: int = 1000,
                 candidates: int = 1) -> dict[str, Any]:
    """Errors of ``policy`` (``infer(obs)``) on every ``every``-th step of the demonstrations in ``bag_paths``.

    With ``candidates`` N > 1 each request draws N candidates and the server's reducer (``mean`` here) answers: a
    sampled candidate carries the spread of the policy's distribution, its mean only where the distribution is.

    Returns:
        `dict`: ``chunks``, ``error_px_median`` / ``_mean`` (policy) and ``hold_still_px_median`` / ``_mean``.
    """
    def frames():
        for bag in bag_paths:
            for episode in read_demo_bag(bag):
                for t in range(0, len(episode.actions), every):
                    yield episode.frames[t], episode.agent[t], chunk_at(episode.actions, t)[:EXECUTE]

    return {"bags": len(bag_paths), **_errors(policy, frames(), seed, candidates)}


def state_chunk_errors(policy: Any, files: Sequence[Path], *, every: int = 4, seed: int = 1000,
                       candidates: int = 1) -> dict[str, Any]:
    """:func:`chunk_errors` on state-only episodes: the frame drawn from state ``t``, the expert's labels
    ``t .. t + 7`` as the reference."""
    env = make_env(pixels=True)

    def frames():
        for path in files:
            episode = read_episode(path)
            steps = list(range(0, len(episode.labels), every))
            for frame, t in zip(render_states(episode.states[steps], env), steps):
                yield frame, episode.states[t], chunk_at(episode.labels, t)[:EXECUTE]

    return {"episodes": len(files), **_errors(policy, frames(), seed, candidates)}


def _agent_and_block(state: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """A bag's agent position ``[2]``, or a state-only episode's state ``[5]`` split into the agent and the T."""
    state = np.asarray(state, dtype=np.float64)
    return (state[:2], state[2:5]) if len(state) >= 5 else (state, None)


def _errors(policy: Any, frames, seed: int, candidates: int) -> dict[str, Any]:
    errors, hold, k = [], [], 0
    for frame, state, want in frames:
        reply = policy.infer({IMAGE_KEY: frame, "num_candidates": candidates, "seed": seed + k,
                              **request_state(policy.metadata, *_agent_and_block(state))})
        k += 1
        got = np.asarray(reply["actions"], dtype=np.float64)[:EXECUTE]
        errors.append(float(np.linalg.norm(got - want, axis=1).mean()))
        hold.append(float(np.linalg.norm(_agent_and_block(state)[0][None] - want, axis=1).mean()))
    return {"chunks": k, "error_px_median": float(np.median(errors)), "error_px_mean": float(np.mean(errors)),
            "hold_still_px_median": float(np.median(hold)), "hold_still_px_mean": float(np.mean(hold))}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.pusht.openloop", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", type=Path, required=True, help="a train-pusht checkpoint (with action_stats.json)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--bags", type=Path, help="training demonstration bags")
    source.add_argument("--states", type=Path, help="training state-only episodes (pusht-demos --states-only)")
    parser.add_argument("--heldout-bags", type=Path, default=None, help="demonstrations of validation starts")
    parser.add_argument("--heldout-states", type=Path, default=None,
                        help="state-only episodes of validation starts (with --states)")
    parser.add_argument("--episodes", type=int, default=10, help="bags of each set, in name order (10)")
    parser.add_argument("--every", type=int, default=4, help="control steps between the frames asked about (4)")
    parser.add_argument("--steps", type=int, default=10, help="denoising steps (10)")
    parser.add_argument("--candidates", type=int, default=1,
                        help="candidates per request; above 1 the chunk is their mean (1: one sampled candidate)")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    args = parser.parse_args(argv)
    if args.episodes < 1 or args.every < 1 or args.candidates < 1:
        print(f"error: --episodes, --every and --candidates must be >= 1, got {args.episodes}, {args.every} and "
              f"{args.candidates}", file=sys.stderr)
        return 2
    from trajectory_ensemble_node.serving.params import validate

    states = args.states is not None
    train, heldout = (args.states, args.heldout_states) if states else (args.bags, args.heldout_bags)
    roots = {"train": train, **({"validation": heldout} if heldout else {})}
    try:  # every input is checked before the policy loads, so a wrong folder is named at once
        listed = (lambda root: state_episode_files([root])) if states else demo_bags
        sets = {name: listed(root)[:args.episodes] for name, root in roots.items()}
        params = serve_params(args.policy, num_inference_steps=args.steps, candidate_count=args.candidates,
                              reducer="mean")
    except (TrainingError, PushTError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    policy = InProcessPolicy(validate(params))
    record: dict[str, Any] = {"date": utc_now(), "commit": git_commit(), "policy": str(args.policy),
                              "settings": {"episodes": args.episodes, "every": args.every, "steps": args.steps,
                                           "rows": EXECUTE, "candidates": args.candidates,
                                           "reducer": "none" if args.candidates == 1 else "mean"}}
    try:
        for name, bag_paths in sets.items():
            measure = state_chunk_errors if states else chunk_errors
            record[name] = measure(policy, bag_paths, every=args.every, candidates=args.candidates)
            r = record[name]
            print(f"{name}: policy {r['error_px_median']:.1f} px (median over {r['chunks']} chunks), holding still "
                  f"{r['hold_still_px_median']:.1f} px", flush=True)
    finally:
        policy.close()
    if args.json is not None:
        write_json(args.json, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
