"""``make demo``'s PushT panel against a real node serving the tiny untrained PushT checkpoint, over DDS on sim time:
one short episode per reducer on the panel's start. What a user of the picture would check: it is drawn, both reducers
played the same start with the same seeds, each goal brought its 8 candidates, the first goal's candidates are the same
for both (same frame, same base seed), ``mean`` served their mean and ``mode`` their mode."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

pytest.importorskip("gym_pusht")

from trajectory_ensemble_lab.pusht import demo_panel
from trajectory_ensemble_node.reducers import mode_reduce

STEPS = 16
"""Two goals per episode: short, and a cap the JSON and picture must say."""


@pytest.mark.ros
@pytest.mark.slow
def test_the_panel_plays_mode_and_mean_from_the_same_candidates_and_draws_them(checkpoint, tmp_path, ros_domain_id,
                                                                               monkeypatch):
    pytest.importorskip("rclpy")
    pytest.importorskip("trajectory_ensemble_msgs")
    # One torch thread in the node (it inherits this environment): on a loaded 2-core machine two threads wait on
    # each other at every parallel region, and the tiny model's warm-up alone took 20 s instead of 1.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    lines: list[str] = []
    assert demo_panel.run(tmp_path, model=str(checkpoint), max_steps=STEPS, log=lines.append) == 0, lines
    assert os.environ["ROS_DOMAIN_ID"] == str(ros_domain_id)  # the panel's own domain does not leak into the session

    import matplotlib.image

    png = tmp_path / "pusht.png"
    image = matplotlib.image.imread(png)
    assert png.stat().st_size > 30_000 and image.shape[0] > 300 and image.shape[1] > 600
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 200  # frames and lines, not a blank canvas

    doc = json.loads((tmp_path / "pusht.json").read_text())
    assert {"date", "commit", "seed", "settings", "episodes"} <= set(doc)
    assert doc["seed"] == demo_panel.PANEL_SEED
    settings = doc["settings"]
    assert (settings["candidates"], settings["execute"], settings["fixed_delay"]) == (8, 8, 0)
    assert settings["step_budget"] == STEPS and settings["capped"] is True
    assert set(doc["episodes"]) == {"mode", "mean"}
    for method, episode in doc["episodes"].items():
        assert episode["env_seed"] == doc["seed"]
        assert episode["steps"] == len(episode["coverage"]) and (episode["steps"] == STEPS or episode["success"])
        assert episode["max_coverage"] == max(episode["coverage"])
        goals = episode["goals"]
        assert len(goals) == math.ceil(episode["steps"] / 8), method
        assert all(g["status"] == "SUCCEEDED" and g["candidate_count"] == 8 for g in goals), (method, goals)
        assert [f["goal"] for f in episode["frames"]] == [g["index"] for g in goals]  # fewer than 5: every one
        for frame in episode["frames"]:
            assert np.shape(frame["candidates"]) == (8, 16, 2) and np.shape(frame["served"]) == (16, 2)
            assert frame["step"] == 8 * frame["goal"]  # served from the frame of the step its goal went out on

    mode, mean = (doc["episodes"][m]["frames"][0] for m in ("mode", "mean"))
    assert mode["seed"] == mean["seed"]
    np.testing.assert_array_equal(mode["candidates"], mean["candidates"])
    # Env pixels, rounded to 1e-3 in the JSON; the node's mean is a float32 one.
    np.testing.assert_allclose(mean["served"], np.mean(mean["candidates"], axis=0), atol=2e-3)
    # mode served the product's mode of the same candidates. PushT's minmax scales both channels alike, so the mode of
    # env-pixel candidates is the mode of the normalized ones, mapped back. (The untrained checkpoint's candidates are
    # one isotropic cloud, whose relative-cut mode is their mean: no difference from mean is asserted.)
    expected = mode_reduce(torch.tensor(mode["candidates"], dtype=torch.float64)).numpy()
    np.testing.assert_allclose(mode["served"], expected, atol=2e-3)
