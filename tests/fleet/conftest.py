"""The fleet tests reuse the OpenPI tests' helpers (``tests/openpi/_openpi_harness.py``, their one home)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openpi"))
