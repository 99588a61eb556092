"""step_capture: the decoder stack captured once per shape and replayed (``models/cosmos3/capture.py``).

CUDA graphs cannot run here, so the shared machinery (shape keys, static buffers, the prefix keys/values refilled per
group, the cancel check before a replay) is exercised through ``compile`` on CPU, which uses the same entries.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _cosmos3 import FPS, PROMPT, fresh_pipe, policy, upstream_action, within_rule

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.errors import GroupCanceledError, InvalidSpecError
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_node.models.cosmos3 import capture as capture_module
from trajectory_ensemble_node.models.cosmos3.capture import StepCaptureError

STEPS = 3
GUIDANCE = 3.0


def kwargs(count: int, *, seed: int = 7, steps: int = STEPS, **extra):
    spec = CandidateTrajectorySpec(count=count, reducer="none" if count == 1 else "mean", return_candidates=True)
    return dict(prompt=PROMPT, action=policy(), num_inference_steps=steps, guidance_scale=GUIDANCE, fps=FPS,
                spec=spec, base_seed=seed, **extra)


@pytest.fixture(scope="module")
def model():
    # Fused CFG and whole layers: one shape key per N, so each N compiles once (inductor on 2 cores takes ~20 s
    # CPU time per key for the tiny model).
    return Cosmos3ActionModel(fresh_pipe(), cfg_mode="fused", row_block_rows=None, step_capture="compile")


def cold(model: Cosmos3ActionModel) -> None:
    """Forget retained text prefixes, so the next group computes its prefix at step 0 (as after a start)."""
    model.adapter.prefix_cache.clear()


@pytest.mark.slow
@pytest.mark.parametrize("count", [1, 8])
def test_compiled_candidates_are_within_the_rule_of_eager_and_upstream(model, count):
    with torch.no_grad():
        eager = model.generate(**kwargs(count, step_capture="off"))
        compiled = model.generate(**kwargs(count))
    assert compiled.seeds == eager.seeds
    assert model.adapter.step_capture.stats()["replays"] > 0
    for index, seed in enumerate(compiled.seeds):
        reference = upstream_action(seed, guidance_scale=GUIDANCE, steps=STEPS)
        assert within_rule(compiled.candidates[index], reference)
        assert within_rule(compiled.candidates[index], eager.candidates[index])


def replays(model: Cosmos3ActionModel) -> dict[tuple, tuple[int, int]]:
    """Per shape key: (forwards replayed, times the prefix keys/values were copied in)."""
    return {key: (e.replays, e.kv_refills) for key, e in model.adapter.step_capture.entries.items()}


def grew(before: dict, after: dict) -> dict[tuple, tuple[int, int]]:
    """The keys whose counters moved, with how much."""
    zero = (0, 0)
    return {k: (v[0] - before.get(k, zero)[0], v[1] - before.get(k, zero)[1])
            for k, v in after.items() if v != before.get(k, zero)}


@pytest.mark.slow
def test_a_shape_is_captured_once_and_replayed_for_every_later_step_and_group(model):
    # N=1 with fused CFG: the same shape key as the parity test's N=1, so this compiles nothing new after it.
    stats = model.adapter.step_capture
    cold(model)
    before, eager = replays(model), stats.eager_forwards
    with torch.no_grad():
        model.generate(**kwargs(1, seed=1))
    # A new instruction computes its prefix at step 0, eagerly, into the cache; steps 1.. replay ONE entry, whose
    # static prefix keys/values are copied in once.
    (key, moved), = grew(before, replays(model)).items()
    assert stats.eager_forwards == eager + 1 and moved == (STEPS - 1, 1)
    captures = stats.captures

    # Same N, a new group with the prefix retained: no new capture, every step replayed, and the prefix keys/values
    # are not copied again (the cache hands out the same tensors).
    before = replays(model)
    with torch.no_grad():
        model.generate(**kwargs(1, seed=2))
    assert grew(before, replays(model)) == {key: (STEPS, 0)}
    assert stats.captures == captures and stats.eager_forwards == eager + 1

    # Cold again: new prefix tensors, so the static keys/values are refilled once for the group.
    cold(model)
    before = replays(model)
    with torch.no_grad():
        model.generate(**kwargs(1, seed=3))
    assert grew(before, replays(model)) == {key: (STEPS - 1, 1)}
    assert stats.captures == captures and stats.eager_forwards == eager + 2


@pytest.mark.slow
def test_cancel_lands_within_one_step_with_capture_on(model):
    steps_seen: list[int] = []
    holder: dict = {}
    replays_before = model.adapter.step_capture.stats()["replays"]

    def on_progress(event):
        if event.stage == "denoising":
            steps_seen.append(event.step)
            if event.step == 2:
                holder["handle"].cancel()

    with torch.no_grad():
        holder["handle"] = model.submit(**kwargs(1, seed=5, steps=8, on_progress=on_progress))
        model.run_until_idle()
    with pytest.raises(GroupCanceledError):
        holder["handle"].result()
    assert steps_seen == [1, 2]
    assert model.adapter.step_capture.stats()["replays"] > replays_before


def test_upstream_calls_and_copies_of_a_captured_transformer_run_the_stock_stack(model):
    with torch.no_grad(), model.adapter.step_capture.active("compile"):
        pass  # installs the hook, as the first captured forward does
    transformer = model.pipe.transformer
    assert capture_module._CAPTURES.get(transformer) is model.adapter.step_capture
    # Outside the adapter's forwards nothing is captured: an upstream call on the same pipeline is bitwise upstream.
    same_pipe = upstream_action(11, guidance_scale=GUIDANCE, pipe=model.pipe, key=("capture-hooked",))
    assert torch.equal(same_pipe, upstream_action(11, guidance_scale=GUIDANCE))
    duplicate = copy.deepcopy(transformer)
    assert duplicate._run_decoder_stack.__self__ is duplicate
    assert capture_module._CAPTURES.get(duplicate) is None


def test_cuda_graphs_on_a_cpu_model_are_refused_by_name(model):
    with pytest.raises(StepCaptureError, match="'cuda_graph' needs a CUDA device.*'cpu'"):
        Cosmos3ActionModel(model.pipe, step_capture="cuda_graph")
    with pytest.raises(StepCaptureError, match="'cuda_graph'"):
        model.make_request(**kwargs(1, step_capture="cuda_graph"))
    with pytest.raises(InvalidSpecError, match="'graphs'"):
        model.make_request(**kwargs(1, step_capture="graphs"))
    with pytest.raises(InvalidSpecError, match="'always'"):
        Cosmos3ActionModel(model.pipe, step_capture="always")
