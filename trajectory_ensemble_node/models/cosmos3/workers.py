"""Forward workers: the independent pieces of one packed forward, spread over the cores intra-op threads leave idle.

Each piece runs the same ops on the same inputs, so results do not change by a bit; a lone group has nothing to split
(docs/python-api.md, "Forward workers on CPU"). Pieces run in parallel only with autograd off: they write disjoint
rows of shared buffers, and in-place writes from several threads would race on autograd history.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

T = TypeVar("T")

MAX_AUTO_THREADS = 4
"""``auto`` never uses more threads than this (pieces of one forward are few; more threads only add handoffs)."""


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def default_forward_threads(device: torch.device) -> int:
    """``auto``: on CPU, the cores that torch's intra-op threads leave free (at most ``MAX_AUTO_THREADS``); 1 on
    CUDA, where kernels are asynchronous and the calling thread only launches them."""
    if device.type != "cpu":
        return 1
    return max(1, min(MAX_AUTO_THREADS, usable_cores() // max(1, torch.get_num_threads())))


def resolve_forward_threads(value: int | str | None, device: torch.device) -> int:
    """``forward_threads`` as a count: ``"auto"`` per :func:`default_forward_threads`, ``None`` or 0 as 1.

    Raises:
        ValueError: anything but ``"auto"``, ``None`` or an int >= 0 (the adapter translates it).
    """
    if value == "auto":
        return default_forward_threads(device)
    if value is None or value == 0:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"forward_threads must be 'auto', None or an int >= 0, got {value!r}.")
    return value


class ForwardWorkers:
    """Split independent pieces of work over ``threads`` threads: the caller's and ``threads - 1`` workers.

    Args:
        threads (`int`): Threads in all, the calling one included (1: everything runs on the caller).
    """

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}.")
        self.threads = threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.parallel_calls = 0
        """Calls that ran on more than one thread (for tests and benchmarks)."""

    def run(self, pieces: Sequence[T], work: Callable[[Sequence[T]], None]) -> None:
        """Call ``work`` on contiguous shares of ``pieces``, one share per thread, and wait for all of them.

        Args:
            pieces (`Sequence`): Independent pieces (row ranges, attention runs), in order.
            work (`Callable[[Sequence], None]`): Runs a share; it writes its results where the caller reads them.

        Raises:
            Exception: the first share's exception (the caller's share is always waited for, and every worker's
                share is finished before this returns or raises, so no thread is left writing).
        """
        shares = min(self.threads, len(pieces))
        if shares <= 1 or torch.is_grad_enabled():
            work(pieces)
            return
        size, extra = divmod(len(pieces), shares)
        bounds, start = [], 0
        for index in range(shares):
            stop = start + size + (1 if index < extra else 0)
            bounds.append((start, stop))
            start = stop
        pool = self._executor()
        futures = [pool.submit(self._share, work, pieces[a:b]) for a, b in bounds[1:]]
        self.parallel_calls += 1
        error: BaseException | None = None
        try:
            work(pieces[bounds[0][0]:bounds[0][1]])
        except BaseException as exc:  # noqa: BLE001 - re-raised once the workers are done
            error = exc
        for future in futures:
            try:
                future.result()
            except BaseException as exc:  # noqa: BLE001
                error = error or exc
        if error is not None:
            raise error

    @staticmethod
    def _share(work: Callable[[Sequence[T]], None], share: Sequence[T]) -> None:
        # Grad mode is thread-local: a worker starts with autograd on, and its share must not record a graph.
        with torch.no_grad():
            work(share)

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            # Workers use the creating thread's intra-op thread count, so a piece computes the same bits on them.
            intra_op = torch.get_num_threads()
            self._pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=self.threads - 1, thread_name_prefix="forward-worker",
                initializer=torch.set_num_threads, initargs=(intra_op,),
            )
        return self._pool

    def close(self) -> None:
        """Stop the worker threads (a later :meth:`run` starts them again)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
