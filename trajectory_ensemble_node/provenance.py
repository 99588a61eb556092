"""What a results file records about the run that wrote it: when it started, and from which code.

Read both once, when a run starts: the code that runs is the checkout as it is then, and HEAD may move while a long
run goes on.
"""

from __future__ import annotations

import datetime
import subprocess
from pathlib import Path

UNKNOWN_COMMIT = "unknown"
"""The commit recorded when this package does not run from a git work tree (an installed wheel, a Docker image)."""


def git_commit() -> str:
    """The short hash of the checkout this package runs from, ``-dirty`` appended when tracked files differ from it.

    Returns:
        `str`: e.g. ``"8b51d14"`` or ``"8b51d14-dirty"``; :data:`UNKNOWN_COMMIT` outside a git work tree.
    """
    try:
        # --exclude '*' ignores tags, so the name is always the hash, as older results files record it.
        return subprocess.run(
            ["git", "describe", "--always", "--dirty", "--exclude", "*"], cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip() or UNKNOWN_COMMIT
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN_COMMIT


def utc_now() -> str:
    """Now, in UTC, as ISO 8601 to the second (``2026-12-01T04:26:32+00:00``)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
