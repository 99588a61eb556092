"""Off-grid stamps through the engine and the tiny Cosmos 3 model (issue 36).

A new observation stamped 1.5 ``dt`` after the previous chunk's: new row ``k`` is at the time of previous position
``k + 1.5``. The frozen actions of every guided candidate must equal the previous chunk interpolated there (within
1e-4, normalized units), not the row that ``round(1.5)`` would pick, half a ``dt`` away.
"""

from __future__ import annotations

import pytest
import torch
from _cosmos3 import FPS, PROMPT, STEPS, fresh_pipe, policy

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine.context import ExecutionContext
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel

DT = 1 / FPS
FROZEN = 2
SHIFT = 1.5


@pytest.fixture(scope="module")
def model() -> Cosmos3ActionModel:
    return Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8)


def generate(model, count, *, context=None, guidance_scale=1.0, seed=99):
    spec = CandidateTrajectorySpec(count=count, reducer="mean" if count > 1 else "none", return_candidates=True)
    return model.generate(prompt=PROMPT, action=policy(seed=2), num_inference_steps=STEPS,
                          guidance_scale=guidance_scale, fps=FPS, spec=spec, base_seed=seed, context=context)


@pytest.fixture(scope="module")
def previous(model) -> torch.Tensor:
    return generate(model, 1, seed=7).action


@pytest.mark.parametrize("guidance_scale", [1.0, 3.0], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize("guidance", ["prefix", "mask"])
def test_frozen_actions_equal_the_previous_chunk_interpolated_at_the_new_rows_times(model, previous, guidance,
                                                                                  guidance_scale):
    context = ExecutionContext(previous, 100.0, DT, FROZEN, 100.0 + SHIFT * DT, guidance=guidance)
    assert context.offset == pytest.approx(SHIFT)
    # Rows 0 and 1 are at previous positions 1.5 and 2.5: halfway between rows 1-2 and 2-3.
    expected = 0.5 * (previous[1:3] + previous[2:4])
    rounded = previous[2:4]  # what the rounded shift of 2 read
    assert (expected - rounded).abs().max() > 1e-3, "the test needs an old chunk that moves between rows"
    result = generate(model, 4, context=context, guidance_scale=guidance_scale)
    for i, candidate in enumerate(result.candidates):
        error = (candidate[:FROZEN] - expected).abs().max().item()
        assert error <= 1e-4, f"candidate {i}: frozen actions off the interpolated chunk by {error}"
    assert result.metrics["context_offset"] == pytest.approx(SHIFT)
