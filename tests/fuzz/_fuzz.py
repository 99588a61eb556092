"""Shared helpers of the fuzz targets: the profile in use, each target's example budget, the count of examples run,
and the one check every refusal must pass (a named error with a code, whose error frame is a few KiB at most).

Kept apart from ``conftest.py`` so that the test modules can import it (``tests/fuzz`` is on ``sys.path`` while they
are collected, as every test folder without ``__init__.py`` is).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Collection

from hypothesis import settings
from hypothesis import strategies as st

from trajectory_ensemble_node.errors import ErrorCode, TrajectoryEnsembleError, describe_error
from trajectory_ensemble_node.wire import codec

PROFILE_ENV = "TRAJECTORY_ENSEMBLE_FUZZ_PROFILE"
COUNTS_ENV = "TRAJECTORY_ENSEMBLE_FUZZ_COUNTS"
PROFILE = os.environ.get(PROFILE_ENV, "ci")

EXAMPLES: dict[str, dict[str, int]] = {
    # target: {profile: max_examples}. ci sizes keep the folder near a minute and a half on a loaded 2-core machine;
    # soak sizes near ten minutes: thousands where an example costs milliseconds, hundreds where it writes a bag, runs
    # the model or parses a large YAML document.
    "wire": {"ci": 400, "soak": 5_000},
    "wire_arrays": {"ci": 300, "soak": 2_000},
    "schemas": {"ci": 300, "soak": 2_500},
    "server": {"ci": 40, "soak": 400},
    "observations": {"ci": 300, "soak": 5_000},
    "observation_buffer": {"ci": 100, "soak": 1_500},
    "params_tree": {"ci": 200, "soak": 2_000},
    "params_text": {"ci": 80, "soak": 600},
    "bag_payloads": {"ci": 10, "soak": 200},
    "bag_files": {"ci": 12, "soak": 200},
}
"""Example budget per target and profile (``settings.max_examples``); the report quotes the counts actually run."""

TIMEOUT_S = 300 if PROFILE == "ci" else 3600
"""Per test function (pytest-timeout): all of a target's examples run in one call, so a hang fails in minutes in
``ci``; the soak budgets need longer on a loaded machine."""

COUNTS: Counter[str] = Counter()
"""Examples run per target in this session (shrinking included), printed at the end of the session."""


def fuzz_settings(target: str) -> settings:
    """The profile in use (``TRAJECTORY_ENSEMBLE_FUZZ_PROFILE``) with ``target``'s example budget.

    Args:
        target (`str`): A key of :data:`EXAMPLES`.
    """
    return settings(settings.get_profile(PROFILE), max_examples=EXAMPLES[target][PROFILE])


def record(target: str) -> None:
    """Count one example of ``target``."""
    COUNTS[target] += 1


MAX_REFUSAL_BYTES = 4096
"""Most bytes of an error frame, whatever the request held (issue 61: a 15 MB value once came back as 75 MB)."""

LARGE_SIZES = st.sampled_from([100, 1_000, 70_000, 1_000_000, 3_000_000])
"""Lengths of the large values the targets plant where a refusal would quote them."""
large_text = LARGE_SIZES.map(lambda n: "\u00e9" * (n // 2) + "x" * (n - n // 2))
large_bytes = LARGE_SIZES.map(lambda n: b"\x00\xff" * (n // 2))
"""A long string (half of it non-ASCII, which JSON escapes six-fold) and a long binary."""


def check_reply_size(error: BaseException) -> str:
    """Fail unless the error frame of ``error`` (what a client of ``serve-openpi`` would get) is at most
    :data:`MAX_REFUSAL_BYTES`; returns the frame."""
    frame = codec.error_frame(error)
    assert len(frame.encode()) <= MAX_REFUSAL_BYTES, \
        f"a {len(frame.encode())}-byte error frame: {frame[:200]}..."
    return frame


def check_named(error: BaseException, codes: Collection[ErrorCode] | None = None) -> ErrorCode:
    """Fail unless ``error`` is a named error with a code (among ``codes`` when given); returns the code.

    A bare ``ValueError``, ``KeyError``, ``struct.error``... from deep inside a parser is exactly what the fuzzers
    look for: it reaches the operator as a traceback, or the client as an anonymous ``ENGINE_FAILURE``.

    Args:
        error (`BaseException`): What the code under test raised.
        codes (`Collection[ErrorCode]`, *optional*): The codes this surface may refuse with.
    """
    assert isinstance(error, TrajectoryEnsembleError), \
        f"unnamed {type(error).__name__} escaped: {error!r}"
    code = ErrorCode(error.code)
    assert codes is None or code in codes, f"unexpected code: {describe_error(error)}"
    assert str(error), f"{type(error).__name__} without a message"
    check_reply_size(error)
    return code
