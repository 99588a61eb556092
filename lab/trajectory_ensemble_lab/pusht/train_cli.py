"""``trajectory-ensemble train-pusht``: the command that encodes PushT data, trains the policy and saves it.

What a run trains on and how examples are cut and cached is :mod:`.train`; the objective, the loop, EMA and saving
are the shared trainer's (:mod:`trajectory_ensemble_lab.training`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from trajectory_ensemble_node.errors import TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.models.cosmos3 import declared_state_input
from ..training import TrainingError
from ..training.augment import add_prefix_arguments
from ..training.fit import add_fit_arguments, fit, write_summary
from .policy_state import STATE_SETS
from .state_demos import episode_seeds
from .train import (
    CHUNK,
    DEFAULT_BAGS,
    DEFAULT_OUT,
    PUSHT_CONFIG,
    PUSHT_FORMAT,
    action_stats,
    build_pusht_dataset,
    build_state_dataset,
    demo_bags,
    listed_episodes,
    load_for_training,
    normalization_images,
    state_episode_files,
    state_normalization_images,
    write_stats,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``train-pusht`` options on ``parser``."""
    parser.add_argument("--bags", type=Path, default=DEFAULT_BAGS,
                        help="a demonstration bag, or a folder of them (make pusht-demos writes out/pusht/demos/bags)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="pipeline directory to write (save_pretrained), with action_stats.json")
    parser.add_argument("--work-dir", type=Path, default=Path("out/pusht/train"),
                        help="dataset cache, checkpoints, summary")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where encoded examples are cached (DIR/pusht_data) instead of the work dir; entries "
                             "are keyed by the data, the VAE and the state input, so runs that fine-tune on the same "
                             "data can share one and encode only what is new")
    parser.add_argument("--clips", action="store_true",
                        help="train the vision term on each example's 17 following frames (about 1.1 s of VAE per "
                             "example on one core); default: toward the latent mean")
    parser.add_argument("--states", type=Path, action="append", default=None,
                        help="a folder of state-only episodes (pusht-demos --states-only: DIR/states), repeatable; "
                             "frames are drawn from the states, DART episodes train on the expert's clean labels; "
                             "instead of --bags")
    parser.add_argument("--state-input", nargs="?", const="agent", default=None, choices=sorted(STATE_SETS),
                        help="declare a state input, fed as a clean latent frame (needs --states): 'agent' (the "
                             "default) the agent's position (agent_x, agent_y, env pixels); 'pose' also the T's true "
                             "pose, a lab diagnostic that no robot can serve")
    parser.add_argument("--redeclare-state", action="store_true",
                        help="with --init: replace the checkpoint's state input with this run's and retrain it")
    parser.add_argument("--encode-shard", default=None, metavar="K/N",
                        help="with --states: encode only every N-th part from part K into the cache (--cache-dir, "
                             "else the work dir's), then exit (N processes fill one cache; a run without it then "
                             "reads it)")
    parser.add_argument("--prompt-merges", type=int, default=0, metavar="N",
                        help="a fresh policy's tokenizer learns up to N BPE merges on its caption (405 tokens, one "
                             "per byte; 12 from about 300 merges on), which every step and every served request "
                             "attends to; 0 (the default): byte-level; needs --states, not --init")
    parser.add_argument("--stride", type=int, default=1, help="control steps between training examples")
    parser.add_argument("--encoder", type=Path, default=None,
                        help="a pusht-encoder train bundle whose trained VAE replaces the pipeline's (the latents "
                             "are re-encoded: the cache is keyed by the VAE's weights)")
    add_fit_arguments(parser, steps=20000, batch=32, lr=3e-4, vision_weight=0.1, checkpoint_every=1000,
                      freeze_text=True)
    add_prefix_arguments(parser, CHUNK)


def run(args: argparse.Namespace) -> int:
    """Encode the bags, train, save the pipeline and its action statistics to ``args.out``, a summary to the work
    dir. A refused setting or data set prints ``NAME (code): message`` and returns 2."""
    try:
        return _train(args)
    except TrajectoryEnsembleError as error:
        print(f"error: {describe_error(error)}", file=sys.stderr)
        return 2


def _train(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.encode_threads)
    work_dir: Path = args.work_dir
    work_dir.mkdir(parents=True, exist_ok=True)
    cache_dir: Path = args.cache_dir or work_dir
    started = time.perf_counter()
    log = lambda message: print(message, flush=True)  # noqa: E731
    if args.state_input and not args.states:
        raise TrainingError("--state-input trains from state-only episodes: give --states")
    if args.states:
        if args.clips:
            raise TrainingError("--clips needs recorded frames: give --bags, not --states")
        files = state_episode_files(args.states)
        episodes = [dict(zip(("env_seed", "expert_seed"), episode_seeds(path))) for path in files]
        print(f"{len(files)} state-only episode files under {[str(d) for d in args.states]}", flush=True)
        pipe = load_for_training(args.init, args.seed, state_normalization_images(files), args.encoder,
                                 STATE_SETS[args.state_input] if args.state_input else None, args.redeclare_state,
                                 args.prompt_merges)
        dataset = build_state_dataset(pipe, files, stride=args.stride, cache_dir=cache_dir,
                                      shard=_shard(args.encode_shard), log=log)
        if dataset is None:
            print(f"encoded shard {args.encode_shard} in {time.perf_counter() - started:.0f} s", flush=True)
            return 0
    else:
        if args.prompt_merges:
            raise TrainingError("--prompt-merges trains from state-only episodes: give --states")
        bag_paths = demo_bags(args.bags)
        episodes = listed_episodes(bag_paths)
        print(f"{len(bag_paths)} bags, {len(episodes)} episodes, {sum(int(e['steps']) for e in episodes)} steps",
              flush=True)
        pipe = load_for_training(args.init, args.seed, normalization_images(bag_paths), args.encoder)
        dataset = build_pusht_dataset(pipe, bag_paths, clips=args.clips, stride=args.stride, cache_dir=cache_dir,
                                      log=log)
    encode_s = time.perf_counter() - started
    print(f"encode {encode_s:.0f} s", flush=True)
    declared = declared_state_input(pipe)
    write_stats(work_dir / "checkpoint", declared)
    result = fit(pipe, dataset, args, args.out, work_dir)
    write_stats(args.out, declared)
    return write_summary(work_dir, args.out, PUSHT_CONFIG, args, result, encode_s, time.perf_counter() - started,
                         format=PUSHT_FORMAT.__dict__, action_stats=action_stats(),
                         state_input=declared.entry() if declared is not None else None,
                         demonstrations=[[e["env_seed"], e["expert_seed"]] for e in episodes])


def _shard(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise TrainingError(f"--encode-shard must be K/N, got {text!r}") from None
    return (k, n)
