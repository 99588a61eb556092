"""Live weight updates: shard routing into fused q/k/v, strict all-or-nothing, atomic between groups."""

from __future__ import annotations

import pickle
import threading

import pytest
import torch
from _cosmos3 import FPS, PROMPT, candidate_spec, fresh_pipe, policy, upstream_action, within_rule
from safetensors.torch import save_file

from trajectory_ensemble_node.errors import WeightUpdateError
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_node.models.cosmos3.weights import unfuse_qkv_projections

STEPS = 3


def kwargs(count: int = 2, *, seed: int = 3, steps: int = STEPS, **extra):
    spec = candidate_spec(count)
    base = dict(prompt=PROMPT, action=policy(), num_inference_steps=steps, guidance_scale=1.0, fps=FPS, spec=spec,
                base_seed=seed)
    base.update(extra)
    return base


def state(model: Cosmos3ActionModel) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.pipe.transformer.state_dict().items()}


def test_unfused_names_route_into_the_fused_parameter_by_shard_id():
    model = Cosmos3ActionModel(fresh_pipe(), fuse_qkv=True)
    attn = model.pipe.transformer.layers[0].self_attn
    assert hasattr(attn, "to_qkv") and not hasattr(attn, "to_q")
    q_rows, k_rows, v_rows = attn.to_qkv.shard_sizes
    before = attn.to_qkv.weight.detach().clone()
    new_k = torch.randn(k_rows, attn.to_qkv.in_features)
    new_gen_v = torch.randn(attn.add_qkv.shard_sizes[2], attn.add_qkv.in_features)
    report = model.update_weights({
        "layers.0.self_attn.to_k.weight": new_k,
        "transformer.layers.0.self_attn.add_v_proj.weight": new_gen_v,
    })
    assert report.weights_version == 1 and report.skipped == {}
    after = attn.to_qkv.weight.detach()
    assert torch.equal(after[q_rows : q_rows + k_rows], new_k)
    assert torch.equal(after[:q_rows], before[:q_rows]) and torch.equal(after[q_rows + k_rows :],
                                                                         before[q_rows + k_rows :])
    assert torch.equal(attn.add_qkv.weight[-new_gen_v.shape[0] :], new_gen_v)
    # A fused name that arrives directly is loaded whole.
    whole = torch.randn_like(attn.to_qkv.weight)
    model.update_weights({"layers.0.self_attn.to_qkv.weight": whole})
    assert torch.equal(attn.to_qkv.weight, whole) and model.weights_version == 2


def test_fused_projections_serve_within_the_rule_and_unfuse_to_diffusers_names():
    fused = Cosmos3ActionModel(fresh_pipe(), fuse_qkv=True)
    result = fused.generate(**kwargs(2, seed=1234))
    for i, seed in enumerate(result.seeds):
        assert within_rule(result.candidates[i], upstream_action(seed, guidance_scale=1.0, steps=STEPS))
    unfuse_qkv_projections(fused.pipe.transformer)
    assert set(fused.pipe.transformer.state_dict()) == set(fresh_pipe().transformer.state_dict())


def test_strict_update_with_one_bad_name_changes_nothing():
    model = Cosmos3ActionModel(fresh_pipe())
    before = state(model)
    good = {"layers.1.mlp.up_proj.weight": torch.zeros_like(before["layers.1.mlp.up_proj.weight"])}
    for bad in ({"layers.9.mlp.up_proj.weight": torch.zeros(1)},
                {"layers.1.mlp.down_proj.weight": torch.zeros(3, 3)},
                {"layers.1.mlp.down_proj.weight": before["layers.1.mlp.down_proj.weight"].double()}):
        with pytest.raises(WeightUpdateError, match="nothing changed"):
            model.update_weights({**good, **bad})
        assert all(torch.equal(before[k], v) for k, v in model.pipe.transformer.state_dict().items())
        assert model.weights_version == 0
    report = model.update_weights({**good, "layers.9.mlp.up_proj.weight": torch.zeros(1)}, strict=False)
    assert report.applied == ["layers.1.mlp.up_proj.weight"]
    assert report.skipped == {"layers.9.mlp.up_proj.weight": "unknown parameter"}
    assert torch.equal(model.pipe.transformer.layers[1].mlp.up_proj.weight, good["layers.1.mlp.up_proj.weight"])


def test_an_update_sent_while_a_group_runs_lands_after_it():
    old_weights = Cosmos3ActionModel(fresh_pipe()).generate(**kwargs(3, steps=8))
    model = Cosmos3ActionModel(fresh_pipe())
    model.engine.start()
    try:
        started = threading.Event()
        handle = model.submit(**kwargs(3, steps=8, on_progress=lambda e: e.step >= 1 and started.set()))
        assert started.wait(60)
        update = {k: torch.zeros_like(v) for k, v in model.pipe.transformer.state_dict().items()
                  if k.endswith("mlp_moe_gen.down_proj.weight")}
        report = model.update_weights(update, timeout=120)
        running = handle.result(timeout=60)
        after = model.generate(**kwargs(3, steps=8))
    finally:
        model.engine.stop()
    assert torch.equal(running.candidates, old_weights.candidates)  # finished entirely on the old weights
    assert running.metrics["weights_version"] == 0
    assert report.weights_version == 1 and after.metrics["weights_version"] == 1
    assert not torch.equal(after.candidates, old_weights.candidates)


def test_only_safetensors_is_ever_read(tmp_path):
    model = Cosmos3ActionModel(fresh_pipe())
    tensors = {"layers.0.mlp.up_proj.weight": torch.zeros_like(model.pipe.transformer.layers[0].mlp.up_proj.weight)}
    torch.save(tensors, tmp_path / "update.pt")
    with pytest.raises(WeightUpdateError, match="safetensors"):
        model.update_weights(tmp_path / "update.pt")
    # A pickle renamed to .safetensors is still refused: it is parsed as safetensors, never unpickled.
    disguised = tmp_path / "disguised.safetensors"
    disguised.write_bytes(pickle.dumps(tensors))
    with pytest.raises(WeightUpdateError, match="not a valid safetensors"):
        model.update_weights(disguised)
    save_file(tensors, str(tmp_path / "ok.safetensors"))
    assert model.update_weights(tmp_path / "ok.safetensors").weights_version == 1
