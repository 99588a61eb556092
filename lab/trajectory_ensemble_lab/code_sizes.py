"""``trajectory-ensemble code-sizes``: the product's Python lines and files per folder, at two commits.

Counted from git objects (``git ls-tree`` and ``git cat-file``), never from the work tree, so a results file names
exactly the code it counts and a dirty checkout changes nothing. A line is a newline-terminated line, as ``wc -l``
counts it. Writes ``bench/results/code-sizes.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trajectory_ensemble_node.provenance import utc_now
from .records import write_json

PRODUCT = "trajectory_ensemble_node"
TOP_LEVEL = "(top level)"
LARGEST = 10


@dataclass(frozen=True)
class TreeSize:
    """The product's ``.py`` files at one commit.

    Args:
        commit (`str`): The full hash counted.
        lines (`dict[str, int]`): Lines per file path, relative to the product folder.
    """

    commit: str
    lines: dict[str, int]

    @property
    def total_lines(self) -> int:
        return sum(self.lines.values())

    @property
    def total_files(self) -> int:
        return len(self.lines)

    def by_folder(self) -> dict[str, tuple[int, int]]:
        """``{folder: (lines, files)}``; a file directly in the product folder counts under ``(top level)``."""
        folders: dict[str, tuple[int, int]] = {}
        for path, count in self.lines.items():
            folder = f"{path.split('/', 1)[0]}/" if "/" in path else TOP_LEVEL
            lines, files = folders.get(folder, (0, 0))
            folders[folder] = (lines + count, files + 1)
        return folders


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def tree_size(repo: Path, rev: str) -> TreeSize:
    """Count every ``.py`` file under the product folder at ``rev``.

    Args:
        repo (`Path`): A git work tree or repository.
        rev (`str`): Any revision git resolves.

    Raises:
        ValueError: ``rev`` is not a commit of ``repo``.
    """
    try:
        commit = _git(repo, "rev-parse", "--verify", f"{rev}^{{commit}}").strip()
    except subprocess.CalledProcessError as exc:
        raise ValueError(f"not a commit of {str(repo)!r}: {rev!r}") from exc
    listing = _git(repo, "ls-tree", "-r", "--format=%(objectname) %(path)", commit, "--", f"{PRODUCT}/")
    blobs = [line.split(" ", 1) for line in listing.splitlines() if line.endswith(".py")]
    if not blobs:
        return TreeSize(commit, {})
    # One cat-file process for every blob: its batch output is "<sha> blob <size>\n<bytes>\n" per object.
    request = ("\n".join(sha for sha, _ in blobs) + "\n").encode()
    data = subprocess.run(["git", "cat-file", "--batch"], cwd=repo, input=request, capture_output=True, check=True).stdout
    lines, offset = {}, 0
    for _, path in blobs:
        header_end = data.index(b"\n", offset)
        size = int(data[offset:header_end].split()[2])
        body = data[header_end + 1 : header_end + 1 + size]
        lines[path[len(PRODUCT) + 1 :]] = body.count(b"\n")
        offset = header_end + 1 + size + 1
    return TreeSize(commit, lines)


def record(before: TreeSize, after: TreeSize) -> dict:
    """The JSON record of one comparison."""
    return {
        "date": utc_now(),
        "before": {"commit": before.commit, "lines": before.total_lines, "files": before.total_files,
                   "folders": {k: {"lines": v[0], "files": v[1]} for k, v in sorted(before.by_folder().items())}},
        "after": {"commit": after.commit, "lines": after.total_lines, "files": after.total_files,
                  "folders": {k: {"lines": v[0], "files": v[1]} for k, v in sorted(after.by_folder().items())}},
        "largest_after": sorted(after.lines.items(), key=lambda kv: (-kv[1], kv[0]))[:LARGEST],
    }


def markdown(rec: Mapping) -> str:
    """The markdown table of :func:`record`'s output."""
    before, after = rec["before"], rec["after"]
    folders = sorted(set(before["folders"]) | set(after["folders"]))
    zero = {"lines": 0, "files": 0}
    out = [
        "# Python lines and files of the product, per folder",
        "",
        f"Written by `trajectory-ensemble code-sizes --before {before['commit'][:7]} --after {after['commit'][:7]}` "
        f"on {rec['date']}, from git objects (every `.py` file under `{PRODUCT}/`; lines as `wc -l` counts them).",
        "",
        "| folder | lines before | lines after | files before | files after |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for folder in folders:
        b, a = before["folders"].get(folder, zero), after["folders"].get(folder, zero)
        out.append(f"| `{folder}` | {b['lines']:,} | {a['lines']:,} | {b['files']} | {a['files']} |")
    out.append(f"| **total** | {before['lines']:,} | {after['lines']:,} | {before['files']} | {after['files']} |")
    out += ["", "| largest files after | lines |", "| --- | ---: |"]
    out += [f"| `{path}` | {count:,} |" for path, count in rec["largest_after"]]
    return "\n".join(out) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--before", required=True, help="the revision to compare from")
    parser.add_argument("--after", default="HEAD", help="the revision to compare to (default HEAD)")
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="the git checkout (default: here)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/code-sizes"),
                        help="writes OUT.json and OUT.md (default bench/results/code-sizes)")


def run(args: argparse.Namespace) -> int:
    try:
        rec = record(tree_size(args.repo, args.before), tree_size(args.repo, args.after))
    except ValueError as exc:
        print(f"error: {exc}")
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out.with_suffix(".json"), rec)
    args.out.with_suffix(".md").write_text(markdown(rec))
    print(f"{rec['before']['lines']:,} lines in {rec['before']['files']} files -> "
          f"{rec['after']['lines']:,} lines in {rec['after']['files']} files ({args.out}.md)")
    return 0
