"""How a command ends on a named error: ``error: <message>`` on stderr, and the exit status its ``--help`` lists.

Every command maps each kind of error it expects to one exit status (usage 2, unreachable node 3, ...). The table is
the command's; printing and matching are here, so every command words a failure the same way.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

ErrorKinds = type[BaseException] | tuple[type[BaseException], ...]
ExitTable = Sequence[tuple[ErrorKinds, int]]
"""``(error class or classes, exit status)`` pairs; the first pair whose classes the error is an instance of wins."""


def fail(error: object, status: int) -> int:
    """Print ``error: <error>`` on stderr and return ``status``.

    Args:
        error (`object`): The error, or a message.
        status (`int`): The exit status to return.
    """
    print(f"error: {error}", file=sys.stderr)
    return status


def run_command(body: Callable[[], int], exits: ExitTable) -> int:
    """``body()``'s exit status, or, when it raises an error of a kind in ``exits``, that kind's status after
    :func:`fail`. Other errors propagate: they are bugs, not refusals.

    Args:
        body (`Callable[[], int]`): The command's work; returns its exit status.
        exits (`ExitTable`): The expected errors and their statuses, in order of precedence.
    """
    kinds = tuple(kind for kind, _ in exits)
    try:
        return body()
    except kinds as error:  # nested tuples are allowed: ``except`` matches them as isinstance does
        return fail(error, next(status for kind, status in exits if isinstance(error, kind)))
