"""How the trainer varies a demonstration before it trains on it (each off by default; ``train-toy``'s options).

- clean prefixes (:func:`sample_prefixes`) and prefixes moved off the demonstration (:func:`offset_prefix`), for
  training-time action conditioning (``--prefix-conditioning``, ``--prefix-offset``);
- demonstrations drifting off their path (:func:`drift_chunk`, ``--demo-drift``);
- demonstrations walked at another speed along their path (:func:`retime_chunk`, :func:`sample_speeds`,
  ``--demo-speed``).

Why: a toy demonstration is a deterministic function of the image (per side of the obstacle), so a policy trained
on the expert alone can ignore its action latent; see ``docs/closed-loop.md``.
"""

from __future__ import annotations

import argparse
import math

import torch


def share(text: str) -> float:
    """An argparse type: a share in ``[0, 1]``."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a share in [0, 1], got {text!r}")
    return value


def nonnegative(text: str) -> float:
    """An argparse type: a finite number ``>= 0``."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0.0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def add_prefix_arguments(parser: argparse.ArgumentParser, horizon: int) -> None:
    """Register the clean-prefix options (``--prefix-conditioning``, ``--prefix-max``, ``--prefix-offset``) of a
    trainer whose chunks have ``horizon`` rows; ``--prefix-max`` defaults to half of them.

    Args:
        parser (`argparse.ArgumentParser`): The trainer's parser.
        horizon (`int`): Rows per chunk: a prefix leaves at least one of them to denoise.
    """

    def prefix_length(text: str) -> int:
        value = int(text)
        if not 1 <= value < horizon:
            raise argparse.ArgumentTypeError(f"must be in [1, {horizon}), got {text!r}")
        return value

    parser.add_argument("--prefix-conditioning", type=share, default=0.0,
                        help="share of examples whose first d actions are given clean through the action mask "
                             "(how 'mask' context guidance serves a frozen prefix); 0 = none")
    parser.add_argument("--prefix-max", type=prefix_length, default=horizon // 2,
                        help="largest clean prefix d of a --prefix-conditioning example (d is uniform in 1..this)")
    parser.add_argument("--prefix-offset", type=nonnegative, default=0.0,
                        help="std (normalized units) of the offset a --prefix-conditioning example's clean prefix is "
                             "moved by, the rest of its chunk joining the prefix and returning to the demonstration "
                             "(offset_prefix); 0 = prefixes are the demonstration's own")


def sample_prefixes(count: int, generator: torch.Generator, share: float, largest: int) -> list[int]:
    """Clean-prefix lengths per example: ``d`` uniform in ``1..largest`` for a share ``share`` of them, else 0."""
    if share <= 0.0 or largest < 1:
        return [0] * count
    use = torch.rand(count, generator=generator) < share
    lengths = torch.randint(1, largest + 1, (count,), generator=generator)
    return torch.where(use, lengths, torch.zeros_like(lengths)).tolist()


def offset_prefix(chunk: torch.Tensor, clean: int, offset: torch.Tensor) -> torch.Tensor:
    """A demonstration whose first ``clean`` actions are moved by up to ``offset``, the rest joining them.

    The prefix drifts linearly from the robot (action ``k`` moves by ``(k + 1) / clean * offset``), as a previous
    chunk planned from elsewhere does; the actions after it start where the prefix ends and return to the
    demonstration linearly by the chunk's end. A policy trained on these continues a given prefix without a jump at
    its end, which is what a frozen prefix served through the action mask needs at a chunk switch.

    Args:
        chunk (`torch.Tensor` of shape `[H, 2]`): The demonstration.
        clean (`int`): Prefix length, ``1 <= clean < H``.
        offset (`torch.Tensor` of shape `[2]`): Offset of the prefix's last action.

    Returns:
        `torch.Tensor` of shape `[H, 2]`.
    """
    horizon = chunk.shape[0]
    if not 1 <= clean < horizon:
        raise ValueError(f"clean must be in [1, {horizon}), got {clean!r}")
    k = torch.arange(horizon, dtype=chunk.dtype)
    ramp = torch.where(k < clean, (k + 1) / clean, 1.0 - (k - clean + 1) / (horizon - clean))
    return chunk + ramp[:, None] * offset.to(chunk.dtype)


def drift_chunk(chunk: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """A demonstration drifting linearly off its path, action ``k`` moved by ``(k + 1) / H * offset``.

    Args:
        chunk (`torch.Tensor` of shape `[H, 2]`): The demonstration.
        offset (`torch.Tensor` of shape `[2]`): Offset of its last action.

    Returns:
        `torch.Tensor` of shape `[H, 2]`.
    """
    horizon = chunk.shape[0]
    ramp = torch.arange(1, horizon + 1, dtype=chunk.dtype) / horizon
    return chunk + ramp[:, None] * offset.to(chunk.dtype)


def retime_chunk(chunk: torch.Tensor, start: torch.Tensor, factor: float) -> torch.Tensor:
    """A demonstration walked at ``factor`` times its speed along the same path.

    The path is the polyline from ``start`` through the waypoints; waypoint ``k`` (the position after step ``k + 1``)
    moves to the path point ``factor * (k + 1)`` steps in, linearly interpolated between waypoints. Past the last
    waypoint the chunk stays there: every toy label ends at the target
    (``trajectory_ensemble_lab.toy.examples.training_examples``).

    Args:
        chunk (`torch.Tensor` of shape `[H, 2]`): The demonstration.
        start (`torch.Tensor` of shape `[2]`): The robot position it starts from.
        factor (`float`): Speed factor, ``> 0`` (1 returns the chunk unchanged).

    Returns:
        `torch.Tensor` of shape `[H, 2]`.
    """
    if not (math.isfinite(factor) and factor > 0.0):
        raise ValueError(f"factor must be a finite number > 0, got {factor!r}")
    horizon = chunk.shape[0]
    path = torch.cat([start.to(chunk.dtype)[None], chunk], dim=0)  # [H + 1, 2], index = steps in
    steps = (torch.arange(1, horizon + 1, dtype=torch.float64) * factor).clamp(max=horizon)
    low = steps.floor().long().clamp(max=horizon - 1)
    frac = (steps - low).to(chunk.dtype)[:, None]
    return path[low] + frac * (path[low + 1] - path[low])


def sample_speeds(count: int, generator: torch.Generator, share: float, spread: float,
                  eligible: list[bool] | None = None) -> torch.Tensor:
    """Speed factors ``[count]``: uniform in ``[1 - spread, 1 + spread]`` for a share ``share``, else exactly 1.

    Args:
        eligible (`list[bool]`, *optional*): Per example, whether it may be retimed at all (e.g. only the examples
            with a clean prefix); the draw is the same either way, so this only sets the others to 1.
    """
    if share <= 0.0 or spread <= 0.0:
        return torch.ones(count)
    use = torch.rand(count, generator=generator) < share
    if eligible is not None:
        if len(eligible) != count:
            raise ValueError(f"eligible must have {count} entries, got {len(eligible)}")
        use &= torch.tensor(eligible, dtype=torch.bool)
    factors = 1.0 + spread * (2.0 * torch.rand(count, generator=generator) - 1.0)
    return torch.where(use, factors, torch.ones_like(factors))
