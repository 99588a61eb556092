"""One closed-loop PushT episode of one method, as ``bench --pusht`` records it (in process, over the wire or
through the node)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchEpisode:
    """One closed-loop episode of one method.

    Args:
        env_seed (`int`): gym-pusht reset seed.
        steps (`int`): Control steps taken.
        max_coverage (`float`): Highest ``info["coverage"]``.
        success (`bool`): ``info["is_success"]`` at some step.
        seams (`list[float]`): Seam jumps at chunk take-overs (env pixels).
        group_ms (`list[float]`): Wall time of each request.
        actions (`list[list[float]]`): The executed targets ``[steps, 2]`` (env pixels).
    """

    env_seed: int
    steps: int = 0
    max_coverage: float = 0.0
    success: bool = False
    seams: list[float] = field(default_factory=list)
    group_ms: list[float] = field(default_factory=list)
    actions: list[list[float]] = field(default_factory=list)
