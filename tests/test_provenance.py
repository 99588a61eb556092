"""Results files record the run's commit and start time (``trajectory_ensemble_node.provenance``)."""

from __future__ import annotations

import datetime
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from trajectory_ensemble_node import provenance

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO_ROOT / ".git").exists(), reason="not a git checkout")
def test_the_commit_is_the_checkout_short_hash_marked_dirty_when_tracked_files_differ():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                           capture_output=True, text=True, check=True).stdout.strip() != ""
    assert provenance.git_commit() == head + ("-dirty" if dirty else "")


def test_without_git_the_commit_is_unknown(monkeypatch):
    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance.subprocess, "run", no_git)
    assert provenance.git_commit() == provenance.UNKNOWN_COMMIT == "unknown"


def test_the_date_is_utc_to_the_second():
    stamp = provenance.utc_now()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", stamp), stamp
    parsed = datetime.datetime.fromisoformat(stamp)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - parsed).total_seconds()) < 60
