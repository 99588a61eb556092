"""Where the lab's measurements land: the one writer of results files, run summaries and round records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_json(path: Path, document: Any) -> Path:
    """Write ``document`` to ``path`` as JSON indented by one space, with a final newline, making its folder first.

    Args:
        path (`Path`): The file to write (replaced if it exists).
        document (`Any`): Anything ``json.dumps`` takes: a results record, a run summary, a round's report.

    Returns:
        `Path`: ``path``, so a caller can log where the record went.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    return path
