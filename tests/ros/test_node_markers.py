"""``~/markers`` over DDS: the points of every marker equal the published candidates and trajectory (issue 34)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")
pytest.importorskip("visualization_msgs")

from _node_harness import Stamps, serve_node, succeeded  # noqa: E402
from _reliability_harness import publish_until_received  # noqa: E402
from visualization_msgs.msg import Marker  # noqa: E402

from trajectory_ensemble_node.ros.markers import INVALID_COLOR, SERVED_ID  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

CHANNELS = [2, 0, 1]  # x, y, z drawn from action channels 2, 0 and 1 of the 10-wide droid_lerobot action
stamps = Stamps(44_000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    yield from serve_node(tmp_path_factory.mktemp("markers"), ros_domain_id,
                          {"publish_markers": True, "marker_channels": CHANNELS, "marker_frame_id": "base_link",
                           "marker_lifetime_s": 3.0, "candidate_count": 5, "reducer": "medoid"})


def _xyz(marker: Marker) -> np.ndarray:
    return np.array([[p.x, p.y, p.z] for p in marker.points])


def test_every_marker_is_a_published_candidate_or_the_trajectory_on_the_chosen_channels(served):
    _, client = served
    stamp = stamps()
    publish_until_received(client, stamp)
    result = succeeded(client.run_goal(return_candidates=True))
    client.wait(lambda: client.messages("markers") and client.messages("candidates"), 30.0, "~/markers")
    (array,) = client.messages("markers")
    (candidates_msg,) = client.messages("candidates")
    first, *strips = array.markers
    assert first.action == Marker.DELETEALL
    n, horizon, width = 5, result.trajectory.horizon, result.trajectory.action_dim
    candidates = np.asarray(candidates_msg.data, dtype=np.float64).reshape(n, horizon, width)
    trajectory = np.asarray(result.trajectory.data, dtype=np.float64).reshape(horizon, width)
    assert [m.id for m in strips] == [*range(n), SERVED_ID]
    for marker in strips:
        assert marker.type == Marker.LINE_STRIP and marker.header.frame_id == "base_link"
        assert marker.header.stamp == result.trajectory.header.stamp  # the observation's stamp
        assert (marker.lifetime.sec, marker.lifetime.nanosec) == (3, 0)
    for i in range(n):
        np.testing.assert_allclose(_xyz(strips[i]), candidates[i][:, CHANNELS], rtol=0, atol=1e-6)
    np.testing.assert_allclose(_xyz(strips[-1]), trajectory[:, CHANNELS], rtol=0, atol=1e-6)
    valid = list(candidates_msg.valid)
    assert all(valid)  # no limits file: every candidate is drawn in its cluster's colour, none in red
    assert all((m.color.r, m.color.g, m.color.b) != pytest.approx(INVALID_COLOR[:3]) for m in strips[:n])
    assert strips[-1].scale.x > strips[0].scale.x
