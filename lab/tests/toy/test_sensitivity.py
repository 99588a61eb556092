"""The latent-sensitivity probe: at vanishing noise every flow model's clean prediction is its own latent, so the
probe must read 1 on the diagonal and 0 elsewhere; the prefix-speed probe reads 1 on a frozen action; bad arguments
are refused with their values."""

from __future__ import annotations

import pytest
import torch

from trajectory_ensemble_node.toy import load_toy_pipeline
from trajectory_ensemble_lab.toy.data import build_dataset
from trajectory_ensemble_lab.toy.sensitivity import first_switch_spread, latent_sensitivity, prefix_speed_gain


@pytest.fixture(scope="module")
def setup():
    pipe = load_toy_pipeline()
    return pipe, build_dataset(pipe, 1, mid_probability=0.0, log=lambda message: None)


def test_at_vanishing_noise_the_clean_prediction_is_the_latent(setup):
    table = latent_sensitivity(*setup, target=2, sources=(1, 2), sigmas=(1e-3,))
    assert table["2"]["0.001"] == pytest.approx(1.0, abs=0.05)
    assert abs(table["1"]["0.001"]) < 0.01


def test_at_mid_noise_the_result_is_finite_and_labelled_per_source_and_sigma(setup):
    table = latent_sensitivity(*setup, target=3, sources=(0, 3), sigmas=(0.5, 0.2), examples=[0])
    assert set(table) == {"0", "3"} and set(table["3"]) == {"0.5", "0.2"}
    assert all(torch.isfinite(torch.tensor(list(row.values()))).all() for row in table.values())


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"target": 8}, "target 8 and sources"),
    ({"sources": (-1,)}, r"sources \[-1\]"),
    ({"sigmas": (1.0,)}, r"sigmas in \(0, 1\), got 0.05 and \[1.0\]"),
    ({"delta": 0.0}, "delta must be > 0"),
])
def test_bad_arguments_are_refused_with_their_values(setup, kwargs, message):
    with pytest.raises(ValueError, match=message):
        latent_sensitivity(*setup, **kwargs)


@pytest.mark.parametrize("guidance", ["prefix", "mask"])
def test_a_frozen_action_carries_the_whole_prefix_speed(setup, guidance):
    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
    from trajectory_ensemble_node.toy import task

    model = Cosmos3ActionModel(setup[0])
    # Action 2 inside a frozen prefix of 3 equals the previous chunk, so it moves exactly as the retimed expert.
    gains = prefix_speed_gain(model, task.heldout_scenes(1), guidance=guidance, frozen=3, target=2, count=2, steps=2)
    assert gains == [pytest.approx(1.0, abs=1e-3)]
    with pytest.raises(ValueError, match=r"factors must differ, got \(1.0, 1.0\)"):
        prefix_speed_gain(model, task.heldout_scenes(1), factors=(1.0, 1.0))


def test_first_switch_spread_splits_the_distance_into_a_shared_bias_and_a_spread(setup):
    import math

    from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
    from trajectory_ensemble_node.toy import task

    table = first_switch_spread(Cosmos3ActionModel(setup[0]), task.heldout_scenes(2), count=3, steps=2)
    assert set(table) == {"prefix", "none"}
    for row in (r for guidance in table.values() for r in guidance["per_scene"]):
        # The mean of the candidates is no farther than they are on average, which is no farther than the RMS
        # distance sqrt(bias^2 + spread^2); the nearest one is no farther than the average.
        assert row["min_distance"] <= row["mean_distance"] + 1e-6
        assert row["bias"] <= row["mean_distance"] + 1e-6
        assert row["mean_distance"] <= math.hypot(row["bias"], row["spread"]) + 1e-6
    assert [r["scene"] for r in table["prefix"]["per_scene"]] == [s.seed for s in task.heldout_scenes(2)]
