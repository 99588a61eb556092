"""``trajectory-ensemble pusht-oracle``: train the PushT state oracle, and measure the product's reducers on it.

    trajectory-ensemble pusht-oracle train --data out/pusht/oracle_demos/states --work-dir out/pusht/oracle/run \\
        --steps 40000
    trajectory-ensemble pusht-oracle eval --checkpoint out/pusht/oracle/run --reducers single,mean,median,medoid,mode \\
        --starts 20 --seed 100000 --noise-seeds 0,1,2 --json bench/results/pusht_oracle.json

``train`` reads the state-only episodes of ``pusht-demos --states-only`` (demonstration starts only), trains the
flow MLP of :mod:`.oracle` on one torch thread and resumes from ``--work-dir``'s checkpoint when one is there.
``eval`` plays each method on validation starts ``--seed .. --seed + --starts - 1``, each with every noise seed
(:mod:`.oracle_eval`), and writes the record (date, commit, the checkpoint's record, per-method figures, paired
differences against ``single``) to ``--json`` and its table to the ``.md`` beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from trajectory_ensemble_node.errors import TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.provenance import git_commit, utc_now

from . import HELDOUT_SEED_BASE, VALIDATION_SEED_BASE
from .oracle import DEFAULT_STEPS, OracleConfig, TrainSettings, build_examples, load_oracle, train
from .oracle_eval import REDUCERS, Execution, evaluate, markdown
from .sim import PushTError
from .state_demos import read_episodes


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``pusht-oracle train`` and ``pusht-oracle eval`` on ``parser``."""
    sub = parser.add_subparsers(dest="action", required=True)
    t = sub.add_parser("train", help="train the state oracle on state-only expert episodes")
    t.add_argument("--data", type=Path, default=Path("out/pusht/oracle_demos/states"),
                   help="folder of pusht_*.npz episodes (pusht-demos --states-only)")
    t.add_argument("--work-dir", type=Path, default=Path("out/pusht/oracle/run"),
                   help="weights, record and resumable checkpoint")
    t.add_argument("--obs-steps", type=int, default=1, help="states observed (2: also the previous one)")
    t.add_argument("--width", type=int, default=512)
    t.add_argument("--blocks", type=int, default=4)
    defaults = TrainSettings()
    for name in ("steps", "batch", "warmup", "checkpoint_every", "seed"):
        t.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    for name in ("lr", "weight_decay", "ema", "sigma_shift"):
        t.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(defaults, name))
    t.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 on a shared machine)")
    e = sub.add_parser("eval", help="closed-loop episodes of single and the product's reducers at N")
    e.add_argument("--checkpoint", type=Path, default=Path("out/pusht/oracle/run"), help="a train --work-dir")
    e.add_argument("--reducers", type=_names, default=REDUCERS, help="single and reducer names")
    e.add_argument("--starts", type=int, default=20, help="number of starts")
    e.add_argument("--seed", type=int, default=VALIDATION_SEED_BASE, help="first start (validation: 100000+)")
    e.add_argument("--noise-seeds", type=_ints, default=(0, 1, 2), help="noise seeds per start")
    e.add_argument("--count", type=int, default=8, help="candidates N")
    e.add_argument("--denoise-steps", type=int, default=DEFAULT_STEPS, help="Euler steps per candidate")
    e.add_argument("--execute", type=int, default=Execution().execute, help="rows executed per chunk")
    e.add_argument("--execute-near-goal", type=int, default=None,
                   help="rows executed per chunk once coverage reaches --near-goal (default: --execute)")
    e.add_argument("--near-goal", type=float, default=0.8)
    e.add_argument("--json", type=Path, default=None, help="write the record here, and its table beside it (.md)")
    e.add_argument("--threads", type=int, default=1)


def run(args: argparse.Namespace) -> int:
    """Run ``pusht-oracle``; 0 done, 1 a setting or input was refused (printed as ``NAME (code): message``)."""
    try:
        return _train(args) if args.action == "train" else _eval(args)
    except TrajectoryEnsembleError as error:
        print(f"error: {describe_error(error)}", file=sys.stderr)
        return 1


def _train(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    if args.obs_steps < 1:
        raise PushTError(f"--obs-steps must be >= 1, got {args.obs_steps}")
    config = OracleConfig(obs_steps=args.obs_steps, width=args.width, blocks=args.blocks)
    settings = TrainSettings(steps=args.steps, batch=args.batch, lr=args.lr, weight_decay=args.weight_decay,
                             ema=args.ema, sigma_shift=args.sigma_shift, seed=args.seed, warmup=args.warmup,
                             checkpoint_every=args.checkpoint_every)
    episodes = read_episodes(args.data)
    examples = build_examples(episodes, config)
    meta = {"folder": str(args.data), "episodes_read": len(episodes),
            "starts": [min(e.env_seed for e in episodes), max(e.env_seed for e in episodes)],
            "dart_sigmas_px": sorted({e.dart_sigma for e in episodes if e.dart_sigma > 0}),
            "commit": git_commit(), "date": utc_now()}
    record = train(examples, config, settings, args.work_dir, meta=meta, log=lambda line: print(line, flush=True))
    print(f"saved {args.work_dir}: step {record['step']}, {record['passes']} passes, {record['train_seconds']} s",
          flush=True)
    return 0


def _eval(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    if args.starts < 1 or not VALIDATION_SEED_BASE <= args.seed or not args.noise_seeds:
        raise PushTError(f"pusht-oracle eval plays validation (>= {VALIDATION_SEED_BASE}) or held-out "
                         f"(>= {HELDOUT_SEED_BASE}) starts, at least one, with a noise seed; got --seed {args.seed}, "
                         f"--starts {args.starts}, --noise-seeds {list(args.noise_seeds)}")
    provenance = {"date": utc_now(), "commit": git_commit()}
    net, record = load_oracle(args.checkpoint)
    execution = Execution(count=args.count, steps=args.denoise_steps, execute=args.execute,
                          execute_near_goal=args.execute_near_goal, near_goal=args.near_goal)
    starts = range(args.seed, args.seed + args.starts)
    result = evaluate(net, starts, args.noise_seeds, args.reducers, execution,
                      log=lambda line: print(line, flush=True))
    figures = result.figures()
    oracle = {k: v for k, v in record.items() if k != "seeds"}
    document = {**provenance, "settings": {"checkpoint": str(args.checkpoint), "starts": [starts[0], starts[-1]],
                                           "noise_seeds": list(args.noise_seeds), "count": args.count,
                                           "denoise_steps": args.denoise_steps, "execute": args.execute,
                                           "execute_near_goal": args.execute_near_goal, "near_goal": args.near_goal,
                                           "reduced_in": "normalized units, minmax [0, 512] -> [-1, 1]"},
                "oracle": oracle, **figures}
    table = markdown(figures, args.count)
    print(table, flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        head = (f"# PushT state oracle: reducers on validation starts {starts[0]}..{starts[-1]}\n\n"
                f"Date {provenance['date']}, commit {provenance['commit']}; checkpoint `{args.checkpoint}` (step "
                f"{record['step']}, {record['examples']} examples from {record['episodes']} episodes, "
                f"{record['dart_episodes']} with DART); N = {args.count}, {args.denoise_steps} Euler steps, "
                f"{args.execute} rows executed"
                + (f" ({args.execute_near_goal} from coverage {args.near_goal})" if args.execute_near_goal else "")
                + f"; noise seeds {list(args.noise_seeds)}.\n\n")
        args.json.with_suffix(".md").write_text(head + table, encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m trajectory_ensemble_lab.pusht.oracle_cli ...``, the same as ``trajectory-ensemble pusht-oracle``."""
    parser = argparse.ArgumentParser(prog="trajectory-ensemble pusht-oracle", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
