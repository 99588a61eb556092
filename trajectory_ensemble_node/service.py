"""The service: one model adapter bound to one group engine, and the only object the node and the CLI talk to.

Callers reach the engine through :class:`EnsembleService`'s public methods: submit a built request, start and stop
the background engine, run work between groups, read the adapter's declarations and the engine's gauges. A model
package subclasses it to add its own request builder (``Cosmos3ActionModel``); nothing else constructs a
:class:`~trajectory_ensemble_node.engine.GroupEngine` for serving.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from .contract import DEFAULT_MAX_CANDIDATES, EnsembleResult, allowed_reducers
from .engine import EngineConfig, GroupEngine, GroupHandle, GroupRequest
from .engine.adapter import AdapterCapabilities, CandidateModelAdapter
from .normalization import ActionNormalizer

_T = TypeVar("_T")


class EnsembleService:
    """Serve candidate groups of one model adapter from one group engine.

    Args:
        adapter (`CandidateModelAdapter`): The model side; the engine calls it on its own thread.
        device (`torch.device`): Where the adapter runs (the engine's memory metrics read it).
        max_batch_candidates (`int`): Most candidates in one physical forward.
        oversize_policy (`str`): ``"microbatch"``, ``"sequential"`` or ``"reject"`` for larger groups.
        max_retries (`int`): Whole-group reruns after a failed forward.
        max_candidates (`int`): Largest accepted ``spec.count``.
        action_stats (`ActionNormalizer` or `Mapping[str, ActionNormalizer]`, *optional*): Denormalization into
            robot units, one for all domains or one per ``domain_name``.
    """

    def __init__(
        self,
        adapter: CandidateModelAdapter,
        *,
        device: torch.device,
        max_batch_candidates: int = 16,
        oversize_policy: str = "microbatch",
        max_retries: int = 0,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
        action_stats: ActionNormalizer | Mapping[str, ActionNormalizer] | None = None,
    ) -> None:
        self.adapter = adapter
        self.max_candidates = int(max_candidates)
        self.action_stats = action_stats
        self._outcomes: collections.Counter[str] = collections.Counter()
        self._outcomes_lock = threading.Lock()
        self.engine = GroupEngine(
            adapter,
            EngineConfig(
                max_batch_candidates=max_batch_candidates, oversize_policy=oversize_policy, max_retries=max_retries
            ),
            device=device,
        )

    # --- what the model declares -------------------------------------------------------------------------------------

    @property
    def capabilities(self) -> AdapterCapabilities:
        """What the adapter declares about its candidate output (action tensor, valid reducers, state use)."""
        return self.adapter.capabilities

    @property
    def weights_version(self) -> int:
        """The version of the weights now serving (incremented by each weight update)."""
        return self.adapter.weights_version

    def valid_reducers(self) -> tuple[str, ...]:
        """The adapter's declared reducers that are registered (the width is checked per request)."""
        return allowed_reducers(self.capabilities.valid_reducers)

    def normalizer_for(self, domain_name: str) -> ActionNormalizer | None:
        """The configured action statistics for ``domain_name`` (``None`` when actions stay normalized)."""
        stats = self.action_stats
        if stats is None or isinstance(stats, ActionNormalizer):
            return stats
        return stats.get(domain_name)

    # --- serving -------------------------------------------------------------------------------------------------------

    def submit_request(self, request: GroupRequest) -> GroupHandle:
        """Queue a built request; returns a handle to wait on or cancel.

        Args:
            request (`GroupRequest`): A request from the subclass's ``make_request``.
        """
        handle = self.engine.submit(request)
        handle.add_done_callback(self._count_outcome)
        return handle

    def _count_outcome(self, handle: GroupHandle) -> None:
        # Runs on the engine thread as the group ends, so its status is final (engine/status.py derives the count).
        outcome = handle.status.service_counter
        with self._outcomes_lock:
            self._outcomes[outcome] += 1

    def check_request(self, request: GroupRequest, *, refuse_cold: bool = False) -> None:
        """Raise what :meth:`submit_request` would refuse ``request`` for (capacity, an unmeetable deadline),
        without queuing it: the node decides every refusal before a goal may preempt another.

        Args:
            request (`GroupRequest`): A request from the subclass's ``make_request``.
            refuse_cold (`bool`): Also refuse a deadline while the engine has measured no step yet.
        """
        self.engine.check(request, refuse_cold=refuse_cold)

    def measured_costs(self, *, forget: bool = False,
                       provisional: bool = False) -> tuple[float | None, float | None, float | None]:
        """The engine's running cost estimates in ms: encode, one step, post-processing (``None`` = not measured).

        Args:
            forget (`bool`): Then start them over (after a group that paid one-time costs: first kernels, caches).
            provisional (`bool`): Then let the next real measurement of each replace it, not blend with it (after a
                measurement on a stand-in frame).
        """
        costs = self.engine.costs
        measured = costs.encode_ms, costs.step_ms, costs.post_ms
        if forget:
            costs.encode_ms = costs.step_ms = costs.post_ms = None
        if provisional:
            costs.provisional = {"encode_ms", "step_ms", "post_ms"}
        return measured

    def run_until_idle(self) -> None:
        """Drive every submitted group to completion on the calling thread."""
        self.engine.run_until_idle()

    def wait(self, handle: GroupHandle, timeout: float | None = None) -> EnsembleResult:
        """Wait for ``handle``'s result, driving the engine on this thread when no background thread runs it.

        Raises:
            GroupAbortedError: or another named error the group ended with.
        """
        if not self.engine.is_background:
            self.engine.run_until_idle()
        return handle.result(timeout)

    def run_between_groups(self, fn: Callable[[], _T], timeout: float | None = None) -> _T:
        """Run ``fn`` on the engine's thread while no group is mid-step, and return what it returned.

        Args:
            fn (`Callable[[], T]`): The work (e.g. copying new weights in).
            timeout (`float`, *optional*): Seconds to wait for the running groups to finish.

        Raises:
            TimeoutError: the running groups did not finish within ``timeout``.
        """
        future = self.engine.run_between_groups(fn)
        if not self.engine.is_background:
            self.engine.run_until_idle()
        return future.result(timeout)

    def start(self) -> None:
        """Run the engine on its own background thread (the node's mode)."""
        self.engine.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop the background thread; unfinished groups end with ``EngineShutdownError``.

        Args:
            timeout (`float`, *optional*): Seconds to wait for the step in progress to end.
        """
        self.engine.stop(timeout)

    # --- gauges ----------------------------------------------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        """Whether the background engine thread is running."""
        return self.engine.is_alive

    @property
    def num_queued(self) -> int:
        """Groups submitted but not yet admitted."""
        return self.engine.num_queued

    @property
    def num_running(self) -> int:
        """Groups admitted and denoising."""
        return self.engine.num_running

    def outcome_counts(self) -> dict[str, int]:
        """How the submitted groups ended so far: ``succeeded``, ``canceled`` (e.g. a client that went away),
        ``preempted``, ``shutdown`` and ``failed`` (every other named error), counted as each group ends."""
        with self._outcomes_lock:
            return dict(self._outcomes)

    def remote_status(self) -> None:
        """``None``: the model runs in this process (a remote model reports its server's state here)."""
        return None

    def instrument(self, wrap: Callable[[CandidateModelAdapter], _T]) -> _T:
        """TEST ONLY: hand the adapter the engine calls to ``wrap`` (e.g. a fault injector that shadows its methods).

        Args:
            wrap (`Callable[[CandidateModelAdapter], T]`): Called once with the adapter.

        Returns:
            `T`: whatever ``wrap`` returned.
        """
        return wrap(self.adapter)
