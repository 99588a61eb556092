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
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import (
    PackItem,
    TinyCosmos3Config,
    build_pipeline,
    encode_conditioning,
    forward_items,
    install_fanout,
)
from trajectory_ensemble_node.toy import task
from .augment import drift_chunk, offset_prefix, retime_chunk, sample_prefixes, sample_speeds
from trajectory_ensemble_node.toy import action_condition
from .data import ToyDataset, build_dataset

TOY_CONFIG = TinyCosmos3Config(
    hidden_size=192,
    num_layers=3,
    num_heads=6,
    num_kv_heads=2,
    intermediate_size=320,
    rope_axes_dim=(8, 4, 4),
    action_dim=8,
    vae_base_dim=8,
    vae_z_dim=16,
    vae_dim_mult=(1, 2, 2, 2),
    vae_num_res_blocks=1,
    # The serving schedule's shift. Measured on the shipped weights (10 UniPC steps, 32 candidates on 16 held-out
    # scenes): shift 5 collided 70%, shift 1 31%. The side of the obstacle is decided at mid sigma, where shift 5
    # leaves only two or three steps. Training still emphasizes high sigma (``--sigma-shift``).
    flow_shift=1.0,
)
"""Shape of the shipped toy policy: about 1.9M transformer parameters, about 4.5 MB in fp16 with VAE and tokenizer."""

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "assets" / "toy_policy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``train-toy`` options on ``parser``."""
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="pipeline directory to write (save_pretrained)")
    parser.add_argument("--work-dir", type=Path, default=Path("out/toy_train"), help="dataset cache, log, summary")
    parser.add_argument("--scenes", type=int, default=640, help="training scene seeds 0..scenes-1")
    parser.add_argument("--mid-probability", type=float, default=0.35, help="share of seeds adding a mid-episode state")
    parser.add_argument("--closed-loop-states", type=int, default=0,
                        help="per seed, states along an expert detour up to the target, labelled with the detour's "
                             "continuation (task.training_examples); 0 = the original dataset")
    parser.add_argument("--recovery-states", type=int, default=0,
                        help="per seed, states near the target off the expert paths, labelled with the straight "
                             "approach (task.recovery_state); 0 = none")
    parser.add_argument("--bimodal-share", type=_share, default=None,
                        help="draw this share of each batch's states from those with several expert options (the "
                             "bimodal initial scenes); default: every state equally likely")
    parser.add_argument("--prefix-conditioning", type=_share, default=0.0,
                        help="share of examples whose first d actions are given clean through the action mask "
                             "(how 'mask' context guidance serves a frozen prefix); 0 = none")
    parser.add_argument("--prefix-max", type=_prefix_length, default=task.HORIZON // 2,
                        help="largest clean prefix d of a --prefix-conditioning example (d is uniform in 1..this)")
    parser.add_argument("--prefix-offset", type=_nonnegative, default=0.0,
                        help="std (normalized units) of the offset a --prefix-conditioning example's clean prefix is "
                             "moved by, the rest of its chunk joining the prefix and returning to the demonstration "
                             "(offset_prefix); 0 = prefixes are the demonstration's own")
    parser.add_argument("--demo-drift", type=_nonnegative, default=0.0,
                        help="std (normalized units) of the offset every demonstration drifts to by its chunk's end "
                             "(drift_chunk); 0 = the expert's own paths")
    parser.add_argument("--demo-speed", type=_speed_spread, default=0.0,
                        help="retime a share of the demonstrations by a factor uniform in [1 - V, 1 + V] "
                             "(retime_chunk); 0 = the expert's own speed")
    parser.add_argument("--demo-speed-share", type=_share, default=0.5,
                        help="share of the examples --demo-speed retimes (the others keep the vision term)")
    parser.add_argument("--demo-speed-prefixed", action="store_true",
                        help="retime only examples with a clean prefix (--prefix-conditioning): the prefix then "
                             "says the speed, and examples without one keep the expert's")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=8, help="examples packed into one forward")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate of the one-cycle schedule")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--vision-weight", type=float, default=0.1, help="weight of the noisy-vision MSE")
    parser.add_argument("--ema", type=float, default=0.999, help="EMA decay of the saved weights (0 disables)")
    parser.add_argument("--seed", type=int, default=0, help="model init, example sampling and noise")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 keeps a shared machine usable)")
    parser.add_argument("--encode-threads", type=int, default=1, help="torch CPU threads while encoding the dataset")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--checkpoint-every", type=int, default=1000, help="also save the EMA pipeline every N steps")
    parser.add_argument("--save-dtype", choices=("float16", "float32"), default="float16")
    parser.add_argument("--sigma-shift", type=float, default=5.0,
                        help="half of each batch's sigmas are shifted by this toward high noise (1 = none)")
    parser.add_argument("--init", type=Path, default=None,
                        help="continue from this pipeline directory (e.g. the shipped weights) instead of a fresh one")


def _share(text: str) -> float:
    """An argparse type: a share in ``[0, 1]``."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a share in [0, 1], got {text!r}")
    return value


def _nonnegative(text: str) -> float:
    """An argparse type: a finite number ``>= 0``."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0.0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def _speed_spread(text: str) -> float:
    """An argparse type: a speed spread in ``[0, 1)``, so every retiming factor is positive."""
    value = float(text)
    if not (math.isfinite(value) and 0.0 <= value < 1.0):
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def _prefix_length(text: str) -> int:
    """An argparse type: a clean-prefix length that leaves at least one action to denoise."""
    value = int(text)
    if not 1 <= value < task.HORIZON:
        raise argparse.ArgumentTypeError(f"must be in [1, {task.HORIZON}), got {text!r}")
    return value


def sample_sigmas(count: int, generator: torch.Generator, shift: float) -> torch.Tensor:
    """Logit-normal sigmas, half of them shifted toward high noise (``shift * s / (1 + (shift - 1) * s)``).

    The side of the obstacle is decided at high-to-mid sigma, so half the batch trains there; the unshifted half
    keeps the low-sigma refinement trained. This is a training emphasis only: the serving schedule's own shift is
    the pipeline config's ``flow_shift`` (1.0 for the toy).

    Returns:
        `torch.Tensor` of shape `[count]`, in ``(0, 1)``.
    """
    sigma = torch.sigmoid(torch.randn(count, generator=generator))
    shifted = shift * sigma / (1 + (shift - 1) * sigma)
    use_shift = torch.rand(count, generator=generator) < 0.5
    return torch.where(use_shift, shifted, sigma).clamp(1e-4, 1 - 1e-4)


def training_loss(
    pipe: Cosmos3OmniPipeline,
    dataset: ToyDataset,
    examples: list[int],
    sigmas: torch.Tensor,
    generator: torch.Generator,
    vision_weight: float,
    prefixes: list[int] | None = None,
    offsets: list[torch.Tensor | None] | None = None,
    drifts: torch.Tensor | None = None,
    speeds: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float, float]:
    """Flow-matching loss of ``examples`` packed into ONE transformer forward.

    Args:
        pipe (`Cosmos3OmniPipeline`): Pipeline with the fan-out processor installed on its transformer.
        dataset (`ToyDataset`): Encoded examples.
        examples (`list[int]`): Example indexes, one block each.
        sigmas (`torch.Tensor` of shape `[B]`): Noise level per example.
        generator (`torch.Generator`): Noise source.
        vision_weight (`float`): Weight of the vision term.
        prefixes (`list[int]`, *optional*): Per example, how many leading actions are clean conditioning tokens
            (left out of the noisy action indexes and of the loss); default none.
        offsets (`list`, *optional*): Per example, ``None`` or the ``[2]`` offset its clean prefix is moved by
            (:func:`offset_prefix`; needs a prefix); a moved example leaves the vision term out.
        drifts (`torch.Tensor` of shape `[B, 2]`, *optional*): Per example, the end offset its demonstration
            drifts to (:func:`drift_chunk`), applied before any prefix offset.
        speeds (`torch.Tensor` of shape `[B]`, *optional*): Per example, the factor its demonstration is retimed by
            (:func:`retime_chunk`, from ``dataset.starts``), applied first; an example not at 1 leaves the vision
            term out.

    Returns:
        `tuple`: total loss (scalar tensor), action MSE, vision MSE (floats).
    """
    transformer = pipe.transformer
    raw = dataset.actions.shape[-1]
    action_dim = transformer.config.action_dim
    horizon = dataset.actions.shape[1]
    prefixes = prefixes if prefixes is not None else [0] * len(examples)
    if len(prefixes) != len(examples) or any(not 0 <= d < horizon for d in prefixes):
        raise ValueError(f"prefixes must give each of the {len(examples)} examples a length in [0, {horizon}), "
                         f"got {prefixes!r}")
    offsets = offsets if offsets is not None else [None] * len(examples)
    if len(offsets) != len(examples) or any(o is not None and not d for o, d in zip(offsets, prefixes)):
        raise ValueError(f"offsets must give each of the {len(examples)} examples None, or an offset where it has a "
                         f"prefix; got offsets for {[o is not None for o in offsets]} and prefixes {prefixes!r}")
    items, targets_v, targets_a, loss_mask = [], [], [], []
    if drifts is not None and tuple(drifts.shape) != (len(examples), 2):
        raise ValueError(f"drifts must have shape ({len(examples)}, 2), got {tuple(drifts.shape)}")
    if speeds is not None and tuple(speeds.shape) != (len(examples),):
        raise ValueError(f"speeds must have shape ({len(examples)},), got {tuple(speeds.shape)}")
    retimed = [speeds is not None and float(speeds[i]) != 1.0 for i in range(len(examples))]
    if any(retimed) and dataset.starts is None:
        raise ValueError("retiming demonstrations needs the dataset's start positions (dataset.starts)")
    for index, (example, sigma, clean, offset) in enumerate(zip(examples, sigmas.tolist(), prefixes, offsets)):
        x0_v = dataset.clips[example : example + 1]  # [1, C, T, h, w]
        x0_a = dataset.actions[example]  # [H, 2]
        if retimed[index]:
            x0_a = retime_chunk(x0_a, dataset.starts[example], float(speeds[index]))
        if drifts is not None:
            x0_a = drift_chunk(x0_a, drifts[index])
        if offset is not None:
            x0_a = offset_prefix(x0_a, clean, offset)
        eps_v = torch.randn(x0_v.shape, generator=generator)
        eps_a = torch.randn(x0_a.shape, generator=generator)
        vision = x0_v.clone()
        vision[:, :, 1:] = (1 - sigma) * x0_v[:, :, 1:] + sigma * eps_v[:, :, 1:]
        action = torch.zeros(1, x0_a.shape[0], action_dim)
        action[0, :, :raw] = (1 - sigma) * x0_a + sigma * eps_a
        branch = dataset.branch
        if clean:
            action[0, :clean, :raw] = x0_a[:clean]
            noisy = branch.template.action_noisy_frame_indexes
            branch = dataclasses.replace(branch, template=dataclasses.replace(
                branch.template, action_noisy_frame_indexes=noisy[noisy >= clean]))
        items.append(PackItem(branch=branch, vision=vision, action=action, timestep=sigma * 1000.0))
        targets_v.append((eps_v - x0_v)[:, :, 1:])
        targets_a.append(eps_a - x0_a)
        loss_mask.append((torch.arange(horizon) >= clean).float()[:, None].expand(horizon, raw))
    preds_v, preds_a = forward_items(transformer, items, torch.device("cpu"))
    pred_v = torch.cat([p[:, :, 1:] for p in preds_v], dim=0)
    pred_a = torch.cat([p[:, :, :raw] for p in preds_a], dim=0)
    if any(prefixes):
        mask = torch.stack(loss_mask)
        loss_a = (mask * (pred_a - torch.stack(targets_a)) ** 2).sum() / mask.sum()
    else:
        loss_a = torch.nn.functional.mse_loss(pred_a, torch.stack(targets_a))
    if any(o is not None for o in offsets) or any(retimed):
        # A moved or retimed example's clip shows the demonstration it was made from, not the chunk it trains.
        keep = [i for i, o in enumerate(offsets) if o is None and not retimed[i]]
        loss_v = (torch.nn.functional.mse_loss(pred_v[keep], torch.cat(targets_v)[keep]) if keep
                  else pred_v.sum() * 0.0)
    else:
        loss_v = torch.nn.functional.mse_loss(pred_v, torch.cat(targets_v))
    return loss_a + vision_weight * loss_v, loss_a.item(), loss_v.item()


def init_action_heads(pipe: Cosmos3OmniPipeline, generator: torch.Generator) -> None:
    """Re-initialize the domain-aware action projections at a trainable scale.

    ``DomainAwareLinear`` keeps its weights in ``nn.Embedding`` tables, which initialize to N(0, 1): an action head
    whose outputs start at ~sqrt(hidden) times the target scale. Fan-in scaling for the input projection and a small
    output projection (as for any diffusion output head) start the loss near its noise floor instead.
    """
    transformer = pipe.transformer
    with torch.no_grad():
        for module, std in (
            (transformer.action_proj_in, 1.0 / math.sqrt(transformer.config.action_dim)),
            (transformer.action_proj_out, 0.02),
        ):
            module.fc.weight.copy_(torch.randn(module.fc.weight.shape, generator=generator) * std)
            module.bias.weight.zero_()


def normalize_latents(pipe: Cosmos3OmniPipeline, num_scenes: int = 64) -> tuple[list[float], list[float]]:
    """Set the VAE's per-channel latent normalization (``latents_mean`` / ``latents_std``) from toy observations.

    ``build_pipeline`` leaves the random VAE un-normalized (mean 0, std 1), and its raw latents have a std near 0.1
    with large channel offsets, so moving the target changes the conditioning tokens by about 1% of their norm and
    the policy learns to ignore them (a first run stayed unconditional for 2000 steps). Real Cosmos 3 checkpoints
    normalize latents per channel; doing the same here makes scene differences O(1). The statistics go into the VAE
    config, so ``_encode_video`` applies them in training and in serving alike, and the saved pipeline carries them.

    Args:
        pipe (`Cosmos3OmniPipeline`): Pipeline whose VAE normalization is still the identity.
        num_scenes (`int`): Training scenes (seeds ``0 .. num_scenes - 1``) whose observations give the statistics.

    Returns:
        `tuple`: per-channel means and stds (``z_dim`` floats each).
    """
    latents = torch.cat([
        encode_conditioning(
            pipe, prompt=task.INSTRUCTION, negative_prompt=None,
            action=action_condition(task.render(task.make_scene(task.TRAIN_SEED_BASE + seed))),
            fps=task.FPS, guidance_scale=task.GUIDANCE_SCALE, device=torch.device("cpu"),
        ).x0_vision[:, :, :1].detach()
        for seed in range(num_scenes)
    ])
    mean = [float(m) for m in latents.mean(dim=(0, 2, 3, 4))]
    std = [float(s) for s in latents.std(dim=(0, 2, 3, 4))]
    pipe.vae.register_to_config(latents_mean=mean, latents_std=std)
    # The pipeline caches these at construction (as from_pretrained will rebuild them from the saved config).
    pipe._vae_latents_mean = torch.tensor(mean, dtype=pipe.vae.dtype)
    pipe._vae_latents_inv_std = 1.0 / torch.tensor(std, dtype=pipe.vae.dtype)
    return mean, std


def round_vae_to_half(pipe: Cosmos3OmniPipeline) -> None:
    """Round the VAE weights through fp16 before anything is encoded, so the shipped fp16 VAE encodes exactly what
    training saw."""
    with torch.no_grad():
        for param in pipe.vae.parameters():
            param.copy_(param.half().float())


def save_pipeline(
    pipe: Cosmos3OmniPipeline, out: Path, dtype: torch.dtype, weights: list[torch.Tensor] | None = None
) -> int:
    """``save_pretrained`` (safetensors) a copy of ``pipe`` with weights in ``dtype``; returns the bytes written.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline being trained (left untouched).
        out (`Path`): Directory to write.
        dtype (`torch.dtype`): Storage dtype of the transformer and VAE weights.
        weights (`list[torch.Tensor]`, *optional*): Replacement values (e.g. EMA) for the transformer's trainable
            parameters, in ``parameters()`` order.
    """
    out.mkdir(parents=True, exist_ok=True)
    copy_pipe = copy.deepcopy(pipe)
    if weights is not None:
        with torch.no_grad():
            trainable = [p for p in copy_pipe.transformer.parameters() if p.requires_grad]
            for param, value in zip(trainable, weights, strict=True):
                param.copy_(value)
    copy_pipe.transformer.to(dtype)
    copy_pipe.vae.to(dtype)
    copy_pipe.save_pretrained(out, safe_serialization=True)
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file())


def run(args: argparse.Namespace) -> int:
    """Train, print the loss, save the pipeline to ``args.out`` and a summary JSON to ``args.work_dir``."""
    torch.set_num_threads(args.encode_threads)
    work_dir: Path = args.work_dir
    work_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    config = TOY_CONFIG
    if args.init is not None:
        # Continue from a saved pipeline: its VAE (already fp16-rounded) and latent normalization come with it.
        from trajectory_ensemble_node.toy import load_toy_pipeline

        pipe = load_toy_pipeline(path=args.init)
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, flow_shift=config.flow_shift)
        print(f"initialized from {args.init}", flush=True)
    else:
        pipe = build_pipeline(config, seed=args.seed)
        round_vae_to_half(pipe)
        init_action_heads(pipe, torch.Generator().manual_seed(args.seed + 1))
        latents_mean, latents_std = normalize_latents(pipe)
        print(f"latent normalization: mean {[round(m, 3) for m in latents_mean]}, "
              f"std {[round(s, 3) for s in latents_std]}", flush=True)
    dataset = build_dataset(pipe, args.scenes, mid_probability=args.mid_probability,
                            closed_loop_states=args.closed_loop_states,
                            recovery_states=args.recovery_states, cache_dir=work_dir,
                            log=lambda m: print(m, flush=True))
    encode_s = time.perf_counter() - started
    torch.set_num_threads(args.threads)
    transformer = pipe.transformer
    transformer.train()
    install_fanout(transformer)
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.05)
    ema = [p.detach().clone() for p in params] if args.ema > 0 else None
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    shift = float(args.sigma_shift)
    print(f"transformer parameters: {sum(p.numel() for p in params)}; states {dataset.num_states}, "
          f"examples {len(dataset.actions)}; encode {encode_s:.0f} s", flush=True)
    # Closed-loop states (one expert option each) can outnumber the bimodal initial scenes; drawn uniformly they
    # thin out the examples where the policy learns to keep two separate detours, and the fine-tuned policy's
    # candidates drifted toward the straight line between them. --bimodal-share keeps that share fixed instead.
    bimodal = unimodal = None
    if args.bimodal_share is not None:
        bimodal = np.array([i for i, o in enumerate(dataset.options) if len(o) > 1])
        unimodal = np.array([i for i, o in enumerate(dataset.options) if len(o) == 1])
        if not len(bimodal) or not len(unimodal):
            bimodal = unimodal = None
    history: list[dict[str, float]] = []
    window: list[tuple[float, float, float]] = []
    train_started = time.perf_counter()
    for step in range(1, args.steps + 1):
        if bimodal is None:
            states = rng.integers(0, dataset.num_states, size=args.batch)
        else:
            pick = rng.uniform(size=args.batch) < args.bimodal_share
            states = np.where(pick, rng.choice(bimodal, size=args.batch), rng.choice(unimodal, size=args.batch))
        # The expert side is drawn 50/50 per sample in a bimodal state, so one image is paired with both detours.
        examples = [int(rng.choice(dataset.options[s])) for s in states]
        sigmas = sample_sigmas(args.batch, generator, shift)
        prefixes = sample_prefixes(args.batch, generator, args.prefix_conditioning, args.prefix_max)
        offsets = None
        if args.prefix_offset > 0 and any(prefixes):
            drawn = torch.randn(args.batch, 2, generator=generator) * args.prefix_offset
            offsets = [drawn[i] if d else None for i, d in enumerate(prefixes)]
        drifts = torch.randn(args.batch, 2, generator=generator) * args.demo_drift if args.demo_drift > 0 else None
        speeds = None
        if args.demo_speed > 0:
            eligible = [d > 0 for d in prefixes] if args.demo_speed_prefixed else None
            speeds = sample_speeds(args.batch, generator, args.demo_speed_share, args.demo_speed, eligible)
        loss, loss_a, loss_v = training_loss(pipe, dataset, examples, sigmas, generator, args.vision_weight,
                                             prefixes, offsets, drifts, speeds)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        if ema is not None:
            decay = min(args.ema, (1 + step) / (10 + step))
            with torch.no_grad():
                torch._foreach_lerp_(ema, [p.detach() for p in params], 1 - decay)
        window.append((loss.item(), loss_a, loss_v))
        if step % args.log_every == 0 or step == args.steps:
            mean = np.mean(window, axis=0)
            window = []
            elapsed = time.perf_counter() - train_started
            history.append({"step": step, "loss": float(mean[0]), "action": float(mean[1]), "vision": float(mean[2])})
            print(f"step {step}/{args.steps} loss {mean[0]:.4f} (action {mean[1]:.4f}, vision {mean[2]:.4f}) "
                  f"lr {schedule.get_last_lr()[0]:.2e} {elapsed:.0f} s", flush=True)
        if args.checkpoint_every and step % args.checkpoint_every == 0 and step < args.steps:
            # Checkpoints live in the work dir (git-ignored out/), never in the shipped assets.
            save_pipeline(pipe, work_dir / "checkpoint", getattr(torch, args.save_dtype), ema)
            (work_dir / "checkpoint" / "STEP").write_text(str(step))
    transformer.eval()
    size = save_pipeline(pipe, args.out, getattr(torch, args.save_dtype), ema)
    wall = time.perf_counter() - started
    summary = {
        "config": {k: v for k, v in config.__dict__.items() if k != "extra"},
        "args": {k: str(v) for k, v in vars(args).items() if not k.startswith("_")},
        "states": dataset.num_states,
        "examples": len(dataset.actions),
        "transformer_parameters": sum(p.numel() for p in params),
        "encode_seconds": round(encode_s, 1),
        "wall_seconds": round(wall, 1),
        "final_loss": history[-1] if history else None,
        "loss_history": history,
        "saved_bytes": size,
        "torch": torch.__version__,
    }
    (work_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"saved {args.out} ({size / 1e6:.2f} MB) after {wall / 60:.1f} min; final loss {history[-1]['loss']:.4f}",
          flush=True)
    if not math.isfinite(history[-1]["loss"]):
        return 1
    return 0
