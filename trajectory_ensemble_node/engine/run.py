"""One admitted group inside the engine: where it is, what it has cost so far, and the metrics it reports.

The scheduler (:mod:`.scheduler`) moves a :class:`GroupRun` through admission, denoising and completion; the run
itself only keeps the books, so the counters a result reports have one home.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..metrics import AdapterExtras, GroupCounters, now_ms, peak_memory_bytes
from .adapter import CandidateOutput
from .deadline import StepsReport, steps_report
from .request import GroupHandle, GroupRequest


@dataclass
class GroupRun:
    """One admitted group (engine-internal)."""

    handle: GroupHandle
    sequential: bool
    submitted_ms: float
    admitted_ms: float = 0.0
    state: Any = None  # the adapter's DenoiseState, from its prepare
    part: int = 0  # sequential fallback: index of the candidate now running
    outputs: list[CandidateOutput] = field(default_factory=list)
    physical_forwards: int = 0
    microbatches: int = 1
    co_batched_max: int = 1
    encode_ms: float = 0.0
    denoise_ms: float = 0.0
    retries: int = 0
    fallback_reason: str | None = None
    pending_slices: int = 0
    deadline_ms: float | None = None  # absolute, on the now_ms() clock
    steps_fitted: int | None = None

    @property
    def request(self) -> GroupRequest:
        return self.handle.request

    @property
    def slots(self) -> int:
        return 1 if self.sequential else self.request.count

    def restart(self) -> None:
        """Forget the work of a failed attempt, so the group reruns whole from its seeds (a retry)."""
        self.retries += 1
        self.outputs.clear()
        self.part = 0
        self.physical_forwards = 0
        self.denoise_ms = 0.0

    def reports(self, reduce_ms: float, extras: dict[str, Any], device: torch.device,
                weights_version: int) -> tuple[GroupCounters, StepsReport, AdapterExtras]:
        """The engine's reports of the finished group: counts, timings, memory, steps, and the adapter's extras.

        Args:
            reduce_ms (`float`): Time spent screening and reducing the candidates.
            extras (`dict[str, Any]`): The adapter's per-output extras, merged; scalar ones are reported as they are
                unless an engine metric has the same key.
            device (`torch.device`): Device whose peak memory is reported.
            weights_version (`int`): The adapter's weights version the group ran with.
        """
        finished = now_ms()
        postprocess_ms = sum(float(out.extras.get("postprocess_ms", 0.0)) for out in self.outputs)
        counters = GroupCounters(
            candidate_count=self.request.count,
            physical_forwards=self.physical_forwards,
            microbatches=self.microbatches,
            fallback_reason=self.fallback_reason,
            co_batched_groups_max=self.co_batched_max,
            num_inference_steps=self.outputs[0].extras.get("num_inference_steps"),
            retries=self.retries,
            queue_ms=self.admitted_ms - self.submitted_ms,
            encode_ms=self.encode_ms,
            denoise_ms=self.denoise_ms,
            action_postprocess_ms=postprocess_ms,
            reduce_ms=reduce_ms,
            total_ms=finished - self.submitted_ms,
            peak_memory_bytes=peak_memory_bytes(device),
            weights_version=weights_version,
        )
        steps = steps_report(self.outputs[0].extras, self.steps_fitted, self.request.deadline_s,
                             None if self.deadline_ms is None else finished <= self.deadline_ms)
        scalars = tuple((key, value) for key, value in extras.items() if key not in ("rollout", "postprocess_ms")
                        and isinstance(value, (int, float, str, type(None))))
        return counters, steps, AdapterExtras(scalars)
