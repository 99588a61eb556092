"""Shards of ``bench --pusht`` merged into one record, the paired comparisons, and the table of docs/pusht.md.

A held-out measurement runs as shards (disjoint seed ranges, one process per core); each shard's JSON keeps its
episodes (``per_episode``), so the merged figures are recomputed from the episodes with the bench's own
:func:`~.bench.summarize`, never averaged from shard summaries. Paired comparisons use the starts both methods played:
the mean difference of max coverage and of success, with a bootstrap 95 % interval over starts. Shards with a
``continuity`` block also give each continuity method against ``naive_async`` at the same delay: the paired coverage
difference and the seam ratio (``naive_async``'s mean seam jump over the method's).

    python -m trajectory_ensemble_lab.pusht.bench_table A.json B.json --json merged.json --markdown table.md

Two faces on the same starts (``bench --pusht --through node`` against ``--through process``) are compared with
``--agree``: per method, each face's figures, the paired difference, whether the intervals of the two faces overlap
and whether the paired interval holds zero, and how many episodes are the same episode (steps, success and max
coverage to 1e-9).

    python -m trajectory_ensemble_lab.pusht.bench_table --agree NODE.json PROCESS.json --json agreement.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .bench import summarize
from .bench_records import BenchEpisode, paired_outcomes
from ..records import write_json

PUBLISHED = (
    ("Diffusion Policy, CNN (image), Chi et al. 2023, Table II", "0.91 / 0.84", "not reported"),
    ("Diffusion Policy, transformer (image)", "0.78 / 0.66", "not reported"),
    ("LSTM-GMM (image), same table", "0.69 / 0.54", "not reported"),
    ("LeRobot diffusion_pusht, 500 episodes", "0.959", "63.8 %"),
)
"""Published PushT figures: (source, mean max coverage, success). Diffusion Policy's coverage is best checkpoint / mean
of the last 10 checkpoints."""


def _episodes(rows: Sequence[dict[str, Any]]) -> list[BenchEpisode]:
    return [BenchEpisode(**row) for row in rows]


def merge(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ``bench --pusht`` record from shards over disjoint seeds (settings of the first, seeds and dates of all).

    Raises:
        ValueError: no shard, shards that share a start, or shards that ran different methods.
    """
    if not documents:
        raise ValueError("merge needs at least one bench --pusht record, got none")
    methods = [list(d["pusht"]) for d in documents]
    if any(sorted(m) != sorted(methods[0]) for m in methods):
        raise ValueError(f"the shards ran different methods: {methods}")
    out: dict[str, Any] = {"pusht": {}}
    for name in methods[0]:  # in the bench's order
        rows = [row for d in documents for row in d["pusht"][name]["per_episode"]]
        seeds = [row["env_seed"] for row in rows]
        if len(set(seeds)) != len(seeds):
            shared = sorted(s for s in set(seeds) if seeds.count(s) > 1)
            raise ValueError(f"the shards share starts for {name!r}: {shared}")
        out["pusht"][name] = summarize(sorted(_episodes(rows), key=lambda e: e.env_seed))
    if all("continuity" in d for d in documents):
        out["continuity"] = {}
        for name, by_delay in documents[0]["continuity"].items():
            for delay in by_delay:
                rows = [row for d in documents for row in d["continuity"][name][delay]["per_episode"]]
                out["continuity"].setdefault(name, {})[delay] = summarize(
                    sorted(_episodes(rows), key=lambda e: e.env_seed))
    out["settings"] = {**documents[0]["settings"], "shards": [
        {"seed": d["settings"]["seed"], "episodes": d["settings"]["episodes"], "started": d.get("started"),
         "date": d.get("date"), "commit": d.get("commit")} for d in documents]}
    out["settings"]["seed"] = min(d["settings"]["seed"] for d in documents)
    out["settings"]["episodes"] = sum(d["settings"]["episodes"] for d in documents)
    out["latency"] = documents[0].get("latency")
    out["date"], out["commit"] = documents[-1].get("date"), documents[-1].get("commit")
    return out


def paired(figures_a: dict[str, Any], figures_b: dict[str, Any]) -> dict[str, Any]:
    """``b`` minus ``a`` on the starts both played: coverage and success differences, each with a bootstrap 95 %
    interval, and the starts only one of them succeeded on (:func:`~.bench_records.paired_outcomes`)."""
    a, b = ({row["env_seed"]: (row["max_coverage"], row["success"]) for row in f["per_episode"]}
            for f in (figures_a, figures_b))
    figures = paired_outcomes(a, b)
    return {"starts": figures.pop("pairs"), **figures}


SAME_COVERAGE = 1e-9
"""Max coverages this close are one episode's: gym-pusht's coverage of one pose can differ by an ulp between envs."""


def agreement(document_a: dict[str, Any], document_b: dict[str, Any]) -> dict[str, Any]:
    """Whether two ``bench --pusht`` records of the same starts (two faces) agree, method by method.

    Returns:
        `dict`: per method both ran: each record's coverage and success with their intervals, the paired difference
        (``b`` minus ``a``, :func:`paired`), ``intervals_overlap`` (coverage and success intervals of the two
        records), ``paired_holds_zero`` and ``same_episodes`` (of ``starts``). Methods only one ran are listed under
        ``only_a`` / ``only_b``.

    Raises:
        ValueError: the records share no method, or a method shares no start.
    """
    names = [name for name in document_a["pusht"] if name in document_b["pusht"]]
    if not names:
        raise ValueError(f"the records share no method: {list(document_a['pusht'])} and {list(document_b['pusht'])}")

    def overlap(low_high_a: Sequence[float], low_high_b: Sequence[float]) -> bool:
        return low_high_a[0] <= low_high_b[1] and low_high_b[0] <= low_high_a[1]

    out: dict[str, Any] = {"methods": {}, "only_a": [n for n in document_a["pusht"] if n not in names],
                           "only_b": [n for n in document_b["pusht"] if n not in names]}
    for name in names:
        fa, fb = document_a["pusht"][name], document_b["pusht"][name]
        diff = paired(fa, fb)
        rows_a = {row["env_seed"]: row for row in fa["per_episode"]}
        same = sum(1 for row in fb["per_episode"] if row["env_seed"] in rows_a
                   and (row["steps"], row["success"]) == (rows_a[row["env_seed"]]["steps"],
                                                         rows_a[row["env_seed"]]["success"])
                   and abs(row["max_coverage"] - rows_a[row["env_seed"]]["max_coverage"]) <= SAME_COVERAGE)
        out["methods"][name] = {
            "a": {k: fa[k] for k in ("episodes", "coverage_mean", "coverage_mean_ci95", "success_rate",
                                     "success_rate_ci95")},
            "b": {k: fb[k] for k in ("episodes", "coverage_mean", "coverage_mean_ci95", "success_rate",
                                     "success_rate_ci95")},
            "paired": diff,
            "intervals_overlap": overlap(fa["coverage_mean_ci95"], fb["coverage_mean_ci95"])
            and overlap(fa["success_rate_ci95"], fb["success_rate_ci95"]),
            "paired_holds_zero": all(low <= 0.0 <= high for low, high in (diff["coverage_diff_ci95"],
                                                                          diff["success_diff_ci95"])),
            "same_episodes": same, "starts": diff["starts"]}
    return out


def reducers_versus(document: dict[str, Any], baseline: str = "single") -> dict[str, dict[str, Any]]:
    """Each reducer method against ``baseline`` on the starts both played (:func:`paired`); empty without it."""
    blocks = document["pusht"]
    if baseline not in blocks:
        return {}
    return {name: paired(blocks[baseline], f) for name, f in blocks.items() if name != baseline}


def continuity_versus(document: dict[str, Any], baseline: str = "naive_async") -> dict[str, dict[str, Any]]:
    """Each continuity method against ``baseline`` at the delays both ran: :func:`paired` and ``seam_ratio``
    (``baseline``'s mean seam jump over the method's; ``None`` for a method without a seam)."""
    blocks = document.get("continuity", {})
    base = blocks.get(baseline, {})
    return {name: {d: {**paired(base[d], f), "seam_ratio": base[d]["seam_jump_mean"] / f["seam_jump_mean"]
                       if f["seam_jump_mean"] > 0 else None}
                   for d, f in by_delay.items() if d in base}
            for name, by_delay in blocks.items() if name != baseline}


def provenance(document: dict[str, Any]) -> str:
    """The line above the tables: which starts, what was served, and each shard's start, date and commit."""
    settings = document["settings"]
    first, episodes = settings["seed"], settings["episodes"]
    model = (settings.get("served") or {}).get("model") or settings.get("policy")
    runs = "; ".join(f"starts {s['seed']}..{s['seed'] + s['episodes'] - 1} {s.get('started') or '?'} to "
                     f"{s.get('date') or '?'}, code of {s.get('commit') or '?'}"
                     for s in settings.get("shards") or [])
    return (f"Starts {first}..{first + episodes - 1} ({episodes}), N = {settings.get('count', 8)}, "
            f"through {settings.get('through', 'process')}, serving {model}. Runs: {runs}.\n")


def markdown(document: dict[str, Any], *, baseline: str = "single") -> str:
    """The reducer table (with each method's paired difference against ``baseline``) and the published rows."""
    count = document["settings"].get("count", 8)
    lines = ["| method | mean max coverage (95 %) | success (95 %) | paired vs " + baseline + ": coverage, success |",
             "|---|---|---|---|"]
    against = reducers_versus(document, baseline)
    for name, f in document["pusht"].items():
        low, high = f["coverage_mean_ci95"]
        s_low, s_high = f["success_rate_ci95"]
        label = f"`{name}`" + ("" if name == "single" else f"@{count}")
        versus = ""
        if name in against:
            p = against[name]
            (c_low, c_high), (d_low, d_high) = p["coverage_diff_ci95"], p["success_diff_ci95"]
            versus = (f"{p['coverage_diff_mean']:+.3f} ({c_low:+.3f}..{c_high:+.3f}), "
                      f"{p['success_diff']:+.0%} ({d_low:+.0%}..{d_high:+.0%})")
        lines.append(f"| {label} | {f['coverage_mean']:.3f} ({low:.3f}..{high:.3f}) | "
                     f"{f['successes']}/{f['episodes']}, {f['success_rate']:.0%} ({s_low:.0%}..{s_high:.0%}) | "
                     f"{versus} |")
    for source, coverage, success in PUBLISHED:
        lines.append(f"| {source} | {coverage} | {success} | |")
    return "\n".join(lines) + "\n"


def continuity_markdown(document: dict[str, Any], *, baseline: str = "naive_async") -> str:
    """The continuity table: per method and delay, coverage, success and the seam, with the paired coverage
    difference against ``baseline`` at the same delay and the seam ratio (:func:`continuity_versus`)."""
    lines = [f"| method | d | mean max coverage (95 %) | success (95 %) | seam jump, mean px | paired vs {baseline}: "
             "coverage | seam ratio |", "|---|---|---|---|---|---|---|"]
    against = continuity_versus(document, baseline)
    for name, by_delay in document.get("continuity", {}).items():
        for delay, f in by_delay.items():
            low, high = f["coverage_mean_ci95"]
            s_low, s_high = f["success_rate_ci95"]
            versus = ratio = ""
            p = against.get(name, {}).get(delay)
            if p is not None:
                c_low, c_high = p["coverage_diff_ci95"]
                versus = f"{p['coverage_diff_mean']:+.3f} ({c_low:+.3f}..{c_high:+.3f})"
                if p["seam_ratio"] is not None:
                    ratio = f"{p['seam_ratio']:.1f}x"
            lines.append(f"| `{name}` | {delay} | {f['coverage_mean']:.3f} ({low:.3f}..{high:.3f}) | "
                         f"{f['successes']}/{f['episodes']}, {f['success_rate']:.0%} ({s_low:.0%}..{s_high:.0%}) | "
                         f"{f['seam_jump_mean']:.1f} | {versus} | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.pusht.bench_table",
                                     description="merge bench --pusht shards; write the record and the table")
    parser.add_argument("shards", nargs="+", type=Path, help="bench --pusht --json records over disjoint seeds")
    parser.add_argument("--json", type=Path, required=True, help="the merged record")
    parser.add_argument("--markdown", type=Path, default=None, help="the table (default: beside --json, .md)")
    parser.add_argument("--agree", action="store_true",
                        help="compare two records of the same starts (two faces) instead of merging shards")
    args = parser.parse_args(argv)
    if args.agree:
        if len(args.shards) != 2:
            parser.error(f"--agree compares exactly two records, got {len(args.shards)}")
        a, b = (json.loads(p.read_text(encoding="utf-8")) for p in args.shards)
        document = {side: {"file": path.name, **record["settings"], "date": record.get("date"),
                           "commit": record.get("commit")}
                    for side, path, record in (("a", args.shards[0], a), ("b", args.shards[1], b))}
        document.update(agreement(a, b))
        write_json(args.json, document)
        for name, row in document["methods"].items():
            print(f"{name}: {row['same_episodes']}/{row['starts']} same episodes; coverage "
                  f"{row['a']['coverage_mean']:.3f} vs {row['b']['coverage_mean']:.3f}, paired difference "
                  f"{row['paired']['coverage_diff_mean']:+.3f}; intervals overlap: {row['intervals_overlap']}, "
                  f"paired interval holds zero: {row['paired_holds_zero']}")
        return 0
    document = merge([json.loads(p.read_text(encoding="utf-8")) for p in args.shards])
    if "single" in document["pusht"]:
        document["paired_vs_single"] = reducers_versus(document)
    continuity = continuity_versus(document)
    if continuity:
        document["continuity_vs_naive_async"] = continuity
    write_json(args.json, document)
    table = provenance(document) + "\n" + markdown(document)
    if document.get("continuity"):
        table += "\n" + continuity_markdown(document)
    (args.markdown or args.json.with_suffix(".md")).write_text(table, encoding="utf-8")
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
