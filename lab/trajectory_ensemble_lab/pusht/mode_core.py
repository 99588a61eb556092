"""How ``mode``'s core fraction was chosen (issue 60): the PushT state oracle in closed loop, one rule per fraction.

``mode`` finds the majority mode at its relative cut, then averages that mode's densest core: the member with the
most mode members within ``fraction`` times the group's median pairwise distance, and those members
(:func:`~trajectory_ensemble_node.reducers.mode_core`). This plays the oracle (:mod:`.oracle_eval`: same starts,
noise seeds and execution as ``pusht-oracle eval``) with ``single``, the whole majority mode (the rule before the core,
``mode`` at its own relative cut with no core) and the core at each ``--fractions``, paired by (start, noise seed)::

    python -m trajectory_ensemble_lab.pusht.mode_core --fractions 0.15,0.25,0.35,0.5 \\
        --json bench/results/mode_core-pusht.json

Validation starts only (100000+): the held-out starts 200000+ measure the chosen rule, never choose it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.reducers import MODE_CORE_FRACTION, mode_reduce, relative_mode_threshold

from . import VALIDATION_SEED_BASE
from .oracle import load_oracle
from .oracle_eval import Execution, Rule, evaluate, markdown
from ..records import write_json

WHOLE_MODE = "whole mode"
"""The label of the majority mode's mean, no core (``mode`` before issue 60's core)."""


def rules(fractions: Sequence[float]) -> dict[str, Rule]:
    """``{label: rule}``: the whole majority mode, and its core at each fraction (``core 0.35``)."""
    table: dict[str, Rule] = {WHOLE_MODE: lambda c: mode_reduce(c, relative_mode_threshold(c))}
    for fraction in fractions:
        table[f"core {fraction:g}"] = (lambda f: lambda c: mode_reduce(c, core_fraction=f))(fraction)
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.pusht.mode_core", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=Path("out/pusht/oracle/run"), help="a pusht-oracle run")
    parser.add_argument("--fractions", default="0.15,0.25,0.35,0.5")
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--seed", type=int, default=VALIDATION_SEED_BASE, help="first start (validation: 100000+)")
    parser.add_argument("--noise-seeds", default="0,1,2")
    parser.add_argument("--json", type=Path, default=Path("bench/results/mode_core-pusht.json"))
    args = parser.parse_args(argv)
    if args.seed < VALIDATION_SEED_BASE or args.seed + args.starts > 2 * VALIDATION_SEED_BASE:
        raise SystemExit(f"error: choose on validation starts {VALIDATION_SEED_BASE}..{2 * VALIDATION_SEED_BASE - 1}, "
                         f"got {args.seed}..{args.seed + args.starts - 1}")
    torch.set_num_threads(1)
    commit, date = git_commit(), utc_now()
    fractions = [float(f) for f in args.fractions.split(",")]
    table = rules(fractions)
    net, record = load_oracle(args.checkpoint)
    starts = range(args.seed, args.seed + args.starts)
    noise_seeds = tuple(int(s) for s in args.noise_seeds.split(","))
    execution = Execution()
    result = evaluate(net, starts, noise_seeds, ["single", *table], execution, log=lambda line: None, rules=table)
    figures = result.figures()
    doc = {"date": date, "commit": commit, "checkpoint": str(args.checkpoint), "step": record.get("step"),
           "starts": [starts[0], starts[-1]], "noise_seeds": list(noise_seeds), "fractions": fractions,
           "shipped_fraction": MODE_CORE_FRACTION, **figures}
    write_json(args.json, doc)
    heading = (f"# `mode`'s core fraction on the PushT state oracle, starts {starts[0]}..{starts[-1]}\n\n"
               f"Date {date}, commit {commit}; checkpoint `{args.checkpoint}`; N = 8, noise seeds "
               f"{list(noise_seeds)}. `{WHOLE_MODE}`: the majority mode's mean (the rule before the core); "
               f"`core F`: its core at radius F x the median pairwise distance (shipped: {MODE_CORE_FRACTION:g}).\n\n")
    args.json.with_suffix(".md").write_text(heading + markdown(figures, execution.count))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
