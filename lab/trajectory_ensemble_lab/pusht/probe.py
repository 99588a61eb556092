"""Does the frame's conditioning latent hold the expert's next actions? A regression probe beside the policy.

    python -m trajectory_ensemble_lab.pusht.probe --policy DIR --bags out/pusht/demos/bags --work-dir W \\
        --stride 2 --json bench/results/pusht_probe.json

The served transformer sees the frame only as its VAE latent (``[16, 1, 6, 6]`` for a 96×96 frame at tier 256). This
probe fits a small MLP from that latent, exactly as ``train-pusht`` encodes it (the same cache), to the expert's
16-row chunk, on the demonstrations of four starts in five (both expert seeds of each), and measures it on the
fifth (starts it never saw). A second probe also reads the agent's position, the state input Diffusion Policy gives
its policy beside the image. A third reads the frame itself (resized to 48×48) through a small CNN trained with it,
as Diffusion Policy trains its image encoder: what an encoder fitted to this data, not a frozen VAE, can read from
the same frames. Errors are in the units of :mod:`.openloop` (mean distance in env pixels over the 8
executed rows), beside holding the agent still and the constant chunk (the training mean), so they read side by side
with the policy's:

- a probe far better than the policy says the latent holds what the policy has not learned to read (the
  transformer underfits);
- a probe no better than holding still on unseen starts says the frame encoding, at this much data, is the limit;
- the agent probe's gain over the latent one is what a state input would be worth;
- the CNN probe's gain over the latent one is what a trained frame encoding would be worth.

A probe regresses the conditional mean, which a multimodal expert's sample is farther from than a mean is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.provenance import git_commit, utc_now

from ..training import TrainingError
from ..training.dataset import EncodedDataset
from .evaluate import EXECUTE

PIXELS_PER_UNIT = 256.0
"""Env pixels per normalized unit: ``minmax`` over ``[0, 512]`` maps to ``[-1, 1]``."""


def probe_inputs(parts: Sequence[EncodedDataset],
                 starts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each example's flattened conditioning latent, its chunk and its start.

    Args:
        parts (`Sequence[EncodedDataset]`): One encoded data set per bag.
        starts (`Sequence[int]`): The env reset seed of each bag's demonstration: the split is by start, so a
            held-out start is not seen through its other expert seed either.

    Returns:
        `tuple`: latents `[E, C*h*w]`, chunks `[E, chunk * width]` (normalized units), start `[E]` (long).
    """
    if not parts or len(parts) != len(starts):
        raise TrainingError(f"the probe needs one start per encoded bag, got {len(parts)} bags and "
                            f"{len(starts)} starts")
    latents, chunks, groups = [], [], []
    for start, part in zip(starts, parts):
        latents.append(part.condition.float()[part.state_of].flatten(1))
        chunks.append(part.actions.float().flatten(1))
        groups.append(torch.full((len(part.state_of),), int(start), dtype=torch.long))
    return torch.cat(latents), torch.cat(chunks), torch.cat(groups)


def bag_start(episodes: Sequence[dict[str, Any]], bag: Path) -> int:
    """The one start (env reset seed) of a demonstration bag's episodes.

    Raises:
        TrainingError: the bag lists no episode, or episodes of several starts.
    """
    starts = {int(entry["env_seed"]) for entry in episodes}
    if len(starts) != 1:
        raise TrainingError(f"the probe splits by start, so each bag must hold one start; {str(bag)!r} holds "
                            f"{sorted(starts)!r}")
    return starts.pop()


def chunk_error_px(predicted: torch.Tensor, expert: torch.Tensor, width: int = 2, rows: int = EXECUTE) -> torch.Tensor:
    """Per example, the mean distance in env pixels between the first ``rows`` rows of two flattened chunks."""
    diff = (predicted - expert).reshape(len(expert), -1, width)[:, :rows] * PIXELS_PER_UNIT
    return diff.norm(dim=-1).mean(dim=1)


def fit_probe(latents: torch.Tensor, chunks: torch.Tensor, groups: torch.Tensor, *, held_out_every: int = 5,
              epochs: int = 15, hidden: int = 512, seed: int = 0,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """Fit the MLP probe on the starts that are not a multiple of ``held_out_every``; measure it on the rest.

    Args:
        latents (`torch.Tensor` of shape `[E, D]` or `[E, 3, s, s]`), chunks (`torch.Tensor` of shape `[E, K]`),
            groups (`torch.LongTensor` of shape `[E]`): :func:`probe_inputs`; frames (:func:`bag_inputs`) instead of
            features are read by a small CNN trained with the probe.
        held_out_every (`int`): Every ``held_out_every``-th start is held out.
        epochs (`int`), hidden (`int`), seed (`int`): The MLP's passes, width and initialization seed.

    Returns:
        `dict`: example and start counts, and the median / mean error (px) of the constant chunk and of the probe
        on the training starts and on the held-out ones.

    Raises:
        TrainingError: no start on one side of the split.
    """
    held = groups % held_out_every == 0
    if bool(held.all()) or not bool(held.any()):
        raise TrainingError(f"held_out_every={held_out_every!r} leaves no start on one side of the split of "
                            f"{int(groups.unique().numel())} starts")
    generator = torch.Generator().manual_seed(seed)
    if latents.dim() == 2:  # features: standardized per dimension on the training starts
        mean, std = latents[~held].mean(0), latents[~held].std(0) + 1e-6
        x = (latents - mean) / std
    else:  # frames in [0, 1]: centred, read by a small CNN trained with the probe
        x = latents
    train = torch.nonzero(~held).squeeze(1)
    torch.manual_seed(seed)  # nn.Linear and nn.Conv2d draw their initial weights from the global generator
    net = _network(x.shape[1:], hidden, chunks.shape[1])
    # A CNN trained from scratch diverged from its best at the MLP's rate and batch; it settles at 3e-4 and 128.
    lr, size = (1e-3, 256) if x.dim() == 2 else (3e-4, 128)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    started = time.perf_counter()
    for epoch in range(epochs):
        order = train[torch.randperm(len(train), generator=generator)]
        for begin in range(0, len(order), size):
            batch = order[begin:begin + size]
            loss = torch.nn.functional.mse_loss(net(x[batch].float()), chunks[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        log(f"probe epoch {epoch + 1}/{epochs}: loss {loss.item():.4f} ({time.perf_counter() - started:.0f} s)")
    with torch.no_grad():
        constant = chunks[~held].mean(0, keepdim=True)
        result: dict[str, Any] = {"examples_train": int((~held).sum()), "examples_held_out": int(held.sum()),
                                  "starts_train": int(groups[~held].unique().numel()),
                                  "starts_held_out": int(groups[held].unique().numel())}
        for name, errors in (("constant_held_out", chunk_error_px(constant.expand(int(held.sum()), -1), chunks[held])),
                             ("probe_train", chunk_error_px(_predict(net, x[~held]), chunks[~held])),
                             ("probe_held_out", chunk_error_px(_predict(net, x[held]), chunks[held]))):
            result[f"{name}_px_median"] = float(errors.median())
            result[f"{name}_px_mean"] = float(errors.mean())
    return result


def _network(shape: torch.Size, hidden: int, outputs: int) -> torch.nn.Module:
    """Two hidden layers over features ``[D]``; over frames ``[3, s, s]`` four convolutions first (three of stride 2)."""
    if len(shape) == 1:
        return torch.nn.Sequential(torch.nn.Linear(shape[0], hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden),
                                   torch.nn.GELU(), torch.nn.Linear(hidden, outputs))
    side = shape[-1]
    for _ in range(3):
        side = (side + 1) // 2
    layers: list[torch.nn.Module] = []
    for inputs, width, stride in ((shape[0], 32, 1), (32, 64, 2), (64, 64, 2), (64, 64, 2)):
        # GroupNorm, as Diffusion Policy's ResNet uses: without it the CNN sat at holding still's error.
        layers += [torch.nn.Conv2d(inputs, width, 3, stride=stride, padding=1), torch.nn.GroupNorm(8, width),
                   torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Flatten(), torch.nn.Linear(64 * side * side, hidden),
                               torch.nn.GELU(), torch.nn.Linear(hidden, outputs))


def _predict(net: torch.nn.Module, x: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    return torch.cat([net(x[i:i + batch].float()) for i in range(0, len(x), batch)])


def bag_inputs(bag_paths: Sequence[Path], stride: int, frame_size: int = 48) -> tuple[torch.Tensor, torch.Tensor]:
    """The agent's position and the frame at every example of ``bag_paths`` (the order :func:`probe_inputs` reads
    them).

    Returns:
        `tuple`: positions `[E, 2]` in the model's normalized units, and frames `[E, 3, frame_size, frame_size]`
        (area-resized, centred on 0, float16 to keep a full set in memory).
    """
    from .recording import read_demo_bag

    positions, frames = [], []
    for bag in bag_paths:
        for episode in read_demo_bag(bag):
            steps = list(range(0, len(episode.actions), stride))
            positions.extend(episode.agent[t] for t in steps)
            pixels = torch.as_tensor(np.asarray([episode.frames[t] for t in steps]), dtype=torch.float32)
            pixels = pixels.permute(0, 3, 1, 2) / 255.0 - 0.5
            frames.append(torch.nn.functional.interpolate(pixels, size=(frame_size, frame_size),
                                                          mode="area").to(torch.float16))
    agents = torch.as_tensor(np.asarray(positions), dtype=torch.float32) / PIXELS_PER_UNIT - 1.0
    return agents, torch.cat(frames)


def hold_still_px(agents: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
    """Per example, the error of holding the agent where it is (its position as every row)."""
    return chunk_error_px(agents.repeat(1, chunks.shape[1] // agents.shape[1]), chunks)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.pusht.probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", type=Path, required=True, help="a train-pusht checkpoint (its VAE encodes)")
    parser.add_argument("--bags", type=Path, required=True, help="demonstration bags (train-pusht's --bags)")
    parser.add_argument("--work-dir", type=Path, required=True, help="train-pusht's --work-dir (the encoding cache)")
    parser.add_argument("--stride", type=int, default=2, help="control steps between examples (2)")
    parser.add_argument("--epochs", type=int, default=15, help="probe passes over its training starts (15)")
    parser.add_argument("--held-out-every", type=int, default=5, help="every k-th start is held out (5)")
    parser.add_argument("--frame-size", type=int, default=48,
                        help="side the frames are resized to for the CNN probe (48; the env renders 96)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)
    from .train import build_pusht_dataset, demo_bags, listed_episodes, load_for_training, normalization_images

    torch.set_num_threads(args.threads)
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    try:
        bag_paths = demo_bags(args.bags)
        pipe = load_for_training(args.policy, 0, normalization_images(bag_paths))
        parts = [build_pusht_dataset(pipe, [bag], stride=args.stride, cache_dir=args.work_dir, log=lambda _: None)
                 for bag in bag_paths]
        starts = [bag_start(listed_episodes([bag]), bag) for bag in bag_paths]
        latents, chunks, groups = probe_inputs(parts, starts)
        agents, frames = bag_inputs(bag_paths, args.stride, args.frame_size)
        if len(agents) != len(latents):
            raise TrainingError(f"the bags give {len(agents)} agent positions for {len(latents)} encoded examples: "
                                f"is {str(args.work_dir)!r} the cache of these bags at stride {args.stride}?")
        result = {"latent": fit_probe(latents, chunks, groups, held_out_every=args.held_out_every,
                                      epochs=args.epochs, log=log),
                  "latent_and_agent": fit_probe(torch.cat([latents, agents], dim=1), chunks, groups,
                                                held_out_every=args.held_out_every, epochs=args.epochs, log=log),
                  "frame_cnn": fit_probe(frames, chunks, groups, held_out_every=args.held_out_every,
                                         epochs=args.epochs, log=log)}
    except TrainingError as exc:
        print(f"probe: {exc}", file=sys.stderr)
        return 2
    held = groups % args.held_out_every == 0
    still = hold_still_px(agents[held], chunks[held])
    result["hold_still_held_out_px_median"] = float(still.median())
    result["hold_still_held_out_px_mean"] = float(still.mean())
    document = {"date": utc_now(), "commit": git_commit(), "policy": str(args.policy),
                "settings": {"stride": args.stride, "epochs": args.epochs, "held_out_every": args.held_out_every,
                             "rows": EXECUTE, "hidden": 512, "seed": 0, "frame_size": args.frame_size},
                "probe": result}
    text = json.dumps(document, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
