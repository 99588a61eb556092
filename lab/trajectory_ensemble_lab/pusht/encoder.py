"""``trajectory-ensemble pusht-encoder``: the served pipeline's own VAE encoder, trained to read the PushT scene.

The shipped PushT policy conditions on the latent of a random, frozen Wan VAE (seed 0), which reads the agent and
the T worse than a small CNN fitted to the frames (``docs/pusht.md``, *What the frame's latent holds*). This module
trains that same VAE's encoder (same class and config, so the saved bundle loads through
``catalog.load_pipeline`` and serves unchanged) with an auxiliary readout, lab only and never shipped: a small MLP
from the conditioning latent (exactly the one ``encode_conditioning`` gives the transformer: the frame padded to the
tier-256 canvas, the VAE's posterior mean, the padding's latent rows cut off) to the agent's position, the T's
position and the T's 8 vertices (:data:`TARGETS`, env pixels).

Data (``frames``): frames rendered by the env's own drawing code from the states of expert episodes
(``pusht-demos --states-only`` writes them, :mod:`.state_demos`), every ``--stride``-th state, with the state as
label. Rendering a state costs about 5 ms, against about 4 s to play an episode with frames.

``train`` keeps a resumable checkpoint (encoder, readout, optimizer, step) and writes the bundle: the initial
pipeline with the trained VAE, its per-channel latent normalization recomputed on training frames
(:func:`~trajectory_ensemble_lab.training.pipeline.normalize_latents`, as a fresh pipeline's is), fp16 safetensors.
``gate`` loads that bundle through ``catalog.load_pipeline`` and reports, on validation starts only, how many env
pixels the readout's agent and T positions are off. ``train-pusht --encoder BUNDLE`` then trains a policy on it; its
latent cache is keyed by the VAE's weights, so latents of another encoder are never reused.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.errors import TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.provenance import git_commit, utc_now
from .sim import KEYPOINTS, PushTError, make_env, render_states, to_world
from ..commands import run_command
from ..records import write_json

TARGETS = 20
"""Readout outputs: agent ``(x, y)``, T position ``(x, y)`` (its body origin), the T's 8 vertices ``(x, y)``."""
CENTER, SCALE = 256.0, 128.0
"""Targets are read in ``(px - CENTER) / SCALE`` units."""
DEFAULT_DIR = Path("out/pusht/encoder")
GATE_PX = 5.0
"""The gate: mean error of the agent's and of the T's position on validation frames, env pixels ("a few")."""
VALIDATION_SEEDS = (100_000, 200_000)
"""Gate frames come from validation starts only; held-out starts (200 000 and up) are refused."""


def state_targets(states: np.ndarray) -> np.ndarray:
    """The readout's targets of each state ``[N, 5]``, env pixels: ``[N, TARGETS]`` (:data:`TARGETS`)."""
    states = np.asarray(states, dtype=np.float64)
    vertices = np.stack([to_world(s[2:5], KEYPOINTS).reshape(-1) for s in states])
    return np.concatenate([states[:, :2], states[:, 2:4], vertices], axis=1).astype(np.float32)


def build_frames(states_dir: Path, out: Path, stride: int, seeds: tuple[int, int]) -> dict[str, int]:
    """Render every ``stride``-th state of the episodes under ``states_dir`` whose start lies in ``seeds``.

    Writes ``out`` (npz: ``frames`` uint8 ``[N, 96, 96, 3]``, ``targets`` float32 ``[N, TARGETS]``, ``starts`` int
    ``[N]``) and returns counts.

    Raises:
        PushTError: ``stride`` below 1, or no episode in the range.
    """
    from .state_demos import read_episodes

    if stride < 1:
        raise PushTError(f"stride must be an integer >= 1, got {stride!r}")
    episodes = [e for e in read_episodes(states_dir) if seeds[0] <= e.env_seed < seeds[1]]
    if not episodes:
        raise PushTError(f"no episode with a start in {list(seeds)} under {str(states_dir)!r}")
    env = make_env(pixels=True)
    frames, targets, starts = [], [], []
    for ep in episodes:
        states = ep.states[::stride]
        frames.append(render_states(states, env))
        targets.append(state_targets(states))
        starts.append(np.full(len(states), ep.env_seed))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, frames=np.concatenate(frames), targets=np.concatenate(targets), starts=np.concatenate(starts))
    return {"episodes": len(episodes), "frames": int(sum(len(f) for f in frames))}


def load_frames(path: Path) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """``build_frames``' file: frames uint8 ``[N, 96, 96, 3]``, targets ``[N, TARGETS]`` px, starts ``[N]``."""
    with np.load(path) as data:
        return torch.from_numpy(data["frames"]), torch.from_numpy(data["targets"]), data["starts"]


def raw_latents(pipe: Cosmos3OmniPipeline, frames: torch.Tensor) -> torch.Tensor:
    """The VAE posterior mean of each frame as the serving path encodes it, before the latent normalization.

    The frame goes through the pipeline's own ``_prepare_action_video_conditioning`` (tier 256: padded, never
    scaled) and ``_remove_action_video_padding_from_latent``, so this is ``encode_conditioning``'s frame-0 latent
    up to the per-channel affine normalization. Differentiable in the VAE's weights.

    Args:
        pipe (`Cosmos3OmniPipeline`): Its VAE encodes.
        frames (`torch.Tensor` of shape `[B, H, W, 3]`, uint8): Frames.

    Returns:
        `torch.Tensor` of shape `[B, z_dim, h, w]`, float32.
    """
    from .train import RESOLUTION_TIER

    padded, size = [], None
    for frame in frames.numpy():
        x, size, _, _ = pipe._prepare_action_video_conditioning([frame], RESOLUTION_TIER, 1, device="cpu",
                                                               dtype=torch.float32)
        padded.append(x)
    mu = pipe.vae.encode(torch.cat(padded).to(pipe.vae.dtype)).latent_dist.mode()
    return pipe._remove_action_video_padding_from_latent(mu, size)[:, :, 0].float()


class Readout(torch.nn.Module):
    """Lab-only readout of :data:`TARGETS` from a raw latent ``[B, C, h, w]``: a batch normalization per latent
    element (no affine), then a two-layer MLP.

    Per element, not per channel: in the random VAE's latent, what differs from frame to frame is about 16 % of a
    channel's spread over its cells (measured on 256 training frames), so a per-channel scale hides the scene. And
    from batch statistics, not fixed ones: the encoder's first steps move the latent by more than that spread.

    Args:
        inputs (`int`): Latent elements ``C * h * w``.
        hidden (`int`): MLP width.
    """

    def __init__(self, inputs: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.BatchNorm1d(inputs, affine=False),
                                       torch.nn.Linear(inputs, hidden),
                                       torch.nn.GELU(), torch.nn.Linear(hidden, hidden), torch.nn.GELU(),
                                       torch.nn.Linear(hidden, TARGETS))

    def forward(self, latent: torch.Tensor) -> torch.Tensor:
        return self.net(latent) * SCALE + CENTER


def position_errors(predicted: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Mean and median distances (env px) of the agent, the T's position and the T's vertices, ``[N, TARGETS]``."""
    def dist(a: slice) -> torch.Tensor:
        diff = (predicted[:, a] - targets[:, a]).reshape(len(targets), -1, 2)
        return diff.norm(dim=-1).mean(dim=1)

    result = {}
    for name, part in (("agent", slice(0, 2)), ("t_position", slice(2, 4)), ("t_vertices", slice(4, TARGETS))):
        d = dist(part)
        result[f"{name}_mean_px"] = round(float(d.mean()), 2)
        result[f"{name}_median_px"] = round(float(d.median()), 2)
    return result


def encoder_parameters(pipe: Cosmos3OmniPipeline) -> list[torch.nn.Parameter]:
    """The parameters on the VAE's encode path (``encoder``, ``quant_conv``); the decoder is not trained."""
    return [*pipe.vae.encoder.parameters(), *pipe.vae.quant_conv.parameters()]


def _checkpoint_path(work_dir: Path) -> Path:
    return work_dir / "checkpoint.pt"


def train(pipe: Cosmos3OmniPipeline, frames: torch.Tensor, targets: torch.Tensor, *, steps: int, batch: int,
          lr: float, work_dir: Path, seed: int = 0, checkpoint_every: int = 100, frozen: bool = False,
          log=print) -> Readout:
    """Train the VAE's encoder and a :class:`Readout` on ``frames`` / ``targets`` for ``steps`` steps in all.

    Resumes from ``work_dir/checkpoint.pt`` when it exists (encoder, readout, optimizer, step), and writes it every
    ``checkpoint_every`` steps and at the end.

    Args:
        pipe (`Cosmos3OmniPipeline`): Pipeline whose VAE encoder trains (in place).
        frames (`torch.Tensor` of shape `[N, 96, 96, 3]`, uint8), targets (`[N, TARGETS]`, px): Training data.
        steps (`int`), batch (`int`), lr (`float`): Total steps, frames per step, AdamW's peak rate (cosine decay).
        work_dir (`Path`): Where the checkpoint lives.
        seed (`int`): Seed of the readout's init and the batch order.
        frozen (`bool`): Train the readout alone on the encoder as it is (the baseline the gate compares with).
    """
    if steps < 1 or batch < 1 or not lr > 0:
        raise PushTError(f"steps, batch and lr must be positive, got {steps!r}, {batch!r}, {lr!r}")
    torch.manual_seed(seed)
    work_dir.mkdir(parents=True, exist_ok=True)
    pipe.vae.requires_grad_(False)
    params = [] if frozen else encoder_parameters(pipe)
    for p in params:
        p.requires_grad_(True)
    with torch.no_grad():
        readout = Readout(raw_latents(pipe, frames[:1])[0].numel())
    groups = [{"params": params, "lr": lr}] if params else []
    optimizer = torch.optim.AdamW([*groups, {"params": readout.parameters(), "lr": 3 * lr}], weight_decay=1e-4)
    peaks = [group["lr"] for group in optimizer.param_groups]
    step = 0
    ckpt = _checkpoint_path(work_dir)
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        pipe.vae.encoder.load_state_dict(state["encoder"])
        pipe.vae.quant_conv.load_state_dict(state["quant_conv"])
        readout.load_state_dict(state["readout"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        log(f"resumed at step {step} from {ckpt}")
    generator = torch.Generator().manual_seed(seed + step)
    readout.train()
    started, losses = time.perf_counter(), []
    while step < steps:
        for group, peak in zip(optimizer.param_groups, peaks):
            warm = min(1.0, (step + 1) / max(1, min(50, steps // 10)))
            group["lr"] = peak * warm * 0.5 * (1 + math.cos(math.pi * step / steps))
        index = torch.randint(len(frames), (batch,), generator=generator)
        predicted = readout(raw_latents(pipe, frames[index]))
        loss = torch.nn.functional.mse_loss((predicted - CENTER) / SCALE, (targets[index] - CENTER) / SCALE)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*params, *readout.parameters()], 1.0)
        optimizer.step()
        step += 1
        losses.append(float(loss.detach()))
        if step % 10 == 0 or step == steps:
            errors = position_errors(predicted.detach(), targets[index])
            log(f"step {step}/{steps} loss {np.mean(losses[-20:]):.4f} batch agent {errors['agent_mean_px']} px, "
                f"T {errors['t_position_mean_px']} px ({time.perf_counter() - started:.0f} s)")
        if step % checkpoint_every == 0 or step == steps:
            save_checkpoint(pipe, readout, optimizer, step, ckpt)
    calibrate_readout(pipe, readout, frames)
    return readout


@torch.no_grad()
def calibrate_readout(pipe: Cosmos3OmniPipeline, readout: Readout, frames: torch.Tensor, count: int = 256,
                      batch: int = 64) -> None:
    """Set the readout's normalization statistics to those of ``pipe``'s latents of the first ``count`` frames.

    The running statistics lag the encoder while it trains and start far from a latent whose frame-to-frame spread
    is about 0.003; the readout is measured with statistics of the encoder as it is.
    """
    norm = readout.net[1]
    norm.reset_running_stats()
    momentum, norm.momentum = norm.momentum, None  # a cumulative average over the batches below
    readout.train()
    for i in range(0, min(count, len(frames)), batch):
        readout(raw_latents(pipe, frames[i:min(i + batch, count)]))
    norm.momentum = momentum
    readout.eval()


def save_checkpoint(pipe: Cosmos3OmniPipeline, readout: Readout, optimizer: torch.optim.Optimizer, step: int,
                    path: Path) -> None:
    """Write the resumable state (fp32) to ``path`` through a temporary file."""
    tmp = path.with_suffix(".tmp")
    torch.save({"encoder": pipe.vae.encoder.state_dict(), "quant_conv": pipe.vae.quant_conv.state_dict(),
                "readout": readout.state_dict(), "optimizer": optimizer.state_dict(), "step": step}, tmp)
    tmp.replace(path)


def save_bundle(pipe: Cosmos3OmniPipeline, readout: Readout, frames: torch.Tensor, out: Path,
                normalization_frames: int = 64) -> int:
    """Save ``pipe`` (fp16 safetensors, as ``train-pusht`` ships) with its latent normalization recomputed on the
    first ``normalization_frames`` of ``frames``, and the readout beside it (``readout.safetensors``, lab only).
    Returns the bundle's bytes."""
    from safetensors.torch import save_file

    from ..training.pipeline import normalize_latents, round_vae_to_half, save_pipeline
    from .train import PUSHT_FORMAT, write_stats

    round_vae_to_half(pipe)
    calibrate_readout(pipe, readout, frames)
    with torch.no_grad():
        normalize_latents(pipe, list(frames[:normalization_frames].numpy()), PUSHT_FORMAT)
    size = save_pipeline(pipe, out, torch.float16)
    write_stats(out)
    save_file({k: v.contiguous() for k, v in readout.state_dict().items()}, str(readout_path(out)))
    return size


def summary_path(bundle: Path) -> Path:
    """Where ``pusht-encoder train`` records how the bundle was trained (data, steps), beside it."""
    return bundle.parent / f"{bundle.name}.summary.json"


def readout_path(bundle: Path) -> Path:
    """Where :func:`save_bundle` keeps the lab-only readout: beside the bundle, never inside what ships."""
    return bundle.parent / f"{bundle.name}.readout.safetensors"


def load_readout(bundle: Path, pipe: Cosmos3OmniPipeline) -> Readout:
    """The readout saved beside ``bundle`` by :func:`save_bundle`, shaped for ``pipe``'s latent."""
    from safetensors.torch import load_file

    state = load_file(str(readout_path(bundle)))
    readout = Readout(state["net.2.weight"].shape[1], hidden=state["net.2.weight"].shape[0])
    readout.load_state_dict(state)
    return readout


@torch.no_grad()
def measure(pipe: Cosmos3OmniPipeline, readout: Readout, frames: torch.Tensor, targets: torch.Tensor,
            batch: int = 64) -> dict[str, float]:
    """:func:`position_errors` of ``readout`` (its running statistics) on ``frames`` encoded by ``pipe``'s VAE."""
    readout.eval()
    predicted = torch.cat([readout(raw_latents(pipe, frames[i:i + batch])) for i in range(0, len(frames), batch)])
    return position_errors(predicted, targets)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register ``pusht-encoder frames|train|gate``."""
    sub = parser.add_subparsers(dest="action", required=True)
    frames = sub.add_parser("frames", help="render labelled frames from state-only expert episodes")
    frames.add_argument("--states", type=Path, default=Path("out/pusht/oracle_demos/states"))
    frames.add_argument("--out", type=Path, default=DEFAULT_DIR / "train_frames.npz")
    frames.add_argument("--stride", type=int, default=5, help="control steps between rendered states")
    frames.add_argument("--starts", type=int, nargs=2, default=(0, 100_000), metavar=("FIRST", "END"),
                        help="episodes whose start lies in [FIRST, END)")
    tr = sub.add_parser("train", help="train the VAE encoder with the readout; resumable")
    tr.add_argument("--frames", type=Path, default=DEFAULT_DIR / "train_frames.npz")
    tr.add_argument("--init", default="pusht", help="pipeline whose VAE trains (catalog name or directory)")
    tr.add_argument("--work-dir", type=Path, default=DEFAULT_DIR / "run")
    tr.add_argument("--out", type=Path, default=DEFAULT_DIR / "bundle")
    tr.add_argument("--steps", type=int, default=1500)
    tr.add_argument("--batch", type=int, default=16)
    tr.add_argument("--lr", type=float, default=3e-4)
    tr.add_argument("--checkpoint-every", type=int, default=50)
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--frozen", action="store_true",
                    help="train the readout alone on the encoder as it is (the random VAE's baseline)")
    gate = sub.add_parser("gate", help="read agent and T positions on validation frames through the saved bundle")
    gate.add_argument("--bundle", type=Path, default=DEFAULT_DIR / "bundle")
    gate.add_argument("--frames", type=Path, default=DEFAULT_DIR / "val_frames.npz")
    gate.add_argument("--json", type=Path, default=None, help="write the results record here")
    gate.add_argument("--note", default="", help="a line recorded with the figures (data, steps, time)")


def run(args: argparse.Namespace) -> int:
    """Run one action; a refused setting prints ``NAME (code): message`` and returns 2."""
    torch.set_num_threads(1)
    try:
        return {"frames": _frames, "train": _train, "gate": _gate}[args.action](args)
    except TrajectoryEnsembleError as error:
        print(f"error: {describe_error(error)}", file=sys.stderr)
        return 2


def _frames(args: argparse.Namespace) -> int:
    counts = build_frames(args.states, args.out, args.stride, tuple(args.starts))
    print(f"wrote {args.out}: {counts}", flush=True)
    return 0


def _train(args: argparse.Namespace) -> int:
    from trajectory_ensemble_node.catalog import load_pipeline

    frames, targets, starts = load_frames(args.frames)
    if (starts >= VALIDATION_SEEDS[0]).any():
        raise PushTError(f"training frames include validation or held-out starts (max {int(starts.max())})")
    pipe, _ = load_pipeline(args.init, "cpu", "float32")
    pipe.vae.float()
    print(f"{len(frames)} frames from {len(set(starts.tolist()))} starts; init {args.init}", flush=True)
    readout = train(pipe, frames, targets, steps=args.steps, batch=args.batch, lr=args.lr, work_dir=args.work_dir,
                    seed=args.seed, checkpoint_every=args.checkpoint_every, frozen=args.frozen,
                    log=lambda message: print(message, flush=True))
    size = save_bundle(pipe, readout, frames, args.out)
    step = int(torch.load(_checkpoint_path(args.work_dir), weights_only=True)["step"])
    summary = {"init": args.init, "frames": len(frames), "starts": len(set(starts.tolist())),
               "first_start": int(starts.min()), "last_start": int(starts.max()), "steps": step,
               "batch": args.batch, "lr": args.lr, "frozen_encoder": args.frozen, "bundle_bytes": size}
    write_json(summary_path(args.out), summary)
    print(f"saved {args.out} ({size / 1e6:.2f} MB) after {step} steps", flush=True)
    return 0


def _gate(args: argparse.Namespace) -> int:
    from trajectory_ensemble_node.catalog import load_pipeline

    commit, date = git_commit(), utc_now()
    frames, targets, starts = load_frames(args.frames)
    if not ((starts >= VALIDATION_SEEDS[0]) & (starts < VALIDATION_SEEDS[1])).all():
        raise PushTError(f"gate frames must come from validation starts {list(VALIDATION_SEEDS)}, got "
                         f"{int(starts.min())}..{int(starts.max())}")
    pipe, _ = load_pipeline(str(args.bundle), "cpu", "float32")
    pipe.vae.float()
    errors = measure(pipe, load_readout(args.bundle, pipe), frames, targets)
    passed = errors["agent_mean_px"] <= GATE_PX and errors["t_position_mean_px"] <= GATE_PX
    record = {"date": date, "commit": commit, "bundle": str(args.bundle), "frames": len(frames),
              "validation_starts": sorted(set(starts.tolist())), "gate_px": GATE_PX, "passed": passed,
              **errors, "training": json.loads(summary_path(args.bundle).read_text())
              if summary_path(args.bundle).is_file() else None, "note": args.note}
    print(json.dumps({k: v for k, v in record.items() if k != "validation_starts"}), flush=True)
    if args.json is not None:
        write_json(args.json, record)
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m`` on this module, the same as ``trajectory-ensemble pusht-encoder ...``."""
    return run_command("pusht-encoder", argv)


if __name__ == "__main__":
    sys.exit(main())
