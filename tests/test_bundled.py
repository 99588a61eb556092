"""The bundled policies by name (``model: toy``, ``model: pusht``): where they load from, the settings they were
trained with, and the action statistics a PushT policy carries (issue 47, the second bundled model).

The weights under test are a tiny random pipeline saved where the bundle looks (``bundled.ASSETS`` patched), so these
tests hold whether or not the trained PushT weights are installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

from trajectory_ensemble_node import bundled, catalog
from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.errors import ModelLoadError
from trajectory_ensemble_node.models.cosmos3 import build_pipeline
from trajectory_ensemble_node.serving import model_factory
from trajectory_ensemble_node.serving.params import validate
from trajectory_ensemble_node.serving.startup_checks import bundled_settings_mismatch, load_action_stats

PUSHT_PARAMS = {"model": "pusht", **bundled.PUSHT_SETTINGS}


@pytest.fixture
def assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(bundled, "ASSETS", tmp_path)
    return tmp_path


def _install_pusht(assets: Path) -> Path:
    directory = assets / "pusht_policy"
    build_pipeline("tiny", seed=3).save_pretrained(directory, safe_serialization=True)
    (directory / "action_stats.json").write_text(json.dumps(
        {"pusht": {"action": {"min": [0.0, 0.0], "max": [512.0, 512.0]}}}))
    return directory


def test_pusht_is_a_model_name_that_needs_no_path() -> None:
    assert catalog.EMBEDDED_MODELS == ("tiny", "toy", "pusht")
    assert catalog.model_notice("pusht") == bundled.bundled_policy("pusht").notice
    assert bundled.bundled_policy("/models/cosmos3") is None and bundled.bundled_policy("tiny") is None


def test_absent_pusht_weights_are_a_named_load_error_that_says_how_to_build_them(assets: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"model 'pusht'.*not installed.*train-pusht"):
        catalog.load_pipeline("pusht", "cpu")


def test_the_pusht_bundle_loads_and_serves_in_env_pixels_with_its_own_statistics(assets: Path) -> None:
    _install_pusht(assets)
    pipe, notice = catalog.load_pipeline("pusht", "cpu")
    assert notice == bundled.bundled_policy("pusht").notice and pipe.transformer is not None
    params = validate(PUSHT_PARAMS)
    assert bundled.default_stats(params) == (str(assets / "pusht_policy" / "action_stats.json"), "minmax")
    normalizer = load_action_stats(params)
    # minmax over [0, 512]: the normalized corners are the env's corners.
    corners = normalizer.denormalize(torch.tensor([[-1.0, -1.0], [1.0, 1.0]]))
    np.testing.assert_allclose(corners.numpy(), [[0.0, 0.0], [512.0, 512.0]], atol=1e-4)
    # The same weights with identity statistics give the normalized actions the bundled ones map to pixels.
    identity = assets / "identity.json"
    identity.write_text(json.dumps({"action": {"min": [-1.0, -1.0], "max": [1.0, 1.0]}}))
    pixels = _serve(params)
    normalized = _serve(validate({**PUSHT_PARAMS, "action_stats_file": str(identity), "action_stats_method": "minmax"}))
    assert tuple(pixels.shape) == (16, 2)
    torch.testing.assert_close(pixels, (normalized + 1.0) * 256.0, atol=1e-3, rtol=0)


def _serve(params) -> torch.Tensor:
    model = model_factory.build_model(params)
    try:
        return model.generate(
            prompt=params.instruction, num_inference_steps=2, guidance_scale=1.0, fps=params.fps, base_seed=7,
            action=CosmosActionCondition(mode="policy", chunk_size=16, domain_name="pusht", resolution_tier=256,
                                         image=np.zeros((96, 96, 3), np.uint8)),
            spec=CandidateTrajectorySpec(count=2, reducer="mode")).action
    finally:
        model.stop(1.0)


def test_an_explicit_statistics_file_wins_over_the_bundles(assets: Path, tmp_path: Path) -> None:
    _install_pusht(assets)
    own = tmp_path / "own.json"
    own.write_text(json.dumps({"action": {"mean": [1.0, 2.0], "std": [3.0, 4.0]}}))
    params = validate({**PUSHT_PARAMS, "action_stats_file": str(own), "action_stats_method": "meanstd"})
    assert bundled.default_stats(params) is None
    np.testing.assert_allclose(load_action_stats(params).denormalize(torch.zeros(1, 2)).numpy(), [[1.0, 2.0]])


def test_only_a_bundled_policy_that_acts_in_pixels_brings_statistics() -> None:
    assert bundled.default_stats(validate({"model": "toy"})) is None
    assert bundled.default_stats(validate({"model": "tiny"})) is None
    assert load_action_stats(validate({"model": "tiny"})) is None


def test_settings_that_differ_from_the_pusht_training_are_named_with_both_values() -> None:
    assert bundled_settings_mismatch(validate(PUSHT_PARAMS)) is None
    message = bundled_settings_mismatch(validate({**PUSHT_PARAMS, "chunk_size": 8, "fps": 15.0}))
    assert message == ("the pusht policy was trained with chunk_size: 16, fps: 10.0; these parameters say "
                       "chunk_size: 8, fps: 15.0")
    # The toy's check is the same rule, under its old name too.
    assert bundled_settings_mismatch(validate({"model": "toy"})) is None
    assert "the toy policy was trained with chunk_size: 8" in bundled_settings_mismatch(
        validate({"model": "toy", "chunk_size": 16}))
