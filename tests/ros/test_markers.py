"""``ros/markers.py``: the MarkerArray of one goal, point for point, colour for colour."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("visualization_msgs")

from builtin_interfaces.msg import Time  # noqa: E402
from visualization_msgs.msg import Marker  # noqa: E402

from trajectory_ensemble_node.ros.markers import (  # noqa: E402
    CLUSTER_COLORS,
    INVALID_COLOR,
    NAMESPACE,
    SERVED_ID,
    build_markers,
    cluster_labels,
)


def _xyz(marker: Marker) -> np.ndarray:
    return np.array([[p.x, p.y, p.z] for p in marker.points])


def test_every_candidate_and_the_served_trajectory_become_strips_on_the_chosen_channels():
    rng = np.random.default_rng(0)
    candidates = rng.normal(size=(4, 8, 3))
    trajectory = candidates[1] * 0.5
    candidates[3, 2] = np.nan  # a dropped candidate
    labels = cluster_labels(4, [(0, 1), (2,)])  # candidate 3 was dropped: no cluster
    array = build_markers(trajectory, candidates, [True, True, True, False], labels, channels=(2, 0),
                          frame_id="world", stamp=Time(sec=5, nanosec=7), lifetime_s=1.5)
    first, *strips = array.markers
    assert first.action == Marker.DELETEALL and first.ns == NAMESPACE
    assert [m.id for m in strips] == [0, 1, 2, 3, SERVED_ID]
    for marker in strips:
        assert marker.type == Marker.LINE_STRIP and marker.header.frame_id == "world"
        assert (marker.header.stamp.sec, marker.header.stamp.nanosec) == (5, 7)
        assert (marker.lifetime.sec, marker.lifetime.nanosec) == (1, 500_000_000)
    for i in range(3):
        np.testing.assert_array_equal(_xyz(strips[i]), np.stack([candidates[i, :, 2], candidates[i, :, 0],
                                                                np.zeros(8)], axis=1))
    assert len(strips[3].points) == 7  # the NaN row is left out, the rest kept
    np.testing.assert_array_equal(_xyz(strips[4])[:, :2], trajectory[:, [2, 0]])
    colors = [(m.color.r, m.color.g, m.color.b, m.color.a) for m in strips]
    assert colors[0] == colors[1] == pytest.approx(CLUSTER_COLORS[0])  # the largest cluster
    assert colors[2] == pytest.approx(CLUSTER_COLORS[1])
    assert colors[3] == pytest.approx(INVALID_COLOR)
    assert strips[4].scale.x > strips[0].scale.x  # the served strip is the thick one


def test_three_channels_draw_z():
    array = build_markers(np.arange(12.0).reshape(4, 3), None, None, None, channels=(0, 1, 2), frame_id="base",
                          stamp=Time(), lifetime_s=0.0)
    (_, served) = array.markers
    np.testing.assert_array_equal(_xyz(served), np.arange(12.0).reshape(4, 3))


def test_cluster_labels_rank_clusters_by_size():
    assert cluster_labels(5, [(0,), (1, 3, 4), (2,)]) == [1, 0, 2, 0, 0]
    assert cluster_labels(3, [(2,)]) == [-1, -1, 0]
