"""The test-only ``fault_injection`` parameter: which faults exist, and the rule that refuses it outside tests.

Kept apart from :mod:`.params` (which re-exports every name) so the parameter table stays one readable file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ParameterError

FAULTS = ("engine_exception", "out_of_memory", "nan_candidates")
"""Test-only faults ``fault_injection`` may arm (see :mod:`.faults`). ``nan_candidates:I,J`` corrupts only the
candidates with those indices."""
TESTING_ENV = "TRAJECTORY_ENSEMBLE_TESTING"
"""``fault_injection`` is refused unless this environment variable is ``1``."""


def check_fault_injection(value: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse ``fault_injection`` outside tests, and names that are no fault.

    Raises:
        ParameterError: set without ``TRAJECTORY_ENSEMBLE_TESTING=1``, or not one of :data:`FAULTS`.
    """
    if not value:
        return
    env = os.environ if env is None else env
    if env.get(TESTING_ENV) != "1":
        raise ParameterError(
            f"fault_injection: {value!r} is a test-only hook and is refused unless {TESTING_ENV}=1 is set"
        )
    parse_fault(value)


def parse_fault(value: str) -> tuple[str, tuple[int, ...] | None]:
    """Split a ``fault_injection`` value into the fault and, for ``nan_candidates:I,J``, the chosen indices.

    Returns:
        `tuple[str, tuple[int, ...] | None]`: the fault name, and the candidate indices (``None`` = all).

    Raises:
        ParameterError: not one of :data:`FAULTS`, or indices that are not non-negative integers.
    """
    name, _, chosen = value.partition(":")
    if name not in FAULTS or (chosen and name != "nan_candidates"):
        raise ParameterError(f"fault_injection: {value!r} is not one of {list(FAULTS)} (or nan_candidates:I,J)")
    if not chosen:
        return name, None
    try:
        indices = tuple(int(part) for part in chosen.split(","))
    except ValueError:
        indices = (-1,)
    if any(i < 0 for i in indices):
        raise ParameterError(f"fault_injection: {value!r}: candidate indices must be integers >= 0")
    return name, indices
