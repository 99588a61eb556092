"""``trajectory-ensemble pusht-eval``: closed-loop PushT episodes served through the OpenPI wire, as openpi and LeRobot
evaluation loops run them.

    trajectory-ensemble serve-openpi --params-file PARAMS --port 8000 &      # PARAMS from --write-params
    trajectory-ensemble pusht-eval --through openpi --url ws://127.0.0.1:8000 --episodes 20 --json out/eval.json
    trajectory-ensemble pusht-eval --through python --policy out/pusht/policy --episodes 20 --json out/eval.json

Each episode is ``gym_pusht/PushT-v0`` as published (its reset seed, its 300-step limit, its ``info["coverage"]`` and
``info["is_success"]``). Each request carries the env's rendered 96x96 frame; the reply's ``actions`` (a chunk of
absolute targets in env pixels, since the server denormalizes with ``action_stats_file``) has its first ``execute``
rows stepped, then the next request goes out. With an inference delay ``d`` the env keeps executing the previous
chunk for ``d`` steps while the next is inferred, and the request asks the server to ``continue_previous`` that chunk
(the session's ``ChunkMemory``, aligned by the observation's ``stamp``); rows ``d .. execute - 1`` of the new chunk
follow. The first request of an episode has no chunk to continue, so the env waits for it.

Two policies answer ``infer(obs)`` the same way (:class:`ChunkPolicy`): openpi-client's ``WebsocketClientPolicy``
against a running ``serve-openpi`` (``--through openpi``), and the server's own :class:`OpenPIPolicy` in this process
(``--through python``). Every request names its base seed (:func:`request_seed`), so the same starts give the same
chunks, steps and coverage through both, bit for bit.

Seeds are gym-pusht reset seeds of one split (``--split``, validation by default: 100 000 .. 199 999); a range that
leaves its split is refused, so the held-out starts are measured only when asked by name.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from trajectory_ensemble_node.errors import TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.stats import bootstrap_mean, wilson

from . import DEMO_SEED_BASE, HELDOUT_SEED_BASE, INSTRUCTION, VALIDATION_SEED_BASE
from .policy_state import request_state
from .sim import CONTROL_HZ, MAX_STEPS, PushTError, make_env, read_state
from ..commands import run_command
from ..records import write_json

EXECUTE = 8
"""Rows of each chunk executed before the next request (Diffusion Policy's 8 of 16)."""
SPLITS = {"demo": (DEMO_SEED_BASE, VALIDATION_SEED_BASE), "validation": (VALIDATION_SEED_BASE, HELDOUT_SEED_BASE),
          "heldout": (HELDOUT_SEED_BASE, 2**32)}
"""Reset-seed ranges ``[low, high)`` (gym-pusht seeds are below 2**32); ``heldout`` is measured once, by name."""
API_KEY_ENV = "TRAJECTORY_ENSEMBLE_API_KEY"
IMAGE_KEY = "observation/image"
STEPS_LIMIT_PER_REQUEST = MAX_STEPS
"""Requests per episode are at most the env's 300 steps (one row executed per request), so seeds never collide."""


class ChunkPolicy(Protocol):
    """What the loop needs of a policy: openpi's ``infer`` (``{"endpoint": "reset"}`` included) and the handshake's
    metadata."""

    metadata: dict[str, Any]

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]: ...

    def close(self) -> None: ...


class WirePolicy:
    """openpi-client's ``WebsocketClientPolicy`` (unchanged, from PyPI) against a running ``serve-openpi``.

    Args:
        url (`str`): ``ws://HOST:PORT`` (a path such as ``/v1/realtime/robot/openpi`` may follow).
        api_key (`str`, *optional*): Sent as ``Authorization: Api-Key KEY``.

    Raises:
        PushTError: nothing answers at ``url``, or the handshake is refused.
    """

    def __init__(self, url: str, api_key: str | None = None) -> None:
        from openpi_client.websocket_client_policy import WebsocketClientPolicy

        try:
            self.client = WebsocketClientPolicy(host=url, port=None, api_key=api_key)
        except (OSError, Exception) as error:  # websockets raises InvalidStatus (401, 503) beside OSError
            raise PushTError(f"no OpenPI server answered at {url!r}: {type(error).__name__}: {error}") from None
        self.metadata = self.client.get_server_metadata()

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        return self.client.infer(obs)

    def close(self) -> None:
        self.client._ws.close()  # openpi-client 0.1.2 has no close(); its connection is the one attribute to close


class InProcessPolicy:
    """The server's own :class:`~trajectory_ensemble_node.openpi.policy.OpenPIPolicy`, called as
    :meth:`~trajectory_ensemble_node.openpi.dispatch.RequestDispatcher.serve` calls it (prepare, build, submit,
    reply) with no socket: the same checks, continuity sessions and seeds.

    Safe to call from several threads at once, as the server's clients do: builds take turns, as on the server's one
    build thread, and the engine co-batches the groups in flight.

    Args:
        params (`NodeParams`): The parameters ``serve-openpi`` would read (:func:`serve_params`).
    """

    def __init__(self, params: Any) -> None:
        from trajectory_ensemble_node.openpi.policy import OpenPIPolicy
        from trajectory_ensemble_node.openpi.sessions import Caller

        self.policy = OpenPIPolicy.from_params(params)
        self.policy.start()
        self.caller = Caller.anonymous(0)
        self.metadata = self.policy.metadata()
        self._requests = itertools.count(1)
        self._building = threading.Lock()

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        if obs.get("endpoint") == "reset":
            return self.policy.reset(obs, caller=self.caller)
        job = self.policy.prepare(obs, request_id=f"pusht-eval-{next(self._requests)}", caller=self.caller,
                                  arrival=time.monotonic())
        with self._building:  # the tokenizer and the VAE run on one thread at a time, as on the server
            self.policy.build(job)
        return self.policy.reply(job, self.policy.submit(job).result())

    def close(self) -> None:
        self.policy.stop()


def serve_params(checkpoint: Path, *, num_inference_steps: int = 10, candidate_count: int = 8,
                 reducer: str = "mode", groups_at_once: int = 1) -> dict[str, Any]:
    """The node parameters that serve a PushT checkpoint (a ``train-pusht`` output: pipeline and
    ``action_stats.json``) in env pixels, as ``train-pusht`` calls it: ``pusht``, chunk 16, tier 256, 10 fps, no CFG.
    ``groups_at_once`` groups of ``candidate_count`` fit one forward (the node's default batch, 16, at least).

    Raises:
        PushTError: ``checkpoint`` has no ``action_stats.json``.
    """
    from .train import CHUNK, DOMAIN_NAME, PUSHT_FORMAT, STATS_FILE

    stats = Path(checkpoint) / STATS_FILE
    if not stats.is_file():
        raise PushTError(f"{str(checkpoint)!r} is not a PushT checkpoint: no {STATS_FILE} beside its pipeline "
                         "(train-pusht writes one)")
    return {"model": str(Path(checkpoint).resolve()), "domain_name": DOMAIN_NAME, "chunk_size": CHUNK,
            "resolution_tier": PUSHT_FORMAT.resolution_tier, "fps": float(CONTROL_HZ),
            "guidance_scale": PUSHT_FORMAT.guidance_scale, "instruction": INSTRUCTION,
            "action_stats_file": str(stats.resolve()), "action_stats_method": "minmax",
            "num_inference_steps": num_inference_steps, "candidate_count": candidate_count,
            "max_candidates": max(candidate_count, 8), "reducer": reducer, "continuity_reducer": reducer,
            "max_batch_candidates": max(16, candidate_count * groups_at_once), "openpi_schema": "toy"}


def request_seed(base_seed: int, request: int) -> int:
    """The base seed of request ``request`` (0, 1, ...) of the episode whose base seed is ``base_seed``."""
    return base_seed * STEPS_LIMIT_PER_REQUEST + request


@dataclass
class EpisodeRecord:
    """One closed-loop episode.

    Args:
        env_seed (`int`): gym-pusht reset seed (and the base seed of its requests).
        steps (`int`): Control steps taken.
        max_coverage (`float`): Highest ``info["coverage"]`` over the steps.
        success (`bool`): ``info["is_success"]`` at some step (coverage > 0.95 ends the episode).
        requests (`int`): ``infer`` calls.
        seconds (`float`): Wall time of the episode.
        continuity (`list[str]`): The reply's ``continuity`` status per request.
        actions (`list[list[float]]`): The executed targets ``[steps, 2]`` (env pixels).
        coverage (`list[float]`): ``info["coverage"]`` after each step. gym-pusht sums the T's two polygons in the
            order of ``pymunk.Body.shapes``, a set ordered by memory address, so two env instances can differ here in
            the last bit for one and the same pose.
        poses (`list[list[float]]`): The T's ``(x, y, angle)`` after each step (bitwise reproducible).
    """

    env_seed: int
    steps: int = 0
    max_coverage: float = 0.0
    success: bool = False
    requests: int = 0
    seconds: float = 0.0
    continuity: list[str] = field(default_factory=list)
    actions: list[list[float]] = field(default_factory=list)
    coverage: list[float] = field(default_factory=list)
    poses: list[list[float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The record without its per-step trace."""
        return {k: v for k, v in asdict(self).items() if k not in ("actions", "coverage", "poses", "continuity")}


def check_served(metadata: dict[str, Any], execute: int, delay: int) -> int:
    """The served chunk length, after checking that the server returns PushT targets this loop can execute.

    Raises:
        PushTError: not ``pusht`` width 2, actions not in robot units (no ``action_stats_file``), or a chunk too
            short for ``execute + delay`` rows.
    """
    horizon, width = (int(v) for v in metadata.get("action_shape", (0, 0)))
    if metadata.get("embodiment") != "pusht" or width != 2:
        raise PushTError(f"the server serves {metadata.get('embodiment')!r} actions of shape "
                         f"{metadata.get('action_shape')}, not PushT's [H, 2]")
    if metadata.get("action_units") != "robot units":
        raise PushTError(f"the server's actions are {metadata.get('action_units')!r}, not env pixels; serve the "
                         "checkpoint with action_stats_file (its action_stats.json, action_stats_method: minmax)")
    if execute + delay > horizon:
        raise PushTError(f"--execute {execute} plus --delay {delay} rows need a chunk of at least "
                         f"{execute + delay}, the server's has {horizon}")
    return horizon


def run_episode(policy: ChunkPolicy, env_seed: int, *, execute: int = EXECUTE, delay: int = 0, count: int = 0,
                reducer: str = "", max_steps: int = MAX_STEPS, env: Any = None) -> EpisodeRecord:
    """Play one episode of ``gym_pusht/PushT-v0`` from reset seed ``env_seed``, ``policy`` serving the chunks.

    Args:
        policy (`ChunkPolicy`): Answers ``infer(obs)`` with ``actions`` ``[H, 2]`` in env pixels.
        env_seed (`int`): The reset seed; request ``k`` has base seed ``request_seed(env_seed, k)``.
        execute (`int`): Rows of each chunk executed per request.
        delay (`int`): Control steps the env executes the previous chunk while the next is inferred (0: it waits).
        count (`int`), reducer (`str`): Candidates and reducer per request (0 / "": the server's defaults).
        max_steps (`int`): Step cap (the env's own limit is 300).
        env: A ``make_env(pixels=True)`` env to reuse.
    """
    env = env if env is not None else make_env(pixels=True)
    started = time.perf_counter()
    obs, _ = env.reset(seed=env_seed)
    record = EpisodeRecord(env_seed)
    session = f"pusht-eval-{env_seed}"
    # A replayed seed must not continue the chunk its last episode left in the session (vLLM-Omni's reset).
    policy.infer({"endpoint": "reset", "session_id": session})
    pending: np.ndarray | None = None  # rows of the last chunk the env executes while the next is inferred
    done = False

    def step(action: np.ndarray) -> bool:
        nonlocal obs
        obs, _, terminated, truncated, info = env.step(np.asarray(action, dtype=np.float32))
        record.steps += 1
        record.actions.append([float(v) for v in action])
        record.coverage.append(float(info["coverage"]))
        record.poses.append(read_state(env).block.tolist())
        record.success = record.success or bool(info["is_success"])
        return bool(terminated or truncated) or record.steps >= max_steps

    while not done:
        request: dict[str, Any] = {IMAGE_KEY: obs["pixels"], "prompt": INSTRUCTION,
                                   "seed": request_seed(env_seed, record.requests), "num_candidates": count,
                                   "reducer": reducer, "session_id": session,
                                   "stamp": record.steps / CONTROL_HZ,
                                   **request_state(policy.metadata, obs["agent_pos"], read_state(env).block)}
        if delay:
            request.update(continue_previous=True, inference_delay=delay)
        reply = policy.infer(request)
        chunk = np.asarray(reply["actions"])
        record.requests += 1
        record.continuity.append(str(reply.get("continuity", "")))
        rows = list(chunk[:execute])
        if pending is not None:  # the env went on with the previous chunk while this one was inferred
            rows = list(pending) + rows[delay:]
        for action in rows:
            if (done := step(action)):
                break
        pending = chunk[execute:execute + delay] if delay else None
    record.max_coverage = max(record.coverage, default=0.0)
    record.seconds = round(time.perf_counter() - started, 3)
    return record


def summarize(records: Sequence[EpisodeRecord], settings: dict[str, Any]) -> dict[str, Any]:
    """The results record: per-episode records, success rate with its Wilson 95 % interval, mean max coverage with
    its bootstrap interval, requests, wall time, settings and provenance (date, commit)."""
    successes = sum(r.success for r in records)
    coverage = [r.max_coverage for r in records]
    low, high = wilson(successes, len(records))
    cov_low, cov_high = bootstrap_mean(coverage) if coverage else (0.0, 0.0)
    return {
        "date": utc_now(), "commit": git_commit(), "env": "gym_pusht/PushT-v0 (gym-pusht 0.1.8)",
        "settings": settings,
        "episodes": len(records), "successes": successes,
        "success_rate": successes / len(records) if records else 0.0, "success_rate_ci95": [low, high],
        "coverage_mean": float(np.mean(coverage)) if coverage else 0.0, "coverage_mean_ci95": [cov_low, cov_high],
        "requests": sum(r.requests for r in records),
        "seconds": round(sum(r.seconds for r in records), 3),
        "per_episode": [r.summary() for r in records],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``pusht-eval`` options on ``parser``."""
    parser.add_argument("--through", choices=("openpi", "python"), default="openpi",
                        help="openpi: openpi-client against a running serve-openpi (--url); python: the server's "
                             "OpenPIPolicy in this process on --policy")
    parser.add_argument("--url", default="ws://127.0.0.1:8000", help="the serve-openpi address (--through openpi)")
    parser.add_argument("--api-key", default=None, help=f"the server's key (default ${API_KEY_ENV})")
    parser.add_argument("--policy", type=Path, default=None,
                        help="a PushT checkpoint directory (train-pusht's --out: pipeline + action_stats.json); "
                             "for --through python and --write-params")
    parser.add_argument("--write-params", type=Path, default=None,
                        help="write the serve-openpi params YAML that serves --policy here, and exit")
    parser.add_argument("--split", choices=tuple(SPLITS), default="validation",
                        help="which starts: validation (default, 100000..199999), demo, or heldout (200000+, "
                             "measured once, after the choices are committed)")
    parser.add_argument("--seed", type=int, default=None, help="first reset seed (default: the split's first)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes: reset seeds SEED .. SEED + N - 1")
    parser.add_argument("--execute", type=int, default=EXECUTE, help="rows of each chunk executed per request")
    parser.add_argument("--delay", type=int, default=0,
                        help="inference delay d: steps the env executes the previous chunk while the next is "
                             "inferred (requests then continue_previous it)")
    parser.add_argument("--count", type=int, default=8, help="candidates per request")
    parser.add_argument("--reducer", default="mode", help="reducer per request")
    parser.add_argument("--steps", type=int, default=10, help="denoising steps (--through python, --write-params)")
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS, help="step cap per episode (the env's 300)")
    parser.add_argument("--json", type=Path, default=None, help="write the results record here")
    parser.add_argument("--trace", action="store_true",
                        help="also record each episode's executed actions, coverage and continuity per step")


def _check(args: argparse.Namespace) -> tuple[int, int]:
    low, high = SPLITS[args.split]
    seed = low if args.seed is None else args.seed
    if args.episodes < 1 or not low <= seed or seed + args.episodes > high:
        raise PushTError(f"--seed {seed} with --episodes {args.episodes} leaves the {args.split} starts "
                         f"{low}..{high - 1}; choose seeds inside it (or name the split with --split)")
    if not 1 <= args.max_steps <= MAX_STEPS:
        raise PushTError(f"--max-steps must be in 1..{MAX_STEPS}, got {args.max_steps}")
    if args.execute < 1 or not 0 <= args.delay < args.execute:
        raise PushTError(f"--execute must be >= 1 and --delay in 0..execute - 1, got {args.execute} and {args.delay}")
    if args.count < 1 or args.steps < 1:
        raise PushTError(f"--count and --steps must be >= 1, got {args.count} and {args.steps}")
    if args.through == "python" and args.policy is None:
        raise PushTError("--through python needs --policy DIR (a train-pusht checkpoint)")
    if args.through == "openpi" and args.policy is not None and args.write_params is None:
        raise PushTError(f"--through openpi serves what the server loaded; --policy {str(args.policy)!r} would be "
                         "ignored (start serve-openpi with --write-params's file instead)")
    return seed, args.episodes


def open_policy(args: argparse.Namespace) -> ChunkPolicy:
    """The policy ``--through`` names."""
    if args.through == "python":
        from trajectory_ensemble_node.serving.params import validate

        return InProcessPolicy(validate(serve_params(args.policy, num_inference_steps=args.steps,
                                                     candidate_count=args.count, reducer=args.reducer)))
    return WirePolicy(args.url, args.api_key or os.environ.get(API_KEY_ENV) or None)


def evaluate(policy: ChunkPolicy, seeds: Sequence[int], *, log: Callable[[str], None] = print,
             **episode: Any) -> list[EpisodeRecord]:
    """:func:`run_episode` on each reset seed, one env reused, after :func:`check_served` on the policy."""
    check_served(policy.metadata, episode.get("execute", EXECUTE), episode.get("delay", 0))
    env = make_env(pixels=True)
    records = []
    for i, seed in enumerate(seeds):
        record = run_episode(policy, seed, env=env, **episode)
        records.append(record)
        log(f"[{i + 1}/{len(seeds)}] seed {seed}: {'success' if record.success else 'failure'} max coverage "
            f"{record.max_coverage:.3f} steps {record.steps} requests {record.requests} {record.seconds:.1f} s")
    return records


def run(args: argparse.Namespace) -> int:
    """Run ``pusht-eval``; 0 done, 2 a setting, the server or a request was refused (``NAME (code): message``)."""
    try:
        return _run(args)
    except TrajectoryEnsembleError as error:
        print(f"error: {describe_error(error)}", file=sys.stderr)
        return 2
    except RuntimeError as error:  # openpi-client raises the server's error frame (JSON text) as RuntimeError
        print(f"error: {describe_error_frame(str(error))}", file=sys.stderr)
        return 2


def describe_error_frame(text: str) -> str:
    """``NAME (code): message`` of the error frame openpi-client raised as ``RuntimeError`` (its text as it is when
    it holds no frame)."""
    try:
        frame = json.loads(text[text.index("{"):])
        return f"{frame['error']} ({frame['code']}): {frame['message']}"
    except (ValueError, KeyError, TypeError):
        return text


def _run(args: argparse.Namespace) -> int:
    if args.write_params is not None:
        if args.policy is None:
            raise PushTError("--write-params needs --policy DIR (a train-pusht checkpoint)")
        import yaml

        params = serve_params(args.policy, num_inference_steps=args.steps, candidate_count=args.count,
                              reducer=args.reducer)
        args.write_params.parent.mkdir(parents=True, exist_ok=True)
        args.write_params.write_text(yaml.safe_dump({"/**/trajectory_ensemble": {"ros__parameters": params}}))
        print(f"wrote {args.write_params}: trajectory-ensemble serve-openpi --params-file {args.write_params}")
        return 0
    first, episodes = _check(args)
    policy = open_policy(args)
    try:
        records = evaluate(policy, range(first, first + episodes), execute=args.execute, delay=args.delay,
                           count=args.count, reducer=args.reducer, max_steps=args.max_steps,
                           log=lambda line: print(line, flush=True))
        served = {k: policy.metadata.get(k) for k in ("model", "weights", "weights_version", "action_shape")}
    finally:
        policy.close()
    settings = {"through": args.through, "url": args.url if args.through == "openpi" else None,
                "policy": str(args.policy) if args.policy else None, "split": args.split, "seed": first,
                "episodes": episodes, "execute": args.execute, "delay": args.delay, "count": args.count,
                "reducer": args.reducer, "steps": args.steps if args.through == "python" else None,
                "max_steps": args.max_steps, "served": served}
    result = summarize(records, settings)
    if args.trace:
        result["trace"] = [{"env_seed": r.env_seed, "actions": r.actions, "coverage": r.coverage,
                            "poses": r.poses, "continuity": r.continuity} for r in records]
    low, high = result["success_rate_ci95"]
    print(f"success {result['successes']}/{result['episodes']} ({result['success_rate']:.1%}, 95 % {low:.1%}.."
          f"{high:.1%}); mean max coverage {result['coverage_mean']:.3f}; {result['requests']} requests", flush=True)
    if args.json is not None:
        write_json(args.json, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m`` on this module, the same as ``trajectory-ensemble pusht-eval ...``."""
    return run_command("pusht-eval", argv)


if __name__ == "__main__":
    sys.exit(main())
