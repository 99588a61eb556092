"""``trajectory-ensemble train-toy``: flow-matching training of a small real Cosmos 3 policy on the toy task, on CPU.

The model is the real ``Cosmos3OmniTransformer`` (built by ``build_pipeline``), and every training forward is packed
by the serving path's own :func:`~trajectory_ensemble_node.models.cosmos3.packing.pack_forward` under the fan-out
attention layout: the batch's examples are blocks that share one text prefix, exactly as N candidates of one group
share it at inference. The conventions match what the serving path integrates:

- ``x_sigma = (1 - sigma) * x0 + sigma * eps`` on the noisy tokens only: vision latent frame 0 is the clean
  conditioning frame; every action token is noisy; action channels beyond the raw width (2) stay zero;
- the network predicts the velocity ``v = eps - x0`` (UniPC ``flow_prediction`` computes ``x0 = x_t - sigma * v``);
- the transformer gets the timestep ``sigma * 1000`` (it scales by 0.001 internally);
- loss = MSE on the action tokens' raw channels + ``vision_weight`` x MSE on the noisy vision tokens, whose target
  is the VAE latent of the rendered clip of the robot following the demonstrated path;
- with ``--prefix-conditioning P``, a share ``P`` of the examples get their first ``d`` actions (``d`` uniform in
  ``1..--prefix-max``) as clean tokens through the action mask, exactly as ``"mask"`` context guidance serves a
  frozen prefix (training-time action conditioning, Black et al. 2025); the loss covers only the noisy actions.
  ``--prefix-offset S`` moves such a prefix off the demonstration (:func:`offset_prefix`), so the policy learns to
  continue the chunk it is given rather than re-plan from the image; those examples leave the vision term out,
  since their clip shows the unmoved path;
- with ``--demo-drift S`` every demonstration drifts off its path by a random offset growing along the chunk
  (:func:`drift_chunk`), as demonstrations by hand do. The image then no longer fixes the action, so the denoiser
  learns to read the action tokens it is given, and a guided prefix informs the actions after it;
- with ``--demo-speed V`` a share ``--demo-speed-share`` of the demonstrations is retimed by a factor uniform in
  ``[1 - V, 1 + V]`` (:func:`retime_chunk`): the same path, walked slower or faster, as demonstrations by hand are.
  The image cannot show the speed, so a policy that learns them draws candidates that differ in speed within one
  side of the obstacle, and only the chunk being executed says which speed continues it. Retimed examples leave
  the vision term out, since their clip shows the path at the expert's own speed. With ``--demo-speed-prefixed``
  only examples with a clean prefix are retimed: the speed is then told by the frozen prefix (through the action
  mask), never left to chance, and examples without a prefix keep the expert's. What these policies did in closed
  loop is in ``docs/closed-loop.md``.

The saved pipeline (``save_pretrained``, safetensors, fp16) holds the EMA weights, the VAE and the tokenizer.

The objective, the loop and the encoding are the shared trainer's (:mod:`trajectory_ensemble_lab.training`, which
``train-pusht`` uses on recorded demonstrations); this command supplies the toy's examples and augmentations.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from trajectory_ensemble_node.toy import task
from ..training.augment import add_prefix_arguments, nonnegative, share
from ..training.fit import add_fit_arguments, write_summary
from . import dagger
from .data import build_dataset
from .objective import fit, sample_sigmas, training_loss
from .pipeline import DEFAULT_OUT, TOY_CONFIG, load_for_training

__all__ = ["TOY_CONFIG", "add_arguments", "fit", "run", "sample_sigmas", "training_loss"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``train-toy`` options on ``parser``."""
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="pipeline directory to write (save_pretrained)")
    parser.add_argument("--work-dir", type=Path, default=Path("out/toy_train"), help="dataset cache, log, summary")
    parser.add_argument("--scenes", type=int, default=640, help="training scene seeds 0..scenes-1")
    parser.add_argument("--mid-probability", type=float, default=0.35, help="share of seeds adding a mid-episode state")
    parser.add_argument("--closed-loop-states", type=int, default=0,
                        help="per seed, states along an expert detour up to the target, labelled with the detour's "
                             "continuation (examples.training_examples); 0 = the original dataset")
    parser.add_argument("--recovery-states", type=int, default=0,
                        help="per seed, states near the target off the expert paths, labelled with the straight "
                             "approach (examples.recovery_state); 0 = none")
    parser.add_argument("--bimodal-share", type=share, default=None,
                        help="draw this share of each batch's states from those with several expert options (the "
                             "bimodal initial scenes); default: every state equally likely")
    add_prefix_arguments(parser, task.HORIZON)
    parser.add_argument("--demo-drift", type=nonnegative, default=0.0,
                        help="std (normalized units) of the offset every demonstration drifts to by its chunk's end "
                             "(drift_chunk); 0 = the expert's own paths")
    parser.add_argument("--demo-speed", type=_speed_spread, default=0.0,
                        help="retime a share of the demonstrations by a factor uniform in [1 - V, 1 + V] "
                             "(retime_chunk); 0 = the expert's own speed")
    parser.add_argument("--demo-speed-share", type=share, default=0.5,
                        help="share of the examples --demo-speed retimes (the others keep the vision term)")
    parser.add_argument("--demo-speed-prefixed", action="store_true",
                        help="retime only examples with a clean prefix (--prefix-conditioning): the prefix then "
                             "says the speed, and examples without one keep the expert's")
    add_fit_arguments(parser)
    dagger.add_arguments(parser)


def _speed_spread(text: str) -> float:
    """An argparse type: a speed spread in ``[0, 1)``, so every retiming factor is positive."""
    value = float(text)
    if not (math.isfinite(value) and 0.0 <= value < 1.0):
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Train, print the loss, save the pipeline to ``args.out`` and a summary JSON to ``args.work_dir``.

    With ``--dagger-rounds K`` the run continues with K rounds of DAgger (:mod:`.dagger`).
    """
    if getattr(args, "dagger_rounds", 0):
        return dagger.run_dagger(args)
    torch.set_num_threads(args.encode_threads)
    work_dir: Path = args.work_dir
    work_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    pipe = load_for_training(args.init, args.seed)
    dataset = build_dataset(pipe, args.scenes, mid_probability=args.mid_probability,
                            closed_loop_states=args.closed_loop_states,
                            recovery_states=args.recovery_states, cache_dir=work_dir,
                            log=lambda m: print(m, flush=True))
    encode_s = time.perf_counter() - started
    print(f"encode {encode_s:.0f} s", flush=True)
    result = fit(pipe, dataset, args, args.out, work_dir)
    return write_summary(work_dir, args.out, TOY_CONFIG, args, result, encode_s, time.perf_counter() - started)
