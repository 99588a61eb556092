"""How a robot executes action chunks back to back: the methods of the closed-loop benchmarks, free of any task.

The toy closed loop (:mod:`.toy.closed_loop`) and PushT's (:mod:`.pusht.bench`) run the same methods on different
worlds, so what a method *is* (how many candidates, which reducer, which guidance, how an arriving chunk takes
over) lives here once, and each world only says how a target is executed and what an episode measures.

Timeline (``H`` actions per chunk, ``s`` executed per chunk, inference delay ``d`` control steps): a chunk planned
from the observation at step ``t`` holds the targets of steps ``t + 1 .. t + H``. Asynchronous methods plan the next
chunk every ``s`` steps; it arrives ``d`` steps later, while the robot keeps executing the old one, so its first
``d`` actions are frozen (:class:`ChunkPlan.take_over` splices it in). ``sync`` executes ``s`` actions, then stands
still for ``d`` steps while the next chunk is computed.

Methods (exact names): ``sync``; ``naive_async`` (take the new chunk over from action ``d``); ``temporal_ensemble``
(ACT: every arrived chunk covering a step, weights ``exp(-m i)``, ``i = 0`` the oldest, ``m = 0.01``);
``weighted_average`` (LeRobot async: overlap ``0.3 old + 0.7 new``); ``bid`` (N = 8, ``backward_coherence``, no
guidance); ``guided`` (gradient-free prefix guidance, N = 1); ``guided_mode`` (prefix guidance + ``mode_continuity``,
N = 8); ``rtc_vjp`` (RTC's VJP guidance, N = 1); on request ``guided_mask`` (frozen actions through the action mask,
N = 1) and ``guided_bid`` (prefix guidance + ``backward_coherence``, N = 8).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

TE_M = 0.01
"""Temporal ensembling's decay ``m`` (ACT's value)."""
WA_OLD = 0.3
"""The old chunk's share of the overlap in ``weighted_average`` (LeRobot async inference's value)."""
EXECUTIONS = ("sync", "switch", "temporal_ensemble", "weighted_average")


@dataclass(frozen=True)
class Method:
    """How a method draws and executes chunks.

    Args:
        count (`int`): Candidates per chunk.
        reducer (`str`): Reducer name (``"none"`` for one candidate).
        guidance (`str`, *optional*): Context guidance mode; ``None`` sends no context at all.
        execution (`str`): One of :data:`EXECUTIONS`.
    """

    count: int
    reducer: str
    guidance: str | None
    execution: str

    def __post_init__(self) -> None:
        if self.execution not in EXECUTIONS:
            raise ValueError(f"execution must be one of {EXECUTIONS}, got {self.execution!r}")


METHODS: dict[str, Method] = {
    "sync": Method(1, "none", None, "sync"),
    "naive_async": Method(1, "none", None, "switch"),
    "temporal_ensemble": Method(1, "none", None, "temporal_ensemble"),
    "weighted_average": Method(1, "none", None, "weighted_average"),
    "bid": Method(8, "backward_coherence", "none", "switch"),
    "guided": Method(1, "none", "prefix", "switch"),
    "guided_mode": Method(8, "mode_continuity", "prefix", "switch"),
    "rtc_vjp": Method(1, "none", "vjp", "switch"),
}
EXTRA_METHODS: dict[str, Method] = {
    "guided_mask": Method(1, "none", "mask", "switch"),
    "guided_bid": Method(8, "backward_coherence", "prefix", "switch"),
}
GRADIENT_FREE = ("prefix", "mask")
"""Guidance modes ``--context-guidance`` can give the gradient-free methods."""


def method_table(context_guidance: str = "prefix") -> dict[str, Method]:
    """Every method by name, the gradient-free ones (``"prefix"`` by default) served with ``context_guidance``."""
    if context_guidance not in GRADIENT_FREE:
        raise ValueError(f"context_guidance must be one of {GRADIENT_FREE}, got {context_guidance!r}")
    return {name: dataclasses.replace(method, guidance=context_guidance) if method.guidance == "prefix" else method
            for name, method in {**METHODS, **EXTRA_METHODS}.items()}


class ChunkPlan:
    """The targets an executing robot follows: absolute control step -> target, as chunks arrive and take over.

    Args:
        chunk (`np.ndarray` of shape `[H, D]`): The first chunk, planned at step 0 (its row ``k`` is step ``k + 1``).
    """

    def __init__(self, chunk: np.ndarray) -> None:
        self.horizon = len(chunk)
        self.steps: dict[int, np.ndarray] = {1 + k: chunk[k] for k in range(self.horizon)}
        self._arrived: list[tuple[int, np.ndarray]] = [(0, chunk)]  # (planning step, chunk), for temporal ensembling

    def target(self, t: int, hold: np.ndarray) -> np.ndarray:
        """The target executed at step ``t`` (the plan's step ``t + 1``), ``hold`` past the plan's end."""
        return self.steps.get(t + 1, hold)

    def take_over(self, execution: str, planned_at: int, new: np.ndarray, delay: int, t: int,
                  hold: np.ndarray) -> float:
        """Splice in ``new``, planned at step ``planned_at`` and arriving at step ``t = planned_at + delay``.

        Args:
            execution (`str`): ``"switch"``, ``"weighted_average"`` or ``"temporal_ensemble"``.
            planned_at (`int`): The step of the observation ``new`` was planned from.
            new (`np.ndarray` of shape `[H, D]`): The arriving chunk.
            delay (`int`): Its frozen actions (rows ``0 .. delay - 1`` were executed from the old plan).
            t (`int`): Now.
            hold (`np.ndarray`): The target past the old plan's end (where the robot is).

        Returns:
            `float`: The seam jump: the distance between the next target before and after the take-over.
        """
        old_next = self.steps.get(t + 1, hold)
        first = t + 1
        if execution == "switch":
            for k in range(delay, self.horizon):
                self.steps[planned_at + 1 + k] = new[k]
        elif execution == "weighted_average":
            for k in range(delay, self.horizon):
                step = planned_at + 1 + k
                self.steps[step] = WA_OLD * self.steps[step] + (1 - WA_OLD) * new[k] if step in self.steps else new[k]
        elif execution == "temporal_ensemble":  # every arrived chunk covering a step, oldest first
            self._arrived.append((planned_at, new))
            self._arrived = [(at, c) for at, c in self._arrived if at + self.horizon >= first]
            for step in range(first, planned_at + 1 + self.horizon):
                covering = [c[step - at - 1] for at, c in self._arrived if 0 <= step - at - 1 < self.horizon]
                weights = np.exp(-TE_M * np.arange(len(covering)))
                self.steps[step] = (weights[:, None] * np.asarray(covering)).sum(0) / weights.sum()
        else:
            raise ValueError(f"a chunk takes over by 'switch', 'weighted_average' or 'temporal_ensemble', got "
                             f"{execution!r}")
        return float(np.linalg.norm(self.steps[first] - old_next))
