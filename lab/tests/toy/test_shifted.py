"""The shifted scene family that ``trajectory-ensemble calibrate``'s toy-scene mode scores against the training scenes
(``trajectory_ensemble_lab/toy/shifted.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from trajectory_ensemble_lab.toy.shifted import FAMILIES, make_shifted_scene, render_shifted, shifted_scenes
from trajectory_ensemble_node.toy import task


def test_shifted_scenes_are_deterministic_and_differ_from_training_images():
    for family in FAMILIES:
        a, b = make_shifted_scene(2_000_007, family), make_shifted_scene(2_000_007, family)
        assert np.array_equal(render_shifted(a), render_shifted(b))
        plain = task.render(task.make_scene(2_000_007))
        assert not np.array_equal(render_shifted(a), plain)
    two = shifted_scenes(5, family="two_obstacles")
    assert all(len(s.extra_obstacles) == 1 for s in two)
    with pytest.raises(ValueError, match="'three'"):
        make_shifted_scene(1, "three")
