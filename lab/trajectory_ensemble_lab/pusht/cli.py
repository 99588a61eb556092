"""``trajectory-ensemble pusht-demos``: expert demonstrations on gym-pusht, as rosbag2, with their seeds and figures.

    trajectory-ensemble pusht-demos --episodes 260 --seed 0 --out out/pusht/demos --json bench/results/pusht_expert.json

plays starts ``S .. S + N - 1`` with each expert seed (``--expert-seeds``, two by default), writes every successful
episode as a bag ``DIR/bags/pusht_<env seed>_<expert seed>`` (``--one-bag``: all of them into ``DIR/demos``, as the
committed test bag is made), a log line per episode to stdout and to ``DIR/demos.jsonl``, and the results record
(success rate, kept seeds, multimodality, seconds per episode) to ``--json``.

``--states-only`` writes no frames and no bags but one ``.npz`` per episode under ``DIR/states`` (the full state,
the targets sent and the expert's clean targets; :mod:`.state_demos`), and skips episodes already written there, so
a stopped run resumes. ``--dart-sigma S --dart-seeds 2`` plays expert seed 2 with DART action noise
(:class:`~.demos.DartNoise`) and keeps the expert's clean targets as its labels:

    trajectory-ensemble pusht-demos --states-only --episodes 350 --seed 0 --expert-seeds 0,1,2 \
        --dart-seeds 2 --dart-sigma 12 --out out/pusht/oracle_demos
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trajectory_ensemble_node.errors import TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.provenance import git_commit, utc_now

from ..commands import run_command
from . import DEMO_SEED_BASE
from .demos import DartNoise, Episode, generate, kept, results
from .recording import write_demo_bag
from .state_demos import episode_path, read_episodes, write_episode
from .sim import MAX_STEPS, PushTError


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct seeds >= 0, got {text!r}")
    return seeds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``pusht-demos`` options on ``parser``."""
    parser.add_argument("--episodes", type=int, default=260, help="number of starts (gym-pusht reset seeds)")
    parser.add_argument("--seed", type=int, default=DEMO_SEED_BASE,
                        help="first reset seed; demonstrations 0..99999, validation 100000+, held-out 200000+")
    parser.add_argument("--expert-seeds", type=_seeds, default=(0, 1),
                        help="expert seeds each start is played with (default 0,1: the multimodality pairs)")
    parser.add_argument("--out", type=Path, default=Path("out/pusht/demos"), help="folder for the bags and the log")
    parser.add_argument("--json", type=Path, default=None, help="write the results record here (and DIR/results.json)")
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS, help="step cap per episode (the env's 300)")
    parser.add_argument("--one-bag", action="store_true", help="write every demonstration into one bag DIR/demos")
    parser.add_argument("--no-bags", action="store_true", help="play and measure only: no frames, no bags")
    parser.add_argument("--states-only", action="store_true",
                        help="no frames or bags: one .npz per episode under DIR/states; resumes past those written")
    parser.add_argument("--dart-seeds", type=_seeds, default=(),
                        help="expert seeds (among --expert-seeds) that demonstrate with DART action noise")
    parser.add_argument("--dart-sigma", type=float, default=12.0, help="DART noise per axis, env pixels")
    parser.add_argument("--dart-rho", type=float, default=0.7, help="DART noise step-to-step correlation")


def run(args: argparse.Namespace) -> int:
    """Run ``pusht-demos``; 0 done, 1 a setting or output was refused (printed as ``NAME (code): message``)."""
    try:
        return _run(args)
    except TrajectoryEnsembleError as error:
        print(f"error: {describe_error(error)}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.episodes < 1 or args.seed < 0 or not 1 <= args.max_steps <= MAX_STEPS:
        raise PushTError(f"--episodes must be >= 1, --seed >= 0 and --max-steps in 1..{MAX_STEPS}, got "
                         f"{args.episodes}, {args.seed} and {args.max_steps}")
    provenance = {"date": utc_now(), "commit": git_commit()}
    out: Path = args.out
    bag_dir = out / "bags"
    states_dir = out / "states"
    dart = DartNoise(args.dart_sigma, args.dart_rho) if args.dart_seeds else None
    if args.states_only and args.one_bag:
        raise PushTError("--states-only writes no bags; leave out --one-bag")
    if not args.states_only and args.dart_seeds:
        raise PushTError(f"--dart-seeds {list(args.dart_seeds)} needs --states-only (bags carry no clean labels)")
    if args.states_only:
        args.no_bags = True
    if not args.no_bags and ((bag_dir.exists() and any(bag_dir.iterdir())) or (out / "demos").exists()):
        raise PushTError(f"{out} holds bags already; choose another --out or remove it")
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "demos.jsonl").open("a" if args.states_only else "w", encoding="utf-8")
    frames = not args.no_bags
    done = {"n": 0, "ok": 0}
    total = args.episodes * len(args.expert_seeds)

    def on_episode(ep: Episode) -> None:
        done["n"] += 1
        done["ok"] += ep.success
        if frames and ep.success and not args.one_bag:
            write_demo_bag(bag_dir / f"pusht_{ep.env_seed:06d}_{ep.expert_seed}", [ep])
        if args.states_only:
            write_episode(states_dir, ep)
        line = ep.summary()
        log.write(json.dumps(line) + "\n")
        log.flush()
        route = f"{ep.route.face}/{ep.route.side}" if ep.route else "-"
        print(f"[{done['n']}/{total}] seed {ep.env_seed} expert {ep.expert_seed}: "
              f"{'success' if ep.success else 'failure'} coverage {ep.coverage:.3f} steps {ep.steps} "
              f"route {route} {ep.seconds:.1f} s (kept {done['ok']})"
              f"{f' dart {ep.dart_sigma:g} px' if ep.dart_sigma else ''}", flush=True)
        if not (frames and args.one_bag and ep.success):
            ep.frames = None  # a bag has them now; holding 300 frames per episode would grow without bound

    try:
        skip = (lambda e, x: episode_path(states_dir, e, x).exists()) if args.states_only else None
        played = generate(args.seed, args.episodes, args.expert_seeds, args.max_steps, frames, on_episode,
                          dart, args.dart_seeds if dart else (), skip)
    finally:
        log.close()
    if args.states_only:  # the record covers every episode of the range, resumed runs' included
        wanted = {(e, x) for e in range(args.seed, args.seed + args.episodes) for x in args.expert_seeds}
        played = [ep for ep in read_episodes(states_dir) if (ep.env_seed, ep.expert_seed) in wanted]
    if frames and args.one_bag and kept(played):
        write_demo_bag(out / "demos", kept(played))
    settings = {"env": "gym_pusht/PushT-v0 (gym-pusht 0.1.8)", "seed": args.seed, "episodes": args.episodes,
                "expert_seeds": list(args.expert_seeds), "max_steps": args.max_steps, "frames": frames,
                "out": str(out), "states_only": args.states_only,
                "dart": ({"expert_seeds": list(args.dart_seeds), "sigma_px": args.dart_sigma, "rho": args.dart_rho}
                         if dart else None)}
    record = results(played, settings, provenance)
    text = json.dumps(record, indent=1) + "\n"
    (out / "results.json").write_text(text, encoding="utf-8")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text, encoding="utf-8")
    mm = record["multimodality"]
    print(f"success {record['successes']}/{record['episodes_tried']} ({record['success_rate']:.1%}, 95 % "
          f"{record['success_rate_ci95'][0]:.1%}..{record['success_rate_ci95'][1]:.1%}); multimodality "
          f"{mm['different_paths']}/{mm['starts']} starts; {record['seconds_per_episode']} s per episode", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m`` on this module, the same as ``trajectory-ensemble pusht-demos ...``."""
    return run_command("pusht-demos", argv)


if __name__ == "__main__":
    sys.exit(main())
