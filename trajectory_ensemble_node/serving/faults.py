"""TEST-ONLY fault injection: make the next group fail inside the real engine, in a real node process.

``fault_injection`` arms one fault (:data:`~.params.FAULTS`) for the next group, raised where a real one would be so
the production path is under test; it is refused unless ``TRAJECTORY_ENSEMBLE_TESTING=1`` (docs/security.md). In
testing mode ``TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S`` paces every physical forward, so a test can land a cancel,
preemption or shutdown mid-group instead of racing the tiny model.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ParameterError
from .params import FAULTS, parse_fault

STEP_DELAY_ENV = "TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S"


class FaultInjector:
    """Wraps an adapter's ``forward`` and ``finish`` (on the instance) to fire one armed fault.

    Args:
        adapter (`Any`): The model adapter the engine calls (e.g. ``Cosmos3Adapter``).
        step_delay_s (`float`, *optional*): Seconds to sleep before every physical forward; defaults to
            :data:`STEP_DELAY_ENV` from the environment (``0`` when unset).
    """

    def __init__(self, adapter: Any, step_delay_s: float | None = None) -> None:
        if step_delay_s is None:
            raw = os.environ.get(STEP_DELAY_ENV, "0") or "0"
            try:
                step_delay_s = float(raw)
            except ValueError:
                raise ValueError(f"{STEP_DELAY_ENV} must be a number of seconds, got {raw!r}") from None
        if step_delay_s < 0:
            raise ValueError(f"{STEP_DELAY_ENV} must be >= 0, got {step_delay_s!r}")
        self.step_delay_s = step_delay_s
        self._adapter = adapter
        self._lock = threading.Lock()
        self._armed: str | None = None
        self._indices: tuple[int, ...] | None = None
        self._forward = adapter.forward
        self._finish = adapter.finish
        # Instance attributes shadow the class's methods, so the engine's ``self.adapter.forward(...)`` lands here
        # while the adapter's own code is untouched.
        adapter.forward = self._faulty_forward
        adapter.finish = self._faulty_finish

    @property
    def armed(self) -> str | None:
        """The fault waiting to fire, if any."""
        return self._armed

    def arm(self, fault: str) -> None:
        """Arm ``fault`` for the next group (``""`` disarms).

        Raises:
            ValueError: not one of :data:`~.params.FAULTS`.
        """
        indices = None
        if fault:
            try:
                fault, indices = parse_fault(fault)
            except ParameterError as error:
                raise ValueError(f"unknown fault {fault!r}; expected one of {list(FAULTS)}: {error}") from None
        with self._lock:
            self._armed = fault or None
            self._indices = indices

    def _take(self, *faults: str) -> str | None:
        with self._lock:
            if self._armed in faults:
                fault, self._armed = self._armed, None
                return fault
            return None

    def _faulty_forward(self, slices: Sequence[Any], should_abort: Any = None) -> int:
        fault = self._take("engine_exception", "out_of_memory")
        if fault == "engine_exception":
            raise RuntimeError("injected fault: engine_exception")
        if fault == "out_of_memory":
            raise torch.OutOfMemoryError("injected fault: CUDA out of memory")
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        return self._forward(slices, should_abort)

    def _faulty_finish(self, state: Any) -> Any:
        output = self._finish(state)
        if self._take("nan_candidates"):
            if self._indices is None:
                output.candidates = torch.full_like(output.candidates, float("nan"))
            else:
                corrupted = output.candidates.clone()
                chosen = [i for i in self._indices if i < corrupted.shape[0]]
                corrupted[chosen] = float("nan")
                output.candidates = corrupted
        return output
