"""Loading what a node serves: catalog.py (tiny, toy, a directory) over models/cosmos3/loading.py."""

from __future__ import annotations

import pytest
import torch

from trajectory_ensemble_node.catalog import load_pipeline, model_notice
from trajectory_ensemble_node.errors import ErrorCode, ModelLoadError, PickleWeightsError
from trajectory_ensemble_node.models.cosmos3 import resolve_device
from trajectory_ensemble_node.models.cosmos3.loading import pickle_only_files


def test_loading_refuses_pickle_only_directories_and_unknown_models(tmp_path):
    (tmp_path / "model_index.json").write_text("{}")
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "diffusion_pytorch_model.bin").write_bytes(b"x")
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "diffusion_pytorch_model.bin").write_bytes(b"x")
    (tmp_path / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(b"x")
    assert [p.parent.name for p in pickle_only_files(tmp_path)] == ["transformer"]
    with pytest.raises(PickleWeightsError, match="transformer/diffusion_pytorch_model.bin") as info:
        load_pipeline(str(tmp_path), "cpu")
    assert info.value.code == ErrorCode.MODEL_LOAD_FAILED
    with pytest.raises(ModelLoadError, match="neither 'tiny', 'toy' nor an existing directory"):
        load_pipeline(str(tmp_path / "nope"), "cpu")
    with pytest.raises(ModelLoadError, match="model_index.json"):
        load_pipeline(str(tmp_path / "vae"), "cpu")
    with pytest.raises(ModelLoadError, match="dtype"):
        load_pipeline("tiny", "cpu", "float64")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert model_notice("tiny") == "untrained demo weights"


def test_toy_loads_with_its_notice_once_its_weights_are_installed():
    from trajectory_ensemble_node.toy import TOY_NOTICE, toy_pipeline_dir

    if not (toy_pipeline_dir() / "model_index.json").is_file():
        with pytest.raises(ModelLoadError, match="train-toy"):
            load_pipeline("toy", "cpu")
        return
    pipe, notice = load_pipeline("toy", "cpu")
    assert notice == TOY_NOTICE and model_notice("toy") == TOY_NOTICE
    assert pipe.transformer.dtype == torch.float32


def test_tiny_loads_with_its_notice_and_a_saved_copy_loads_from_its_directory(tmp_path):
    pipe, notice = load_pipeline("tiny", "cpu", "float32", seed=3)
    assert notice == "untrained demo weights"
    pipe.save_pretrained(str(tmp_path), safe_serialization=True)
    loaded, notice = load_pipeline(str(tmp_path), "cpu")
    assert notice == f"weights from {tmp_path}"
    for (name, a), (_, b) in zip(pipe.transformer.state_dict().items(), loaded.transformer.state_dict().items()):
        assert torch.equal(a, b), name
