"""Fixtures of the remote-engine tests: the OpenPI tests' toy policy behind a real server (``_openpi_harness.py``)."""

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
for folder in (_TESTS, _TESTS / "openpi"):  # the shared harnesses, whichever folder pytest started from
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from _openpi_harness import paced, toy_policy  # noqa: E402,F401 - fixtures
