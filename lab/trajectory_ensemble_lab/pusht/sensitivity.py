"""How far a PushT policy's chunk moves when one input changes: the T in the frame, the T in the state, the agent.

A policy that solves PushT must act on where the T is. This probe asks which input the policy takes the T from.
For states ``s`` of state-only episodes (``pusht-demos --states-only``, every ``--every``-th step) and, for each, the
state ``o`` of another one (a fixed permutation), the same request (one candidate, the same seed) is sent with
``s`` and with one input taken from ``o``:

- ``frame_T``: the frame drawn (gym-pusht's renderer) with ``o``'s T, the state input unchanged;
- ``state_T``: the state input with ``o``'s T, the frame unchanged (only for a model that takes the T's pose:
  ``train-pusht --state-input pose``, a lab diagnostic);
- ``state_agent``: the state input with ``o``'s agent position, the frame unchanged;
- ``seed``: nothing changed but the seed: the sampling spread, for scale.

Each is the mean distance (env pixels) between the two chunks' executed rows. Same seed, same noise: what moves the
chunk is the input alone.

    python -m trajectory_ensemble_lab.pusht.sensitivity --policy DIR --states VAL_STATES --json OUT.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.serving.params import validate

from .evaluate import EXECUTE, IMAGE_KEY, InProcessPolicy, serve_params
from .policy_state import POSE_STATE_NAMES, request_state
from .sim import make_env, render_states
from .state_demos import read_episode
from .train import state_episode_files
from ..records import write_json

CHANGES = ("frame_T", "state_T", "state_agent", "seed")
SEED_OFFSET = 10_000
"""The ``seed`` change's request seed is the base one plus this (a noise draw no other request uses)."""


def sensitivity(policy: Any, states: np.ndarray, *, seed: int = 0) -> dict[str, Any]:
    """The probe over ``states``.

    Args:
        policy: Answers openpi's ``infer`` and has the handshake's ``metadata`` (:class:`.evaluate.InProcessPolicy`).
        states (`np.ndarray` of shape `[K, 5]`): Agent ``(x, y)``, T ``(x, y, angle)``.
        seed (`int`): Seeds the permutation that pairs each state with another.

    Returns:
        `dict`: per change of :data:`CHANGES` that applies, ``mean_px`` and ``median_px`` over the states; ``states``.
    """
    states = np.asarray(states, dtype=np.float64)
    other = states[np.random.default_rng(seed).permutation(len(states))]
    takes_pose = set(POSE_STATE_NAMES) <= set((policy.metadata.get("state") or {}).get("names") or ())
    env = make_env(pixels=True)

    def chunk(frame: np.ndarray, state: np.ndarray, request_seed: int) -> np.ndarray:
        reply = policy.infer({IMAGE_KEY: frame, "num_candidates": 1, "seed": request_seed,
                              **request_state(policy.metadata, state[:2], state[2:5])})
        return np.asarray(reply["actions"], dtype=np.float64)[:EXECUTE]

    moved: dict[str, list[float]] = {name: [] for name in CHANGES}
    for k, (s, o) in enumerate(zip(states, other)):
        with_t, with_agent = s.copy(), s.copy()
        with_t[2:5], with_agent[:2] = o[2:5], o[:2]
        frame, frame_t = render_states(np.stack([s, with_t]), env)
        base = chunk(frame, s, k)

        def distance(rows: np.ndarray) -> float:
            return float(np.linalg.norm(rows - base, axis=1).mean())

        moved["frame_T"].append(distance(chunk(frame_t, s, k)))
        if takes_pose:
            moved["state_T"].append(distance(chunk(frame, with_t, k)))
        if (policy.metadata.get("state") or {}).get("names"):
            moved["state_agent"].append(distance(chunk(frame, with_agent, k)))
        moved["seed"].append(distance(chunk(frame, s, k + SEED_OFFSET)))
    return {"states": len(states),
            **{name: {"mean_px": round(float(np.mean(values)), 2), "median_px": round(float(np.median(values)), 2)}
               for name, values in moved.items() if values}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.pusht.sensitivity",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True, help="a PushT checkpoint (train-pusht --out)")
    parser.add_argument("--states", type=Path, required=True, help="a folder of state-only episodes")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--every", type=int, default=16, help="control steps between probed states")
    parser.add_argument("--steps", type=int, default=10, help="denoising steps")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    files = state_episode_files([args.states])[:args.episodes]
    states = np.concatenate([read_episode(path).states[::args.every] for path in files])
    policy = InProcessPolicy(validate(serve_params(args.policy, num_inference_steps=args.steps, candidate_count=1)))
    try:
        result = {"date": utc_now(), "commit": git_commit(), "policy": str(args.policy), "episodes": len(files),
                  "every": args.every, "steps": args.steps, **sensitivity(policy, states)}
    finally:
        policy.close()
    print(json.dumps(result))
    if args.json is not None:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
