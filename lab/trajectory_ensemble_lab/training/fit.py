"""The objective and the optimizer loop of every Cosmos 3 policy trained here: flow matching on the real transformer.

Every training forward is packed by the serving path's own
:func:`~trajectory_ensemble_node.models.cosmos3.packing.pack_forward` under the fan-out attention layout: a batch's
examples are blocks that share one text prefix, exactly as N candidates of one group share it at inference. The
conventions are those the serving path integrates:

- ``x_sigma = (1 - sigma) * x0 + sigma * eps`` on the noisy tokens only: vision latent frame 0 is the clean
  conditioning frame (with a state input, frame 1 too: the state frame ``encode_conditioning``
  builds, as in serving); every action token is noisy; action channels beyond the raw width stay zero;
- the network predicts the velocity ``v = eps - x0`` (UniPC ``flow_prediction`` computes ``x0 = x_t - sigma * v``);
- the transformer gets the timestep ``sigma * 1000`` (it scales by 0.001 internally);
- loss = MSE on the action tokens' raw channels + ``vision_weight`` x MSE on the noisy vision tokens, whose target
  is the VAE latent of the example's clip. A data set without clips (``dataset.clips is None``; a PushT clip costs
  about 1.1 s of VAE per example on a CPU core) takes the normalized latents' mean, zero, as its vision target: the
  video positions then learn to settle on a fixed blank, so at inference they follow the path they trained on
  instead of an untrained velocity.

The toy's augmentations (clean prefixes, drift, retiming: :mod:`.augment`, ``toy/train.py``) are options of the
same objective, off unless a run's arguments set them. :func:`fit` is one training run on one encoded data set, with
an EMA of the weights, periodic checkpoints and ``save_pretrained`` at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import PackItem, PrefixKVCache, forward_items, install_fanout
from .augment import drift_chunk, offset_prefix, retime_chunk, sample_prefixes, sample_speeds
from . import TrainingError
from .dataset import EncodedDataset
from .pipeline import save_pipeline
from .text_prefix import freeze_text_pathway, instruction_cache
from ..records import write_json

AUGMENTATION_DEFAULTS: dict[str, object] = {
    "bimodal_share": None,
    "prefix_conditioning": 0.0,
    "prefix_max": 1,
    "prefix_offset": 0.0,
    "demo_drift": 0.0,
    "demo_speed": 0.0,
    "demo_speed_share": 0.5,
    "demo_speed_prefixed": False,
    "freeze_text": False,
}
"""What :func:`fit` uses for an augmentation option a run's arguments do not define (``train-pusht`` defines only the
prefix ones): every one off."""


def add_fit_arguments(parser: argparse.ArgumentParser, *, steps: int = 3000, batch: int = 8, lr: float = 1e-3,
                      vision_weight: float = 0.1, checkpoint_every: int = 1000, freeze_text: bool = False) -> None:
    """Register the options of :func:`fit` that every trainer shares (``train-toy``'s, with its defaults).

    Args:
        parser (`argparse.ArgumentParser`): The command's parser.
        steps, batch, lr, vision_weight, checkpoint_every, freeze_text: Defaults of the options of the same names,
            per task.
    """
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=batch, help="examples packed into one forward")
    parser.add_argument("--lr", type=float, default=lr, help="peak learning rate of the one-cycle schedule")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--vision-weight", type=float, default=vision_weight, help="weight of the noisy-vision MSE")
    parser.add_argument("--ema", type=float, default=0.999, help="EMA decay of the saved weights (0 disables)")
    parser.add_argument("--seed", type=int, default=0, help="model init, example sampling and noise")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 keeps a shared machine usable)")
    parser.add_argument("--encode-threads", type=int, default=1, help="torch CPU threads while encoding the dataset")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--checkpoint-every", type=int, default=checkpoint_every,
                        help="also save the EMA pipeline every N steps")
    parser.add_argument("--save-dtype", choices=("float16", "float32"), default="float16")
    parser.add_argument("--sigma-shift", type=float, default=5.0,
                        help="half of each batch's sigmas are shifted by this toward high noise (1 = none)")
    parser.add_argument("--init", type=Path, default=None,
                        help="continue from this pipeline directory (e.g. the shipped weights) instead of a fresh one")
    parser.add_argument("--resume", action="store_true",
                        help="continue from <work-dir>/resume.pt (weights, EMA, optimizer, schedule, generators), "
                             "written every --checkpoint-every steps; the run must ask for the same --steps")
    parser.add_argument("--freeze-text", action=argparse.BooleanOptionalAction, default=freeze_text,
                        help="keep the text pathway's weights as they are and compute the instruction's per-layer "
                             "keys/values once, so each step runs the generation tokens alone")


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
    dataset: EncodedDataset,
    examples: list[int],
    sigmas: torch.Tensor,
    generator: torch.Generator,
    vision_weight: float,
    prefixes: list[int] | None = None,
    offsets: list[torch.Tensor | None] | None = None,
    drifts: torch.Tensor | None = None,
    speeds: torch.Tensor | None = None,
    prefix_cache: PrefixKVCache | None = None,
    one_run: bool = True,
) -> tuple[torch.Tensor, float, float]:
    """Flow-matching loss of ``examples`` packed into ONE transformer forward.

    Args:
        pipe (`Cosmos3OmniPipeline`): Pipeline with the fan-out processor installed on its transformer.
        dataset (`EncodedDataset`): Encoded examples.
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
        prefix_cache (`PrefixKVCache`, *optional*): The instruction's per-layer keys/values, computed once while
            the text pathway is frozen (:func:`~.text_prefix.instruction_cache`); ``None`` computes the prefix in
            this forward, as the plain step does.
        one_run (`bool`): Pack consecutive examples with the same clean prefix as one item (one batched attention
            call per layer); ``False`` packs one item per example, as the trainer did before (the profile's
            baseline). The loss is the same either way.

    Returns:
        `tuple`: total loss (scalar tensor), action MSE, vision MSE (floats).
    """
    transformer = pipe.transformer
    raw = dataset.actions.shape[-1]
    action_dim = transformer.config.action_dim
    horizon = dataset.actions.shape[1]
    prefixes = prefixes if prefixes is not None else [0] * len(examples)
    if len(prefixes) != len(examples) or any(not 0 <= d < horizon for d in prefixes):
        raise TrainingError(f"prefixes must give each of the {len(examples)} examples a length in [0, {horizon}), "
                            f"got {prefixes!r}")
    offsets = offsets if offsets is not None else [None] * len(examples)
    if len(offsets) != len(examples) or any(o is not None and not d for o, d in zip(offsets, prefixes)):
        raise TrainingError(f"offsets must give each of the {len(examples)} examples None, or an offset where it "
                            f"has a prefix; got offsets for {[o is not None for o in offsets]} and prefixes "
                            f"{prefixes!r}")
    if drifts is not None and tuple(drifts.shape) != (len(examples), 2):
        raise TrainingError(f"drifts must have shape ({len(examples)}, 2), got {tuple(drifts.shape)}")
    if speeds is not None and tuple(speeds.shape) != (len(examples),):
        raise TrainingError(f"speeds must have shape ({len(examples)},), got {tuple(speeds.shape)}")
    retimed = [speeds is not None and float(speeds[i]) != 1.0 for i in range(len(examples))]
    if any(retimed) and dataset.starts is None:
        raise TrainingError("retiming demonstrations needs the dataset's start positions (dataset.starts)")
    first = dataset.condition.shape[2]  # the first noisy latent frame: after the image (and the state frame)
    visions, actions, timesteps, targets_v, targets_a, loss_mask = [], [], [], [], [], []
    for index, (example, sigma, clean, offset) in enumerate(zip(examples, sigmas.tolist(), prefixes, offsets)):
        x0_v = dataset.clips[example : example + 1] if dataset.clips is not None else _clipless_vision(
            dataset, example)  # [1, C, T, h, w]
        x0_a = dataset.actions[example]  # [chunk, width]
        if retimed[index]:
            x0_a = retime_chunk(x0_a, dataset.starts[example], float(speeds[index]))
        if drifts is not None:
            x0_a = drift_chunk(x0_a, drifts[index])
        if offset is not None:
            x0_a = offset_prefix(x0_a, clean, offset)
        eps_v = torch.randn(x0_v.shape, generator=generator)
        eps_a = torch.randn(x0_a.shape, generator=generator)
        vision = x0_v.clone()
        vision[:, :, first:] = (1 - sigma) * x0_v[:, :, first:] + sigma * eps_v[:, :, first:]
        action = torch.zeros(1, x0_a.shape[0], action_dim)
        action[0, :, :raw] = (1 - sigma) * x0_a + sigma * eps_a
        if clean:
            action[0, :clean, :raw] = x0_a[:clean]
        visions.append(vision)
        actions.append(action)
        timesteps.append(sigma * 1000.0)
        targets_v.append((eps_v - x0_v)[:, :, first:])
        targets_a.append(eps_a - x0_a)
        loss_mask.append((torch.arange(horizon) >= clean).float()[:, None].expand(horizon, raw))
    items = []
    runs = _runs(prefixes) if one_run else [(clean, i, i + 1) for i, clean in enumerate(prefixes)]
    for clean, start, stop in runs:
        # Consecutive examples with the same clean prefix share one branch: ONE item, so the fan-out attention
        # runs them as one batched call (one block each, its own timestep) instead of one call per example.
        branch = dataset.branch
        if clean:
            noisy = branch.template.action_noisy_frame_indexes
            branch = dataclasses.replace(branch, template=dataclasses.replace(
                branch.template, action_noisy_frame_indexes=noisy[noisy >= clean]))
        items.append(PackItem(branch=branch, vision=torch.cat(visions[start:stop]),
                              action=torch.cat(actions[start:stop]), timestep=tuple(timesteps[start:stop])))
    preds_v, preds_a = forward_items(transformer, items, torch.device("cpu"), prefix_cache)
    pred_v = torch.cat([p[:, :, first:] for p in preds_v], dim=0)
    pred_a = torch.cat([p[:, :, :raw] for p in preds_a], dim=0)
    if any(prefixes):
        mask = torch.stack(loss_mask)
        loss_a = (mask * (pred_a - torch.stack(targets_a)) ** 2).sum() / mask.sum()
    else:
        loss_a = torch.nn.functional.mse_loss(pred_a, torch.stack(targets_a))
    # A moved or retimed example's clip shows the demonstration it was made from, not the chunk it trains.
    keep = [i for i, o in enumerate(offsets) if o is None and not retimed[i]]
    if len(keep) < len(examples):
        loss_v = (torch.nn.functional.mse_loss(pred_v[keep], torch.cat(targets_v)[keep]) if keep
                  else pred_v.sum() * 0.0)
    else:
        loss_v = torch.nn.functional.mse_loss(pred_v, torch.cat(targets_v))
    return loss_a + vision_weight * loss_v, loss_a.item(), loss_v.item()


def apply_update(loss: torch.Tensor, params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                 schedule: torch.optim.lr_scheduler.LRScheduler, ema: list[torch.Tensor] | None,
                 decay: float) -> None:
    """One update from ``loss``: backward, gradient norm clipped to 1, the optimizer and schedule steps, the EMA.

    Args:
        loss (`torch.Tensor`): Scalar loss of the step (:func:`training_loss`).
        params (`list[torch.nn.Parameter]`): The trained parameters.
        optimizer (`torch.optim.Optimizer`), schedule (`LRScheduler`): Stepped once.
        ema (`list[torch.Tensor]`, *optional*): EMA of ``params``, moved toward them by ``1 - decay``.
        decay (`float`): EMA decay of this step.
    """
    # The named ranges cost nothing unless a profiler listens (step_profile.py reads them).
    optimizer.zero_grad(set_to_none=True)
    with torch.profiler.record_function("backward"):
        loss.backward()
    with torch.profiler.record_function("optimizer"):
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
    if ema is not None:
        with torch.no_grad(), torch.profiler.record_function("ema"):
            torch._foreach_lerp_(ema, [p.detach() for p in params], 1 - decay)


def fit(pipe: Cosmos3OmniPipeline, dataset: EncodedDataset, args: argparse.Namespace, out: Path,
        work_dir: Path) -> dict[str, object]:
    """Train ``pipe`` on ``dataset`` with ``args``'s objective and schedule; save the EMA pipeline to ``out``.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline to train (its transformer is trained in place).
        dataset (`EncodedDataset`): Encoded examples.
        args (`argparse.Namespace`): The run's options (steps, lr, batch, seed, ...; an augmentation option it does
            not define takes its value in :data:`AUGMENTATION_DEFAULTS`).
        out (`Path`): Where the trained pipeline is saved (``save_pretrained``).
        work_dir (`Path`): Where checkpoints go.

    Returns:
        `dict`: the run's ``states``, ``examples``, ``train_seconds``, ``final_loss``, ``loss_history``,
        ``saved_bytes``, ``transformer_parameters`` (all of them) and ``trained_parameters`` (without the text
        pathway under ``--freeze-text``).
    """
    args = argparse.Namespace(**{**AUGMENTATION_DEFAULTS, **vars(args)})
    torch.set_num_threads(args.threads)
    transformer = pipe.transformer
    transformer.train()
    install_fanout(transformer)
    # The instruction is the same in every example, so with the text pathway frozen its keys/values are constants
    # of the run: computed once, and every step packs the generation tokens alone (text_prefix.py).
    frozen = freeze_text_pathway(transformer) if args.freeze_text else []
    prefix_cache = instruction_cache(transformer, dataset.branch) if frozen else None
    params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay)
    # OneCycleLR divides by its warm-up's last step, pct_start * steps - 1: zero at exactly 20 steps, which raised
    # ZeroDivisionError. Every other run keeps 0.05, so its schedule (and result) is unchanged.
    pct_start = 0.05 if args.steps != 20 else 0.1
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps,
                                                   pct_start=pct_start)
    ema = [p.detach().clone() for p in params] if args.ema > 0 else None
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    shift = float(args.sigma_shift)
    print(f"transformer parameters: {sum(p.numel() for p in params)} trained"
          + (f" ({len(frozen)} text-pathway tensors frozen)" if frozen else "")
          + f"; states {dataset.num_states}, examples {len(dataset.actions)}", flush=True)
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
    first = 1
    resume_path = work_dir / RESUME_FILE
    if args.resume and resume_path.is_file():
        first = load_resume(resume_path, transformer, ema, optimizer, schedule, generator, rng, args.steps,
                            history) + 1
        print(f"resumed from {resume_path} at step {first - 1}", flush=True)
        if frozen:  # the text pathway's weights came with the checkpoint: its keys/values are computed again
            prefix_cache = instruction_cache(transformer, dataset.branch)
    for step in range(first, args.steps + 1):
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
                                             prefixes, offsets, drifts, speeds, prefix_cache)
        apply_update(loss, params, optimizer, schedule, ema, min(args.ema, (1 + step) / (10 + step)))
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
            save_resume(resume_path, step, args.steps, transformer, ema, optimizer, schedule, generator, rng, history)
    transformer.eval()
    size = save_pipeline(pipe, out, getattr(torch, args.save_dtype), ema)
    for name, param in transformer.named_parameters():
        if name in frozen:
            param.requires_grad_(True)
    return {
        "states": dataset.num_states,
        "examples": len(dataset.actions),
        "transformer_parameters": sum(p.numel() for p in transformer.parameters()),
        "trained_parameters": sum(p.numel() for p in params),
        "train_seconds": round(time.perf_counter() - train_started, 1),
        "final_loss": history[-1] if history else None,
        "loss_history": history,
        "saved_bytes": size,
    }


RESUME_FILE = "resume.pt"
"""The resumable checkpoint in a run's work dir: fp32 weights, EMA, optimizer, schedule, generators, step."""


def write_summary(work_dir: Path, out: Path, config: object, args: argparse.Namespace, result: dict,
                  encode_seconds: float, wall_seconds: float, **fields: object) -> int:
    """Write a run's ``work_dir/summary.json`` and print where its pipeline went; return the command's exit code.

    Args:
        work_dir (`Path`): The run's work dir.
        out (`Path`): Where the pipeline was saved.
        config (`object`): The model's shape (a dataclass; its ``extra`` is left out).
        args (`argparse.Namespace`): The command's arguments, written as strings.
        result (`dict`): :func:`fit`'s result (``loss_history``, ``saved_bytes``, ``train_seconds``, ...).
        encode_seconds (`float`), wall_seconds (`float`): Time spent encoding data, and in all.
        **fields: What else the command records (data, formats, statistics).

    Returns:
        `int`: 0, or 1 when the final loss is not finite.
    """
    history = result["loss_history"]
    summary = {
        "config": {k: v for k, v in vars(config).items() if k != "extra"},
        **fields,
        "args": {k: str(v) for k, v in vars(args).items() if not k.startswith("_")},
        **result,
        "encode_seconds": round(encode_seconds, 1),
        "wall_seconds": round(wall_seconds, 1),
        "torch": torch.__version__,
    }
    write_json(work_dir / "summary.json", summary)
    print(f"saved {out} ({result['saved_bytes'] / 1e6:.2f} MB) after {wall_seconds / 60:.1f} min; final loss "
          f"{history[-1]['loss']:.4f}", flush=True)
    return 0 if history and math.isfinite(history[-1]["loss"]) else 1


def save_resume(path: Path, step: int, steps: int, transformer: torch.nn.Module, ema: list[torch.Tensor] | None,
                optimizer: torch.optim.Optimizer, schedule, generator: torch.Generator, rng: np.random.Generator,
                history: list[dict[str, float]]) -> None:
    """Write what :func:`fit` needs to continue after ``step`` exactly as an unstopped run would (atomically)."""
    state = {"step": step, "steps": steps, "transformer": transformer.state_dict(), "ema": ema,
             "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
             "generator": generator.get_state(), "rng": rng.bit_generator.state, "history": history}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def load_resume(path: Path, transformer: torch.nn.Module, ema: list[torch.Tensor] | None,
                optimizer: torch.optim.Optimizer, schedule, generator: torch.Generator, rng: np.random.Generator,
                steps: int, history: list[dict[str, float]]) -> int:
    """Restore :func:`save_resume`'s state in place; return the step it was written after.

    Raises:
        TrainingError: the checkpoint was written by a run of another length (the one-cycle schedule is fixed by
            it), or with EMA where this run has none (or the reverse).
    """
    state = torch.load(path, weights_only=False)
    if state["steps"] != steps:
        raise TrainingError(f"{str(path)!r} continues a run of --steps {state['steps']}, this run asks for "
                            f"--steps {steps}")
    if (state["ema"] is None) != (ema is None):
        raise TrainingError(f"{str(path)!r} was written {'without' if state['ema'] is None else 'with'} EMA, "
                            "unlike this run")
    transformer.load_state_dict(state["transformer"])
    if ema is not None:
        for kept, saved in zip(ema, state["ema"]):
            kept.copy_(saved)
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    generator.set_state(state["generator"])
    rng.bit_generator.state = state["rng"]
    history.extend(state["history"])
    return int(state["step"])


def _runs(values: list[int]) -> list[tuple[int, int, int]]:
    """``(value, start, stop)`` of each run of equal consecutive ``values``."""
    runs: list[tuple[int, int, int]] = []
    for index, value in enumerate(values):
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1], index + 1)
        else:
            runs.append((value, index, index + 1))
    return runs


def _clipless_vision(dataset: EncodedDataset, example: int) -> torch.Tensor:
    # The conditioning latents as the leading frames, the normalized latents' mean (zero) as the noisy frames' target.
    condition = dataset.condition[int(dataset.state_of[example]) : int(dataset.state_of[example]) + 1]
    frames = dataset.branch.template.vision_token_shape[0]
    vision = torch.zeros(1, condition.shape[1], frames, *condition.shape[3:])
    vision[:, :, : condition.shape[2]] = condition
    return vision
