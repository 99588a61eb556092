"""Request-owned random streams: one seed, and one fresh generator, per candidate.

The seed rule (this docstring is its reference)
-----------------------------------------------
A request carries one ``base_seed`` (a uint64; :func:`fresh_base_seed` draws one when a goal has none). Candidate
``i`` of ``count`` gets ``seeds[i]``:

* ``seeds[0] = base_seed``. Always. This is what makes ``count=1`` the plain, single-sample path bit for bit.
* ``seeds[i]`` for ``i >= 1`` (policy ``"per_candidate"``) is the ``i``-th output of the standard SplitMix64
  generator (Steele, Lea & Flood 2014; the seeder of ``xoshiro``) whose state starts at ``base_seed``. With
  ``M = 2**64`` and ``G = 0x9E3779B97F4A7C15``, output ``j`` (``j = 1, 2, ...``) is
  ``mix((base_seed + j * G) mod M)``, where ``mix(z)`` is::

      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9  mod M
      z = (z ^ (z >> 27)) * 0x94D049BB133111EB  mod M
      z =  z ^ (z >> 31)

  So ``seeds[1..count-1]`` are the first ``count - 1`` SplitMix64 outputs, in order, **skipping any output equal to
  ``base_seed``**. ``G`` is odd, so the states ``base_seed + j * G`` are distinct for ``j < 2**64`` and ``mix`` is a
  bijection: the outputs never repeat among themselves, only ``base_seed`` itself can collide, and at most one output
  is ever skipped. The seeds of one request are therefore always pairwise distinct. Example: ``base_seed = 0`` gives
  ``(0, 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, ...)``, the published SplitMix64 test vector.
* Policy ``"shared"`` gives every candidate ``base_seed``. It exists ONLY for debugging (e.g. to check that the
  batched path reproduces one sample N times): the candidates are then identical draws, not independent samples, so
  reducing them is pointless.

Every seed lies in ``[0, 2**64)``: valid for ``torch.Generator.manual_seed`` and for a ROS ``uint64`` field.

Generators
----------
Each candidate's noise is drawn from its own ``torch.Generator`` seeded with ``seeds[i]``, so candidate ``i`` of a
batched group draws exactly what a single-sample call with ``generator=torch.Generator().manual_seed(seeds[i])``
draws. The engine makes them with :func:`make_generators` from the seeds when a group is prepared, so a retry or a
sequential fallback re-derives fresh generators instead of reusing partly advanced ones.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

import torch

from .errors import CandidateCountError, InvalidSpecError

SEED_MODULUS = 1 << 64
"""Seeds are uint64: every seed is in ``[0, SEED_MODULUS)``."""

SEED_POLICIES = ("per_candidate", "shared")
"""Valid ``seed_policy`` values. ``"shared"`` is for debugging only (see the module docstring)."""

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
    """The SplitMix64 output function ``mix(state + G)`` (constants in the module docstring).

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
        `tuple[int, ...]`: ``count`` seeds; pairwise distinct under ``"per_candidate"`` (rule in the module
        docstring), all equal to ``base_seed`` under ``"shared"``.

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
