"""``trajectory-ensemble pusht-oracle``: train the PushT state oracle, and measure the product's reducers on it.

    trajectory-ensemble pusht-oracle train --data out/pusht/oracle_demos/states --work-dir out/pusht/oracle/run \\
        --steps 40000
    trajectory-ensemble pusht-oracle eval --checkpoint out/pusht/oracle/run --reducers single,mean,median,medoid,mode \\
        --starts 20 --seed 100000 --noise-seeds 0,1,2 --json bench/results/pusht_oracle.json

``train`` reads the state-only episodes of ``pusht-demos --states-only`` (demonstration starts only), trains the
flow MLP of :mod:`.oracle` on one torch thread and resumes from ``--work-dir``'s checkpoint when one is there.
``eval`` plays each method on validation starts ``--seed .. --seed + --starts - 1``, each with every noise seed
(:mod:`.oracle_eval`), and writes the record (date, commit, the checkpoint's record, per-method figures, paired
differences against ``single``) to ``--json`` and its table to the ``.md`` beside it. ``merge`` joins the records of
one evaluation split by method (two processes on two cores) into one; ``compare`` pairs two evaluations of the
same starts and noise seeds method by method (a lever against the baseline settings).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from trajectory_ensemble_node.errors import TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.provenance import git_commit, utc_now

from . import HELDOUT_SEED_BASE, VALIDATION_SEED_BASE
from .oracle import DEFAULT_STEPS, OracleConfig, TrainSettings, build_examples, load_oracle, train
from .oracle_eval import REDUCERS, Evaluation, Execution, OracleEpisode, evaluate, markdown, paired_versus
from .sim import MAX_STEPS, PushTError
from .state_demos import read_episodes
from ..commands import run_command
from ..records import write_json


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
    e.add_argument("--max-steps", type=int, default=MAX_STEPS, help="step cap per episode (the env's 300)")
    e.add_argument("--json", type=Path, default=None, help="write the record here, and its table beside it (.md)")
    e.add_argument("--threads", type=int, default=1)
    c = sub.add_parser("compare", help="paired differences of one method between two evaluations (a lever)")
    c.add_argument("base", type=Path, help="eval --json record of the baseline settings")
    c.add_argument("other", type=Path, help="eval --json record of the lever, same starts and noise seeds")
    c.add_argument("--json", type=Path, default=None, help="write the comparison here")
    m = sub.add_parser("merge", help="one record from evaluations of one checkpoint split by method")
    m.add_argument("records", type=Path, nargs="+", help="eval --json records")
    m.add_argument("--json", type=Path, required=True, help="the merged record (and its .md beside it)")


def run(args: argparse.Namespace) -> int:
    """Run ``pusht-oracle``; 0 done, 1 a setting or input was refused (printed as ``NAME (code): message``)."""
    try:
        return {"train": _train, "eval": _eval, "merge": _merge, "compare": _compare}[args.action](args)
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
                          execute_near_goal=args.execute_near_goal, near_goal=args.near_goal, max_steps=args.max_steps)
    starts = range(args.seed, args.seed + args.starts)
    result = evaluate(net, starts, args.noise_seeds, args.reducers, execution,
                      log=lambda line: print(line, flush=True))
    oracle = {k: v for k, v in record.items() if k != "seeds"}
    settings = {"checkpoint": str(args.checkpoint), "starts": [starts[0], starts[-1]],
                "noise_seeds": list(args.noise_seeds), "count": args.count, "denoise_steps": args.denoise_steps,
                "execute": args.execute, "execute_near_goal": args.execute_near_goal, "near_goal": args.near_goal,
                "max_steps": args.max_steps, "reduced_in": "normalized units, minmax [0, 512] -> [-1, 1]"}
    _report({**provenance, "settings": settings, "oracle": oracle}, result, args.json)
    return 0


def _report(head: dict[str, Any], result: Evaluation, path: Path | None) -> None:
    """Print the table; write the record (``head`` plus the figures) to ``path`` and the table beside it."""
    settings, oracle = head["settings"], head["oracle"]
    figures = result.figures()
    table = markdown(figures, settings["count"])
    print(table, flush=True)
    if path is None:
        return
    write_json(path, {**head, **figures})
    first, last = settings["starts"]
    near = settings["execute_near_goal"]
    text = (f"# PushT state oracle: reducers on validation starts {first}..{last}\n\n"
            f"Date {head['date']}, commit {head['commit']}; checkpoint `{settings['checkpoint']}` (step "
            f"{oracle['step']}, {oracle['examples']} examples from {oracle['episodes']} episodes, "
            f"{oracle['dart_episodes']} with DART); N = {settings['count']}, {settings['denoise_steps']} Euler steps, "
            f"{settings['execute']} rows executed" + (f" ({near} from coverage {settings['near_goal']})" if near else "")
            + f"; noise seeds {settings['noise_seeds']}.\n\n")
    for part in head.get("merged_from", []):
        text += f"- {', '.join(part['methods'])}: run {part['date']}, commit {part['commit']}\n"
    text += "\n" if head.get("merged_from") else ""
    path.with_suffix(".md").write_text(text + table, encoding="utf-8")


def _merge(args: argparse.Namespace) -> int:
    documents = [json.loads(Path(p).read_text(encoding="utf-8")) for p in args.records]
    first = documents[0]
    for path, doc in zip(args.records, documents):
        if doc["settings"] != first["settings"] or doc["oracle"]["step"] != first["oracle"]["step"]:
            raise PushTError(f"{str(path)!r} is another evaluation (settings or checkpoint step differ from "
                             f"{str(args.records[0])!r}); merge records of one evaluation split by method")
    result = Evaluation()
    for doc in documents:
        for name, figures in doc["methods"].items():
            if name in result.episodes:
                raise PushTError(f"method {name!r} is in more than one record; split an evaluation by method")
            result.episodes[name] = [OracleEpisode(**row) for row in figures["per_episode"]]
    order = [m for m in REDUCERS if m in result.episodes] + [m for m in result.episodes if m not in REDUCERS]
    result.episodes = {m: result.episodes[m] for m in order}
    head = {"date": min(d["date"] for d in documents), "commit": first["commit"], "settings": first["settings"],
            "oracle": first["oracle"],
            "merged_from": [{"record": str(p), "date": d["date"], "commit": d["commit"], "methods": list(d["methods"])}
                            for p, d in zip(args.records, documents)]}
    _report(head, result, args.json)
    return 0


def _compare(args: argparse.Namespace) -> int:
    base, other = (json.loads(Path(p).read_text(encoding="utf-8")) for p in (args.base, args.other))
    shared = [m for m in other["methods"] if m in base["methods"]]
    if not shared:
        raise PushTError(f"{str(args.base)!r} and {str(args.other)!r} share no method")
    result = {"date": utc_now(), "commit": git_commit(), "base": str(args.base), "other": str(args.other),
              "base_settings": base["settings"], "other_settings": other["settings"], "methods": {}}
    for m in shared:
        a, b = ([OracleEpisode(**r) for r in doc["methods"][m]["per_episode"]] for doc in (base, other))
        keys = {(e.env_seed, e.noise_seed) for e in a} & {(e.env_seed, e.noise_seed) for e in b}
        a, b = ([e for e in eps if (e.env_seed, e.noise_seed) in keys] for eps in (a, b))
        versus = paired_versus(a, b)  # on the episodes both played only
        result["methods"][m] = {"base_coverage": round(sum(e.max_coverage for e in a) / len(a), 4),
                                "other_coverage": round(sum(e.max_coverage for e in b) / len(b), 4),
                                "base_successes": sum(e.success for e in a),
                                "other_successes": sum(e.success for e in b), **versus}
        low, high = versus["coverage_diff_ci95"]
        print(f"{m}: coverage {result['methods'][m]['base_coverage']:.3f} -> {result['methods'][m]['other_coverage']:.3f}"
              f" (paired {versus['coverage_diff_mean']:+.3f}, {low:+.3f}..{high:+.3f}); successes "
              f"{result['methods'][m]['base_successes']} -> {result['methods'][m]['other_successes']} of "
              f"{versus['episodes']}", flush=True)
    if args.json is not None:
        write_json(args.json, result)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m`` on this module, the same as ``trajectory-ensemble pusht-oracle ...``."""
    return run_command("pusht-oracle", argv)


if __name__ == "__main__":
    sys.exit(main())
