"""The robot's state as a conditioning latent frame (issue 58), on a tiny state-taking pipeline built in-process.

A checkpoint that declares a state input (``models/cosmos3/state.py``) gets one clean latent frame built from the
normalized state, tiled, once per group; every candidate conditions on it. What a user checks: the state changes the
candidates, the same inputs give the same bits, the frame is built once whatever N is, a bad state is refused by a
named error before any model work, and a model without a declaration is served exactly as before (the upstream
parity tests in ``test_cosmos3_parity.py`` run unchanged).
"""

from __future__ import annotations

import json

import pytest
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

from _cosmos3 import CHUNK, FPS, PROMPT, STEPS, candidate_spec, fresh_pipe, image, policy
from trajectory_ensemble_node.catalog import load_pipeline
from trajectory_ensemble_node.errors import (
    ErrorCode,
    InvalidSpecError,
    MissingObservationKeyError,
    NonFiniteStateError,
    ObservationArrayError,
    StatsFileError,
    UnsupportedModeError,
)
from trajectory_ensemble_node.models.cosmos3 import (
    STATE_FRAME_INDEX,
    Cosmos3ActionModel,
    Cosmos3Adapter,
    StateInput,
    build_state_frame,
    encode_conditioning,
    read_state_input,
    write_state_input,
)
from trajectory_ensemble_node.models.cosmos3 import conditioning as conditioning_module
from trajectory_ensemble_node.normalization import ActionNormalizer

NAMES = ("shoulder", "elbow", "gripper")
LOW, HIGH = [-1.0, 0.0, 0.0], [1.0, 2.0, 0.08]
STATE = [0.25, 1.5, 0.04]
OTHER = [-0.75, 0.2, 0.01]
BASE_SEED = 11


def state_input(domain: str | None = "droid_lerobot") -> StateInput:
    return StateInput.from_stats(NAMES, "minmax", {"min": LOW, "max": HIGH}, domain=domain)


def state_model(**kwargs) -> Cosmos3ActionModel:
    return Cosmos3ActionModel(fresh_pipe(), state_input=state_input(), max_batch_candidates=8, **kwargs)


@pytest.fixture(scope="module")
def model() -> Cosmos3ActionModel:
    return state_model()


def run(model: Cosmos3ActionModel, count: int, state=STATE, **kwargs):
    defaults = dict(prompt=PROMPT, action=policy(), num_inference_steps=STEPS, fps=FPS, guidance_scale=3.0,
                    base_seed=BASE_SEED, spec=candidate_spec(count))
    defaults.update(kwargs)
    return model.generate(state=state, **defaults)


def test_a_declared_state_makes_the_model_take_state_by_name():
    model = state_model()
    capabilities = model.adapter.capabilities
    assert capabilities.uses_state and capabilities.state_names == NAMES
    assert "state latent frame" in capabilities.candidate_invariant
    assert model.state_input.names == NAMES and model.state_input.width == 3
    # The class declaration is a checkpoint's without state; only this instance takes one.
    assert not Cosmos3Adapter.capabilities.uses_state and Cosmos3Adapter.capabilities.state_names == ()


def test_the_state_changes_the_candidates_and_the_same_inputs_give_the_same_bits(model):
    first = run(model, 4)
    again = run(model, 4)
    other = run(model, 4, state=OTHER)
    assert torch.equal(first.candidates, again.candidates) and torch.equal(first.action, again.action)
    assert first.seeds == other.seeds
    for i in range(4):
        assert not torch.equal(first.candidates[i], other.candidates[i])
    assert (first.candidates - other.candidates).abs().max() > 1e-3
    # A lone candidate is one of the group's: candidate 0 of N=4 has seed 0's stream, as count=1 does.
    single = run(model, 1)
    assert torch.allclose(single.candidates[0], first.candidates[0], atol=1e-3 * max(1.0, first.candidates.abs().max()))


@pytest.mark.parametrize("count, max_batch", [(1, 8), (8, 8), (8, 3)])
def test_the_state_frame_is_built_once_per_group_whatever_n(monkeypatch, count, max_batch):
    built = []
    original = conditioning_module.build_state_frame

    def counting(*args, **kwargs):
        built.append(args[0].clone())
        return original(*args, **kwargs)

    monkeypatch.setattr(conditioning_module, "build_state_frame", counting)
    model = state_model() if max_batch == 8 else Cosmos3ActionModel(fresh_pipe(), state_input=state_input(),
                                                                    max_batch_candidates=max_batch)
    result = run(model, count)
    assert len(built) == 1, f"{len(built)} state frames for one group of {count}"
    assert result.metrics["candidate_count"] == count
    # Never a forward per candidate: one fused forward per step when the group fits one batch.
    if count <= max_batch:
        assert result.metrics["physical_forwards"] == STEPS * (1 if count > 1 else 2)
    else:
        assert result.metrics["microbatches"] == 3
    expected = torch.tensor([(s - lo) / (hi - lo) * 2 - 1 for s, lo, hi in zip(STATE, LOW, HIGH)])
    assert torch.allclose(built[0], expected)


def test_the_state_frame_is_latent_frame_1_tiled_and_conditioned_with_the_same_token_layout():
    pipe = fresh_pipe()
    kwargs = dict(prompt=PROMPT, negative_prompt=None, action=policy(), fps=FPS, guidance_scale=1.0,
                  device=torch.device("cpu"))
    plain = encode_conditioning(pipe, **kwargs)
    with_state = encode_conditioning(pipe, **kwargs, state_input=state_input(), state=STATE)
    x0 = with_state.x0_vision
    assert STATE_FRAME_INDEX == 1 and x0.shape == plain.x0_vision.shape and x0.shape[2] == 3
    normalized, clipped = state_input().normalize(STATE)
    assert clipped == 0 and plain.state_clipped is None
    frame = x0[0, :, 1]
    assert torch.equal(frame, build_state_frame(normalized, *frame.shape))
    # Tiled in C-major order: flat element k holds state[k % 3].
    assert torch.equal(frame.flatten(), normalized.repeat(frame.numel() // 3 + 1)[: frame.numel()])
    assert torch.equal(x0[:, :, 0], plain.x0_vision[:, :, 0]) and torch.equal(x0[:, :, 2], plain.x0_vision[:, :, 2])
    assert with_state.vision_mask.flatten().tolist() == [1.0, 1.0, 0.0]
    assert plain.vision_mask.flatten().tolist() == [1.0, 0.0, 0.0]
    template, plain_template = with_state.branches[0].template, plain.branches[0].template
    assert template.vision_token_shape == plain_template.vision_token_shape
    assert template.vision_noisy_frame_indexes.tolist() == [2]
    assert plain_template.vision_noisy_frame_indexes.tolist() == [1, 2]
    assert torch.equal(template.vision_mrope_ids, plain_template.vision_mrope_ids)
    assert with_state.branches[0].prefix.input_ids.tolist() == plain.branches[0].prefix.input_ids.tolist()


def test_a_state_outside_the_statistics_is_clipped_to_their_range_and_counted(model):
    at_edge = run(model, 2, state=[1.0, 2.0, 0.04])
    beyond = run(model, 2, state=[3.0, 9.0, 0.04])
    assert torch.equal(at_edge.candidates, beyond.candidates)
    assert at_edge.metrics["state_clipped"] == 0 and beyond.metrics["state_clipped"] == 2


@pytest.mark.parametrize("state, error, code, words", [
    (None, MissingObservationKeyError, ErrorCode.OBSERVATION_SCHEMA, "takes the robot's state (3 values"),
    ([0.1, 0.2], ObservationArrayError, ErrorCode.OBSERVATION_SCHEMA, "shape [3]"),
    ([0.1, 0.2, 0.3, 0.4], ObservationArrayError, ErrorCode.OBSERVATION_SCHEMA, "got shape [4]"),
    ([[0.1, 0.2, 0.3]], ObservationArrayError, ErrorCode.OBSERVATION_SCHEMA, "got shape [1, 3]"),
    (["a", "b", "c"], ObservationArrayError, ErrorCode.OBSERVATION_SCHEMA, "must be 3 numbers"),
    ([0.1, float("nan"), 0.3], NonFiniteStateError, ErrorCode.NON_FINITE_STATE, "['elbow']"),
    ([float("inf"), 0.2, float("-inf")], NonFiniteStateError, ErrorCode.NON_FINITE_STATE, "['shoulder', 'gripper']"),
])
def test_a_missing_malformed_or_non_finite_state_is_refused_by_name_before_any_model_work(model, state, error, code,
                                                                                          words):
    before = model.outcome_counts()
    with pytest.raises(error) as info:
        run(model, 4, state=state)
    assert info.value.code == code and words in str(info.value)
    assert model.outcome_counts() == before  # refused at make_request: nothing was queued


def test_a_named_state_is_picked_in_the_declared_order_whatever_the_message_order():
    declared = state_input()
    shuffled = ["wrist", "gripper", "shoulder", "elbow"]
    assert declared.pick(shuffled, [9.0, 0.04, 0.25, 1.5]) == (0.25, 1.5, 0.04)
    with pytest.raises(MissingObservationKeyError, match=r"has no \['elbow'\]") as info:
        declared.pick(["gripper", "shoulder"], [0.04, 0.25])
    assert info.value.code == ErrorCode.OBSERVATION_SCHEMA
    with pytest.raises(NonFiniteStateError, match=r"\['gripper'\]"):
        declared.pick(shuffled, [9.0, float("nan"), 0.25, 1.5])
    with pytest.raises(ObservationArrayError, match="one value per name"):
        declared.pick(shuffled, [1.0])
    with pytest.raises(ObservationArrayError, match=r"\['elbow'\] more than once"):
        declared.pick(["elbow", "gripper", "shoulder", "elbow"], [1.0, 0.0, 0.0, 1.0])


def test_the_state_frame_extends_policy_mode_only_and_needs_a_second_latent_frame(model):
    with pytest.raises(InvalidSpecError, match="needs latent frame 1"):
        run(model, 2, action=policy(chunk=2))
    clip = [image(1)] * (CHUNK + 1)
    inverse = CosmosActionCondition(mode="inverse_dynamics", chunk_size=CHUNK, domain_name="droid_lerobot",
                                    resolution_tier=256, video=clip)
    with pytest.raises(UnsupportedModeError, match="policy mode only"):
        run(model, 2, action=inverse)


def test_a_model_without_a_state_input_ignores_a_state_bitwise():
    plain = Cosmos3ActionModel(fresh_pipe(), max_batch_candidates=8)
    assert not plain.adapter.capabilities.uses_state and plain.state_input is None
    without = run(plain, 3, state=None)
    ignored = run(plain, 3, state=[float("nan"), 1.0])  # not checked, not fed
    assert torch.equal(without.candidates, ignored.candidates)
    assert "state_clipped" not in without.metrics and "state_clipped" not in ignored.metrics


def test_a_checkpoint_declares_its_state_in_its_action_stats_and_loads_taking_it(tmp_path):
    pipe = fresh_pipe()
    pipe.save_pretrained(tmp_path, safe_serialization=True)
    assert read_state_input(tmp_path) is None
    # Its action statistics, as the node reads them; a state entry without names is statistics only.
    stats = {"droid_lerobot": {"action": {"q01": [-1.0] * 10, "q99": [1.0] * 10},
                               "state": {"min": LOW, "max": HIGH}}}
    (tmp_path / "action_stats.json").write_text(json.dumps(stats))
    assert read_state_input(tmp_path) is None
    loaded, _ = load_pipeline(str(tmp_path), "cpu", "float32")
    assert Cosmos3ActionModel(loaded).state_input is None

    write_state_input(tmp_path, state_input())
    written = json.loads((tmp_path / "action_stats.json").read_text())
    assert written["droid_lerobot"]["action"] == stats["droid_lerobot"]["action"]
    assert written["droid_lerobot"]["state"] == {"names": list(NAMES), "method": "minmax", "min": LOW, "max": HIGH}
    # The node's action statistics read the same file as before: the state entry sits beside them.
    actions = ActionNormalizer.from_json(tmp_path / "action_stats.json", "quantile", 10, domain="droid_lerobot")
    assert actions.stats["q99"].tolist() == [1.0] * 10
    declared = read_state_input(tmp_path)
    assert declared.names == NAMES and declared.domain == "droid_lerobot"
    loaded, _ = load_pipeline(str(tmp_path), "cpu", "float32")
    served = Cosmos3ActionModel(loaded, max_batch_candidates=8)
    assert served.adapter.capabilities.state_names == NAMES
    # The loaded checkpoint serves what the in-process declaration serves, bit for bit.
    assert torch.equal(run(served, 3).candidates, run(state_model(), 3).candidates)
    with pytest.raises(MissingObservationKeyError):
        run(served, 3, state=None)


@pytest.mark.parametrize("entry, words", [
    ({"names": ["a", "b"], "method": "meanstd", "mean": [0, 0], "std": [1, 1]}, "state method must be one of"),
    ({"names": ["a", "b"], "method": "minmax", "min": [0, 0, 0], "max": [1, 1, 1]}, "has 3 channels"),
    ({"names": ["a", "a"], "method": "minmax", "min": [0, 0], "max": [1, 1]}, "unique"),
    ({"names": "ab", "method": "minmax", "min": [0, 0], "max": [1, 1]}, "list of strings"),
    ({"names": ["a", "b"], "method": "minmax", "min": [0, 1], "max": [1, 1]}, "max > min"),
    ({"names": ["a", "b"], "min": [0, 0], "max": [1, 1]}, "state method must be one of"),
])
def test_a_malformed_state_declaration_refuses_the_checkpoint_by_name(tmp_path, entry, words):
    (tmp_path / "action_stats.json").write_text(json.dumps({"pusht": {"state": entry}}))
    with pytest.raises(StatsFileError) as info:
        read_state_input(tmp_path)
    assert info.value.code == ErrorCode.STATS_FILE_INVALID and words in str(info.value)


def test_two_declarations_or_a_broken_file_are_refused(tmp_path):
    entry = {"names": ["a"], "method": "minmax", "min": [0], "max": [1]}
    (tmp_path / "action_stats.json").write_text(json.dumps({"state": entry, "pusht": {"state": entry}}))
    with pytest.raises(StatsFileError, match=r"declares \['state', 'pusht.state'\]"):
        read_state_input(tmp_path)
    (tmp_path / "action_stats.json").write_text("{not json")
    with pytest.raises(StatsFileError, match="cannot read"):
        read_state_input(tmp_path)
    (tmp_path / "action_stats.json").write_text(json.dumps({"state": entry}))
    assert read_state_input(tmp_path).domain is None


def test_the_frame_builder_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit a latent frame of 4 elements"):
        build_state_frame(torch.zeros(5), 1, 2, 2)
    with pytest.raises(ValueError, match="non-empty vector"):
        build_state_frame(torch.zeros(0), 1, 2, 2)
    assert build_state_frame(torch.tensor([1.0, 2.0, 3.0]), 2, 1, 2).flatten().tolist() == [1, 2, 3, 1]
