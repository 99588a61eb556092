"""``code-sizes`` counts the product's lines and files per folder from git objects, at two commits."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

from trajectory_ensemble_lab import code_sizes


def _commit(repo: Path, files: dict[str, str], message: str) -> str:
    for path, text in files.items():
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    before = _commit(tmp_path, {
        "trajectory_ensemble_node/__init__.py": "x = 1\n",
        "trajectory_ensemble_node/ros/shim.py": "from a import b\n__all__ = ['b']\n",
        "trajectory_ensemble_node/ros/node.py": "a\nb\nc\n",
        "trajectory_ensemble_node/assets/notes.md": "not python\n",
        "lab/other.py": "1\n2\n3\n4\n",
    }, "before")
    (tmp_path / "trajectory_ensemble_node/ros/shim.py").unlink()
    after = _commit(tmp_path, {"trajectory_ensemble_node/serving/path.py": "one\ntwo\n"}, "after")
    # A dirty work tree is not what is counted.
    (tmp_path / "trajectory_ensemble_node/ros/node.py").write_text("changed\n" * 100)
    return tmp_path, before, after


def test_lines_and_files_per_folder_at_each_commit(repo: tuple[Path, str, str]) -> None:
    path, before, after = repo
    b, a = code_sizes.tree_size(path, before), code_sizes.tree_size(path, after)
    assert b.by_folder() == {"(top level)": (1, 1), "ros/": (5, 2)}
    assert a.by_folder() == {"(top level)": (1, 1), "ros/": (3, 1), "serving/": (2, 1)}
    assert (b.total_lines, b.total_files, a.total_lines, a.total_files) == (6, 3, 6, 3)


def test_the_command_writes_the_record_and_the_table(repo: tuple[Path, str, str], tmp_path_factory) -> None:
    path, before, after = repo
    out = tmp_path_factory.mktemp("out") / "sizes"
    args = argparse.Namespace(repo=path, before=before, after=after, out=out)
    assert code_sizes.run(args) == 0
    rec = json.loads(out.with_suffix(".json").read_text())
    assert rec["before"]["commit"] == before and rec["after"]["files"] == 3
    assert rec["after"]["folders"]["serving/"] == {"lines": 2, "files": 1}
    table = out.with_suffix(".md").read_text()
    assert "| `ros/` | 5 | 3 | 2 | 1 |" in table and "| **total** | 6 | 6 | 3 | 3 |" in table


def test_an_unknown_revision_is_a_named_error(repo: tuple[Path, str, str]) -> None:
    with pytest.raises(ValueError, match="not a commit"):
        code_sizes.tree_size(repo[0], "no-such-rev")
