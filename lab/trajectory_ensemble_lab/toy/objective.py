"""The objective and the optimizer loop of ``train-toy``: flow matching on the toy policy's real transformer.

The conventions (noisy tokens, velocity target, timestep, vision term, prefixes, drift, retiming) are those the
serving path integrates; :mod:`.train`'s docstring gives them. :func:`fit` is one training run on one encoded
dataset; ``train-toy`` runs it once, DAgger (:mod:`.dagger`) once per round.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import PackItem, forward_items, install_fanout
from .augment import drift_chunk, offset_prefix, retime_chunk, sample_prefixes, sample_speeds
from .data import ToyDataset
from .pipeline import save_pipeline


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


def fit(pipe: Cosmos3OmniPipeline, dataset: ToyDataset, args: argparse.Namespace, out: Path,
        work_dir: Path) -> dict[str, object]:
    """Train ``pipe`` on ``dataset`` with ``args``'s objective and schedule; save the EMA pipeline to ``out``.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline to train (its transformer is trained in place).
        dataset (`ToyDataset`): Encoded examples.
        args (`argparse.Namespace`): ``train-toy``'s options (steps, lr, batch, seed, shares, augmentations...).
        out (`Path`): Where the trained pipeline is saved (``save_pretrained``).
        work_dir (`Path`): Where checkpoints go.

    Returns:
        `dict`: the run's ``states``, ``examples``, ``train_seconds``, ``final_loss``, ``loss_history``,
        ``saved_bytes`` and ``transformer_parameters``.
    """
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
          f"examples {len(dataset.actions)}", flush=True)
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
    size = save_pipeline(pipe, out, getattr(torch, args.save_dtype), ema)
    return {
        "states": dataset.num_states,
        "examples": len(dataset.actions),
        "transformer_parameters": sum(p.numel() for p in params),
        "train_seconds": round(time.perf_counter() - train_started, 1),
        "final_loss": history[-1] if history else None,
        "loss_history": history,
        "saved_bytes": size,
    }
