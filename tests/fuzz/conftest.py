"""Hypothesis profiles of the fuzz targets (issue 45) and the per-target example counts they report.

Two profiles, chosen by ``TRAJECTORY_ENSEMBLE_FUZZ_PROFILE`` (default ``ci``):

- ``ci``: what ``make test`` runs. ``derandomize=True`` so a CI failure reproduces from the commit alone; a bounded
  number of examples per target (``_fuzz.EXAMPLES``) so the folder takes a minute or two on a loaded 2-core machine.
- ``soak``: what ``make soak`` runs (``tests/fuzz/soak_report.py``): thousands of examples per target, random seeds,
  and the example database kept, so a failure found once is replayed first next time.

Neither profile is loaded globally: the other hypothesis tests of the suite keep their own settings. Each target takes
``_fuzz.fuzz_settings(target)``, this profile with the target's example budget. ``deadline=None`` in both: an
example's time says nothing about correctness on a machine shared by other test runs.

Every example a target runs is counted; the counts are printed at the end of the session and, when
``TRAJECTORY_ENSEMBLE_FUZZ_COUNTS`` names a file, written there as JSON (``soak_report.py`` reads them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _fuzz import COUNTS, COUNTS_ENV, PROFILE, PROFILE_ENV
from hypothesis import HealthCheck, Phase, settings

settings.register_profile("ci", deadline=None, derandomize=True, database=None, print_blob=True,
                          # The generated bags and YAML files are written to disk: slower than the health check's
                          # budget for data generation on a loaded machine, and expected to be.
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("soak", deadline=None, derandomize=False, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow],
                          # No explain phase: it traces every line of a failing example's replays, which took
                          # longer than the whole run on a loaded machine; the shrunk example is the report.
                          phases=[phase for phase in Phase if phase != Phase.explain])

if PROFILE not in ("ci", "soak"):
    raise pytest.UsageError(f"{PROFILE_ENV}={PROFILE!r}; expected ci or soak")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line per target: the examples it ran in this session, and the profile."""
    if not COUNTS:
        return
    terminalreporter.write_sep("-", f"fuzz examples per target (profile {PROFILE})")
    for target, count in sorted(COUNTS.items()):
        terminalreporter.write_line(f"{target}: {count}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the counts to ``TRAJECTORY_ENSEMBLE_FUZZ_COUNTS`` when it is set."""
    path = os.environ.get(COUNTS_ENV)
    if path:
        Path(path).write_text(json.dumps({"profile": PROFILE, "counts": dict(sorted(COUNTS.items()))}, indent=1))
