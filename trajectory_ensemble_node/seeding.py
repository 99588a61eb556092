"""Request-owned random streams: one seed, and one fresh generator, per candidate.

The seed rule (``seeds[0] = base_seed``, then SplitMix64 outputs skipping ``base_seed``, so a request's seeds are
pairwise distinct) is stated in full in docs/python-api.md, "The seed rule".
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

import torch

from .errors import CandidateCountError, InvalidSpecError

SEED_MODULUS = 1 << 64
"""Seeds are uint64: every seed is in ``[0, SEED_MODULUS)``."""

SEED_POLICIES = ("per_candidate", "shared")
"""Valid ``seed_policy`` values. ``"shared"`` is for debugging only (docs/python-api.md, "The seed rule")."""

_MASK = SEED_MODULUS - 1
_GOLDEN_GAMMA = 0x9E3779B97F4A7C15
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB


def check_seed(seed: object, name: str = "base_seed") -> int:
    """Return ``seed`` if it is a valid uint64 seed, else raise.

    Args:
        seed (`object`): The value to check. Must be an `int` (not a `bool`) in ``[0, 2**64)``.
        name (`str`, defaults to `"base_seed"`): How the value is named in the error message.

    Returns:
        `int`: The seed, unchanged.

    Raises:
        InvalidSpecError: If ``seed`` is not an int in ``[0, 2**64)``; the message quotes it.
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise InvalidSpecError(f"{name} must be an int in [0, 2**64), got {seed!r} of type {type(seed).__name__}")
    if not 0 <= seed < SEED_MODULUS:
        raise InvalidSpecError(f"{name} must be in [0, 2**64) (a uint64), got {seed!r}")
    return seed


def splitmix64(state: int) -> int:
    """The SplitMix64 output function ``mix(state + G)`` (constants in docs/python-api.md, "The seed rule").

    Args:
        state (`int`): The generator state *before* the increment, taken modulo ``2**64``.

    Returns:
        `int`: The 64-bit output in ``[0, 2**64)``.
    """
    z = (state + _GOLDEN_GAMMA) & _MASK
    z = ((z ^ (z >> 30)) * _MIX_1) & _MASK
    z = ((z ^ (z >> 27)) * _MIX_2) & _MASK
    return z ^ (z >> 31)


def candidate_seeds(base_seed: int, count: int, policy: str = "per_candidate") -> tuple[int, ...]:
    """Derive the seeds of a candidate group from its base seed.

    Args:
        base_seed (`int`): The request's seed, in ``[0, 2**64)``. It is always ``seeds[0]``.
        count (`int`): Number of candidates, ``>= 1``. The upper bound is the spec's business
            (:class:`~trajectory_ensemble_node.contract.CandidateTrajectorySpec`), not this function's.
        policy (`str`, defaults to `"per_candidate"`): One of :data:`SEED_POLICIES`. ``"shared"`` repeats
            ``base_seed`` and is for debugging only.

    Returns:
        `tuple[int, ...]`: ``count`` seeds; pairwise distinct under ``"per_candidate"`` (docs/python-api.md,
        "The seed rule"), all equal to ``base_seed`` under ``"shared"``.

    Raises:
        InvalidSpecError: If ``base_seed`` or ``policy`` is invalid.
        CandidateCountError: If ``count`` is not an int ``>= 1``.
    """
    check_seed(base_seed)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise CandidateCountError(f"candidate count must be an int >= 1, got {count!r}")
    if policy not in SEED_POLICIES:
        raise InvalidSpecError(f"seed_policy must be one of {SEED_POLICIES}, got {policy!r}")
    if policy == "shared":
        return (base_seed,) * count

    seeds = [base_seed]
    state = base_seed
    while len(seeds) < count:
        value = splitmix64(state)
        state = (state + _GOLDEN_GAMMA) & _MASK
        # SplitMix64 outputs never repeat among themselves, so only base_seed can collide, at most once.
        if value != base_seed:
            seeds.append(value)
    return tuple(seeds)


def fresh_base_seed() -> int:
    """Draw an unpredictable uint64 base seed from the OS entropy source (for goals that carry no seed).

    Returns:
        `int`: A seed in ``[0, 2**64)``. Report it with the result so the group can be reproduced.
    """
    return secrets.randbits(64)


def make_generators(seeds: Iterable[int], device: str | torch.device = "cpu") -> list[torch.Generator]:
    """Create one NEW generator per seed.

    Args:
        seeds (`Iterable[int]`): uint64 seeds, one per candidate, in candidate order.
        device (`str` or `torch.device`, defaults to `"cpu"`): Device of the generators; must match the device the
            noise is drawn on.

    Returns:
        `list[torch.Generator]`: ``[torch.Generator(device).manual_seed(s) for s in seeds]``, none advanced yet.

    Raises:
        InvalidSpecError: If a seed is not a uint64.
    """
    generators = []
    for index, seed in enumerate(seeds):
        check_seed(seed, name=f"seeds[{index}]")
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
        generators.append(generator)
    return generators
