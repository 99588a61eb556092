"""``trajectory-ensemble calibrate --bag BAG [--bag BAG ...]``: the uncertainty threshold from a team's own recordings.

Bags of successful episodes only are replayed into the node; each goal's ``uncertainty.score`` is a calibration
score, the threshold is split conformal, held-out bags give a Wilson interval, and :mod:`.reducer_choice` recommends
a reducer. The procedure and the JSON: docs/replay-tests.md, "Calibration from bags".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..cli.exits import fail
from ..provenance import git_commit, utc_now
from ..stats import conformal_threshold
from . import reducer_choice
from .novelty_calibration import rate

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_NODE_FAILED = 4
DEFAULT_REPLAY_OUT = Path("out/calibrate")


def add_bag_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--bag`` mode's flags (``calibrate`` keeps its toy-scene flags beside them)."""
    group = parser.add_argument_group(
        "calibration from bags", "replay recorded successful episodes into the node and calibrate on its candidates "
        "(--count, --reducer, --base-seed, --alpha and --json apply)")
    group.add_argument("--bag", action="append", type=Path, default=[], metavar="BAG",
                       help="rosbag2 folder of successful episodes to calibrate on (repeatable); selects this mode")
    group.add_argument("--heldout-bag", action="append", type=Path, default=[], metavar="BAG",
                       help="successful episodes held out: the false-alarm rate of the threshold (repeatable)")
    group.add_argument("--start-node", action="store_true",
                       help="start the node for the run (on an unused ROS domain) and stop it afterwards")
    group.add_argument("--params-file", type=Path, default=None, metavar="YAML",
                       help="with --start-node: the node's parameters (default: the toy policy's settings)")
    group.add_argument("--node-namespace", default="/trajectory_ensemble",
                       help="the node's fully qualified name (default /trajectory_ensemble)")
    group.add_argument("--wait", type=float, default=300.0, metavar="S", help="seconds to wait for the node (300)")
    group.add_argument("--goal-every", type=float, default=1.0, metavar="K", help="bag seconds per goal (1.0)")
    group.add_argument("--goal-offset", type=float, default=0.25, metavar="S",
                       help="bag seconds from the first image to the first goal (0.25)")
    group.add_argument("--rate", type=float, default=1.0, help="playback speed factor (1.0)")
    group.add_argument("--replay-out", type=Path, default=DEFAULT_REPLAY_OUT, metavar="DIR",
                       help=f"where each bag's replay is recorded ({DEFAULT_REPLAY_OUT})")
    group.add_argument("--reference-topic", default=None, metavar="TOPIC",
                       help="the bags' recorded actions, which the reducers are compared with (default: the topic "
                            "the bag's metadata names, as make-demo-bag --reference writes; none: no reducer choice)")
    group.add_argument("--reducer-variants", default=reducer_choice.DEFAULT_VARIANTS, metavar="LIST",
                       help="reducers compared on the recorded candidates: NAME or mode@THRESHOLD, single = "
                            f"candidate 0 (default {reducer_choice.DEFAULT_VARIANTS})")


def _reference_topic(args: argparse.Namespace, bag: Path) -> str | None:
    """``--reference-topic``, else the one the bag's metadata names (``make-demo-bag --reference``), else None."""
    from ..replay import bags

    return args.reference_topic or bags.bag_info(bag).custom_data.get(bags.REFERENCE_TOPIC_KEY)


def _scores(args: argparse.Namespace, bag_list: Sequence[Path], role: str, seed0: int,
            normalizer: Any = None) -> tuple[list[float], list[dict[str, Any]], list[Any], list[Any]]:
    """Replay each bag; the succeeded goals' scores, one record per bag, each scored goal's frame (RGB, or None
    for an encoding the replay cannot convert), which the novelty scorer is fitted on, and for each goal compared
    with the bag's recorded actions, every reducer variant's errors (:func:`.reducer_choice.goal_errors`)."""
    from ..replay.playback import ReplayOptions
    from ..replay.replay import replay

    scores: list[float] = []
    records: list[dict[str, Any]] = []
    frames: list[Any] = []
    errors: list[Any] = []
    seed = seed0
    for i, bag in enumerate(bag_list):
        opts = ReplayOptions(bag=bag, rate=args.rate, goal_every_s=args.goal_every, goal_offset_s=args.goal_offset,
                             out=args.replay_out / f"{role}-{i}", overwrite=True, candidates=args.count,
                             reducer=args.reducer, seed=seed, node_namespace=args.node_namespace, wait_s=args.wait,
                             plot=False, return_candidates=True, reference_topic=_reference_topic(args, bag))
        report = replay(opts, log=lambda line: None)
        report.write_summary()
        mine = [g.uncertainty_score for g in report.goals if g.status == "SUCCEEDED" and g.uncertainty_score is not None]
        failed = [f"goal {g.index}: {g.status} {g.error_message}".strip() for g in report.goals
                  if g.status != "SUCCEEDED"]
        scores += mine
        frames += [g.image for g in report.goals if g.status == "SUCCEEDED" and g.uncertainty_score is not None]
        seed += len(report.goals)
        records.append({"bag": str(bag), "goals": len(report.goals), "scored": len(mine), "failed": failed,
                        "scores": mine})
        errors += _variant_errors(args, report, normalizer)
        print(f"calibrate: {role} {bag}: {len(mine)} of {len(report.goals)} goals scored"
              + (f" ({len(failed)} failed: {failed[0]})" if failed else ""), flush=True)
    return scores, records, frames, errors


def _variant_errors(args: argparse.Namespace, report: Any, normalizer: Any) -> list[Any]:
    """Each goal's errors per reducer variant (empty without recorded actions or a known normalization)."""
    done = [g for g in report.goals if g.status == "SUCCEEDED" and g.candidates is not None]
    if report.reference_series is None or not done:
        return []
    if normalizer is None and not all(g.normalized for g in done):
        print("calibrate: reducers not compared: the node serves robot units and its action statistics are known "
              "only with --start-node", flush=True)
        return []
    variants = reducer_choice.usable_variants(args.reducer_variants, done[0].candidates.shape[-1])
    return reducer_choice.goal_errors(report, variants, normalizer)


def _normalizer(args: argparse.Namespace) -> Any:
    """The started node's action statistics (``None``: not started here, or it serves normalized actions)."""
    if not args.start_node:
        return None
    from ..serving.params import validate
    from ..serving.startup_checks import load_action_stats

    return load_action_stats(validate(_node_params(args)))


def calibrate_from_bags(args: argparse.Namespace) -> dict[str, Any]:
    """Score the bags and compute the threshold (module docstring); the JSON document.

    Raises:
        ValueError: Too few scored goals for a finite threshold at ``alpha``.
        BagError: A bag cannot be read.
        NodeUnreachableError: The node does not answer.
    """
    commit = git_commit()
    normalizer = _normalizer(args)
    cal_scores, cal_records, cal_frames, cal_errors = _scores(args, args.bag, "calibration", args.base_seed,
                                                              normalizer)
    threshold = conformal_threshold(cal_scores, args.alpha) if cal_scores else math.inf
    if not math.isfinite(threshold):
        need = math.ceil((1 - args.alpha) / args.alpha)
        raise ValueError(f"{len(cal_scores)} scored calibration goals give no finite threshold at alpha "
                         f"{args.alpha:g} (the rank ceil((1 - alpha)(n + 1)) exceeds n); record more successful "
                         f"episodes: at least {need} goals")
    held_scores, held_records, held_frames, held_errors = _scores(args, args.heldout_bag, "heldout",
                                                                  args.base_seed + 1_000_000, normalizer)
    uncertainty: dict[str, Any] = {
        "threshold": threshold,
        "alpha": args.alpha,
        "source": "bags",
        "calibration_goals": len(cal_scores),
        "calibration_bags": len(args.bag),
        "heldout_goals": len(held_scores),
        "acceptance_false_alarm_at_most": args.alpha + 0.05,
    }
    if held_scores:
        false_alarms = rate([s > threshold for s in held_scores])
        uncertainty.update(false_alarm_rate=false_alarms["rate"], false_alarms=false_alarms,
                           acceptance_met=false_alarms["rate"] <= args.alpha + 0.05)
    novelty = _novelty(args, cal_scores, cal_frames, held_scores, held_frames)
    # The variants each goal was compared with (those that fit the action width), in --reducer-variants order.
    reducer = ({"reducer": reducer_choice.choose(cal_errors, held_errors, reducer_choice.parse_variants(
        list(cal_errors[0].variants)))} if cal_errors else {})
    return {
        "uncertainty": uncertainty,
        **novelty,
        **reducer,
        "settings": {
            "date": utc_now(), "commit": commit, "bags": [str(b) for b in args.bag],
            "heldout_bags": [str(b) for b in args.heldout_bag], "count": args.count, "reducer": args.reducer,
            "base_seed": args.base_seed, "goal_every_s": args.goal_every, "goal_offset_s": args.goal_offset,
            "node": args.node_namespace, "params_file": str(args.params_file) if args.params_file else None,
            "reference_topic": args.reference_topic, "reducer_variants": args.reducer_variants,
            "score": "uncertainty.score of each goal's result: mean RMS distance (normalized space) from each "
                     "candidate to its nearest other",
        },
        "scores": {"calibration": cal_scores, "heldout": held_scores},
        "episodes": {"calibration": cal_records, "heldout": held_records},
    }


def _novelty(args: argparse.Namespace, cal_scores: list[float], cal_frames: list[Any], held_scores: list[float],
             held_frames: list[Any]) -> dict[str, Any]:
    """The novelty scorer fitted on the same goals (issue 33, :func:`.novelty_calibration.from_episodes`): the
    ``observation`` and ``combined`` sections, or nothing when the model or a frame is unknown here."""
    from . import novelty_calibration

    if not args.start_node:
        print("calibrate: novelty not calibrated: it needs --start-node, so this run knows the model the frames are "
              "embedded with", flush=True)
        return {}
    if any(frame is None for frame in cal_frames + held_frames):
        print("calibrate: novelty not calibrated: some frames have an encoding the replay cannot convert to RGB",
              flush=True)
        return {}
    from ..serving.params import validate

    scorer_path = getattr(args, "scorer_out", None) or args.json.with_suffix(".novelty.safetensors")
    observation, combined = novelty_calibration.from_episodes(
        validate(_node_params(args)), cal_scores, cal_frames, held_scores, held_frames, args.alpha,
        scorer_path=scorer_path, kind=getattr(args, "scorer", novelty_calibration.DEFAULT_SCORER),
        fit_share=getattr(args, "fit_share", novelty_calibration.DEFAULT_FIT_SHARE), seed=args.base_seed)
    return {"observation": observation, "combined": combined}


def markdown(result: dict[str, Any]) -> str:
    """A short human summary of a ``calibrate --bag`` result."""
    u, s = result["uncertainty"], result["settings"]
    lines = [f"# Uncertainty calibration from bags ({s['date']}, commit {s['commit']})", "",
             f"N = {s['count']} candidates, reducer `{s['reducer']}`. Score: {s['score']}. Split-conformal threshold "
             f"at alpha = {u['alpha']} from {u['calibration_goals']} goals of {u['calibration_bags']} bag(s) of "
             "successful episodes.", "", "| figure | value |", "|---|---|", f"| threshold | {u['threshold']:.4f} |"]
    if "false_alarms" in u:
        fa = u["false_alarms"]
        low, high = fa["ci95"]
        lines += [f"| false-alarm rate, {u['heldout_goals']} held-out goals | {100 * fa['rate']:.0f}% "
                  f"[{100 * low:.0f}, {100 * high:.0f}] ({fa['count']}/{fa['of']}) |", "",
                  f"Acceptance (false alarms <= alpha + 0.05 = {u['acceptance_false_alarm_at_most']:.2f}): "
                  f"{'met' if u['acceptance_met'] else 'NOT met'}. Interval: Wilson 95%."]
    if "observation" in result:
        o, c = result["observation"], result["combined"]
        lines += ["", f"Novelty: {o['scorer']} scorer on {o['embedding']} ({o['embedding_dim']} values) fitted on "
                  f"{o['fit_goals']} goals, threshold {o['threshold']:.4g} from the other {o['threshold_goals']}; "
                  f"scorer `{o['scorer_file']}` (the node's novelty_scorer_file). Rule `{c['rule']}` "
                  f"({c['recommendation']}).", "", "| rule | false alarms, held-out goals |", "|---|---|"]
        lines += [f"| `{name}` | " + ("-" if f["false_alarm_rate"] is None else f"{100 * f['false_alarm_rate']:.0f}%")
                  + " |" for name, f in c["rules"].items()]
    if "reducer" in result:
        lines += reducer_choice.markdown_lines(result["reducer"])
    return "\n".join(lines + [""])


def _node_params(args: argparse.Namespace) -> dict[str, Any]:
    if args.params_file is not None:
        from ..serving.params_file import read_params_file

        return read_params_file(str(args.params_file), args.node_namespace)
    from ..demo.demo import default_model, node_params

    return node_params(default_model(), "auto", args.count)


def run(args: argparse.Namespace, toy_json: Path | None = None) -> int:
    """Run ``calibrate --bag``: 0 written; 2 bad bags or arguments (or too few goals); 3 no node; 4 the node did not
    start.

    Args:
        args (`argparse.Namespace`): ``calibrate``'s flags.
        toy_json (`Path`, *optional*): The toy mode's default ``--json``, which this mode refuses to overwrite.
    """
    from ..errors import TrajectoryEnsembleError
    from ..replay.bag_check import check_replay_bag
    from ..cli.launcher import NodeProcess, NodeStartError, ros_env, unused_domain_id
    from ..replay.playback import ReplayOptions
    from ..cli.ros_client import NodeUnreachableError

    if args.json == toy_json:
        print(f"error: calibrate --bag needs --json PATH ({toy_json} holds the toy-scene calibration)",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.params_file is not None and not args.start_node:
        print("error: --params-file is for --start-node (a running node has its parameters already)", file=sys.stderr)
        return EXIT_BAD_INPUT
    node = None
    try:
        reducer_choice.parse_variants(args.reducer_variants)  # a bad variant is a usage error, before any replay
        # Every bag is checked before a node is started or contacted: a damaged recording is a bad bag (2).
        for bag in [*args.bag, *args.heldout_bag]:
            check_replay_bag(ReplayOptions(bag=bag))
        if args.start_node:
            params = _node_params(args)
            domain = unused_domain_id()
            # This process's rclpy reads the domain at init; the node gets the same one through its environment.
            os.environ["ROS_DOMAIN_ID"] = str(domain)
            args.replay_out.mkdir(parents=True, exist_ok=True)
            node = NodeProcess(params, ros_env(domain), log_path=args.replay_out / "node.log")
            print(f"calibrate: starting the node on ROS_DOMAIN_ID={domain}; log {args.replay_out}/node.log",
                  flush=True)
            node.start(ready_timeout_s=args.wait)
        result = calibrate_from_bags(args)
    except NodeStartError as error:
        return fail(error, EXIT_NODE_FAILED)
    except NodeUnreachableError as error:
        return fail(error, EXIT_UNREACHABLE)
    except (TrajectoryEnsembleError, ValueError) as error:
        return fail(error, EXIT_BAD_INPUT)
    finally:
        if node is not None:
            node.stop()
    out: Path = args.json
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result))
    u = result["uncertainty"]
    print(json.dumps({"uncertainty": {k: u[k] for k in ("threshold", "alpha", "calibration_goals", "heldout_goals",
                                                        "false_alarm_rate") if k in u},
                      **({"reducer": {k: result["reducer"][k] for k in ("recommended", "reducer", "mode_threshold")}}
                         if "reducer" in result else {})}))
    print(f"wrote {out} and {out.with_suffix('.md')} (the node loads it as uncertainty_calibration_file)")
    return EXIT_OK
