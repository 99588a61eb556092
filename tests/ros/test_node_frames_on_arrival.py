"""The node drops frames and joint states it cannot use where they arrive (issue 45, row 7), over DDS: a frame the
model cannot encode and a ragged joint state are counted on /diagnostics, logged once for the cause, and the next
goal is served from the last good one. The rule itself and the buffer are tests/serving/test_frames_on_arrival.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import NS, Stamps, published_through, serve_node, stamp_sec, succeeded  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402

stamps = Stamps(45_700)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    yield from serve_node(tmp_path_factory.mktemp("frames_on_arrival"), ros_domain_id,
                          {"require_state": True, "max_observation_age_s": 60.0})


@pytest.mark.ros
@pytest.mark.slow
def test_frames_the_model_cannot_encode_are_dropped_and_the_next_goal_is_served_from_the_last_good_one(served):
    node, client = served
    good = stamps()
    client.publish_observation(good, [0.1] * 7)
    # Shapes the pipeline could not encode, each published until /diagnostics count it (a counter only grows).
    for height, width in ((1, 1), (2, 256), (256, 15)):
        client.publish_image(stamps(), counted="frames_rejected_dimensions", height=height, width=width)
    outcome = client.run_goal(candidate_count=2)
    result = succeeded(outcome)
    assert stamp_sec(result.trajectory) == good, "served from the last good frame"
    assert [stamp_sec(m) for m in published_through(client, "trajectory", good)] == [good]
    _, values = client.latest_status("observations",
                                     predicate=lambda v: int(v.get("frames_rejected_dimensions", 0)) >= 3)
    assert values["frames_received"] != "0"
    # Logged once for the cause, with the size and the bound; never an engine failure.
    log = node.log()
    assert log.count(f"rejected a frame on {NS}/observation/image (dimensions)") == 1
    assert "is 1x1 (width x height); the model needs at least 16 pixels" in log
    assert "ENGINE_FAILURE" not in log


@pytest.mark.ros
@pytest.mark.slow
def test_a_ragged_joint_state_is_dropped_counted_and_the_last_good_state_serves(served):
    _, client = served
    good = stamps()
    client.publish_observation(good, [0.2] * 7)
    ragged = JointState(name=[f"j{i}" for i in range(7)], position=[0.3] * 5)
    client._publish_counted({"states_rejected": lambda: client.state_pub.publish(ragged)}, 60.0)
    result = succeeded(client.run_goal(candidate_count=2))
    assert stamp_sec(result.trajectory) == good
    status, _ = client.latest_status("observations", predicate=lambda v: int(v.get("states_rejected", 0)) >= 1)
    assert "joint state(s) rejected" in status.message
