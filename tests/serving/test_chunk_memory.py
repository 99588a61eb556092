"""serving/continuity.py: the chunk memory decides whether a request continues the chunk it served last, by stamps,
and drops it by rule (reset, new weights or instruction, an older observation, the chunk elapsed, a clock jump).

Pure: no node, no DDS (the node-level behaviour is tests/ros/test_node_continuity.py and test_node_trust.py).
"""

from __future__ import annotations

import pytest
import torch

from trajectory_ensemble_node.engine.context import LatencyEstimator
from trajectory_ensemble_node.errors import DelayTooLongError
from trajectory_ensemble_node.serving import continuity

H, D, DT = 8, 2, 0.125


def chunk(stamp: float = 10.0, instruction: str = "go", version: int = 0) -> continuity.ServedChunk:
    return continuity.ServedChunk(torch.arange(H * D, dtype=torch.float32).reshape(H, D), stamp, DT, instruction,
                                  version)


def decide(memory: continuity.ChunkMemory, **overrides) -> continuity.ContinuityDecision:
    kwargs = dict(continue_previous=True, reset=False, inference_delay=0, guidance="prefix", stamp=10.5,
                  instruction="go", weights_version=0)
    return memory.decide(**{**kwargs, **overrides})


def test_a_continuation_aligns_by_stamps_and_takes_the_frozen_count_from_the_goal_or_the_estimate():
    memory = continuity.ChunkMemory(LatencyEstimator(initial=0.3))
    assert decide(memory).status == continuity.NO_PREVIOUS
    memory.remember(chunk())
    from_goal = decide(memory, inference_delay=2)
    assert (from_goal.status, from_goal.delay_source) == (continuity.CONTINUED, "goal")
    assert (from_goal.context.shift, from_goal.context.frozen) == (4, 2)  # 0.5 s at dt 0.125
    estimated = decide(memory)
    assert estimated.delay_source == "estimate" and estimated.context.frozen == 3  # ceil(0.3 / 0.125)
    # An estimate past what is left of the chunk freezes what is left instead of refusing the goal.
    late = decide(memory, stamp=10.0 + 6 * DT)
    assert late.context.frozen == 2 == late.context.overlap
    # A goal's own delay is taken at its word: past the chunk's end it is a named error.
    with pytest.raises(DelayTooLongError):
        decide(memory, stamp=10.0 + 6 * DT, inference_delay=3)


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"reset": True}, continuity.RESET_REQUESTED),
    ({"weights_version": 1}, continuity.WEIGHTS_UPDATED),
    ({"instruction": "stop"}, continuity.INSTRUCTION_CHANGED),
    ({"stamp": 9.0}, continuity.OLDER_OBSERVATION),
    ({"stamp": 10.0 + H * DT}, continuity.ELAPSED),
])
def test_each_drop_rule_starts_fresh_with_its_reason_and_forgets_the_chunk(overrides, reason):
    memory = continuity.ChunkMemory()
    memory.remember(chunk())
    decision = decide(memory, **overrides)
    assert decision.context is None and decision.status == reason
    assert memory.last is None and decide(memory).status == continuity.NO_PREVIOUS


def test_not_asking_keeps_the_chunk_for_a_later_continuation():
    memory = continuity.ChunkMemory()
    memory.remember(chunk())
    assert decide(memory, continue_previous=False).status == continuity.NOT_REQUESTED
    assert decide(memory).status == continuity.CONTINUED


def test_a_clock_jump_voids_the_goals_decided_before_it_and_names_why_the_next_one_starts_fresh():
    memory = continuity.ChunkMemory(LatencyEstimator(margin=0.0))
    memory.remember(chunk())
    before = memory.epoch
    assert memory.observe_latency(0.2, epoch=before)
    assert memory.clock_jumped(backward=True)  # a simulator reset: the chunk was dropped
    assert memory.last is None and decide(memory).status == continuity.CLOCK_JUMPED_BACK
    # A goal decided before the jump and finished after it keeps neither its chunk nor its latency.
    assert not memory.remember(chunk(), epoch=before) and not memory.observe_latency(99.0, epoch=before)
    assert memory.estimator.estimate == pytest.approx(0.2)
    assert memory.remember(chunk(), epoch=memory.epoch) and decide(memory).status == continuity.CONTINUED
    # A forward jump (a seek) resets the estimate and keeps the chunk.
    assert not memory.clock_jumped(backward=False)
    assert memory.estimator.estimate is None and memory.last is not None


def test_the_frozen_count_covers_what_has_gone_since_the_stamp_plus_the_estimate():
    memory = continuity.ChunkMemory(LatencyEstimator(initial=0.1, margin=0.0))
    memory.remember(chunk())
    decision = decide(memory, elapsed_s=2 * DT)  # two rows gone at the decision, 0.1 s still to come
    assert decision.latency_s == pytest.approx(2 * DT + 0.1)
    assert decision.context.frozen == 3  # ceil(0.35 / 0.125)
    # An off-grid stamp: shift 4.5, so 3 new rows have an old action at or after their time.
    late = decide(memory, stamp=10.0 + 4.5 * DT)
    assert late.context.overlap == 3 and late.context.frozen == 1
