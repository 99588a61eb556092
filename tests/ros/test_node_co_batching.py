"""The node over real DDS co-batches concurrent goals: a goal that arrives while another is denoising joins its steps.

Its premise is that the two groups are in the engine at the same time. The tiny model finishes a group in tens of
milliseconds, so on a loaded host a second goal sent right after the first can arrive after the first has finished
(seen with both cores busy beside the suite: ``co_batched_groups_max`` 1 and 1). Here that premise is controlled
rather than hoped for: every physical forward is paced (test-only ``step_delay_s``), and the second goal is sent only
once the first goal's feedback says it is denoising, so the first has all but one of its paced steps still to run.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, metrics_dict, serve_node  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

STEPS = 10
STEP_DELAY_S = 0.5
"""The first group has at least (STEPS - 1) * STEP_DELAY_S of paced steps left when the second goal is sent."""
stamps = Stamps(7000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_co_batching")
    yield from serve_node(tmp, ros_domain_id, {"max_concurrent_goals": 2, "num_inference_steps": STEPS,
                                               "max_observation_age_s": 120.0}, step_delay_s=STEP_DELAY_S)


def test_a_goal_sent_while_another_denoises_is_co_batched_with_it(served):
    _, client = served
    client.publish_image(stamps())
    first = client.send_goal(candidate_count=2)
    client.wait(lambda: any(f.stage == "denoising" for f in first.feedback), 120, "the first goal denoising")
    second = client.send_goal(candidate_count=3)
    client.result(first)
    client.result(second)
    assert first.status == second.status == GoalStatus.STATUS_SUCCEEDED, (first.result.error_message,
                                                                          second.result.error_message)
    co_batched = [metrics_dict(o.result)["co_batched_groups_max"] for o in (first, second)]
    assert co_batched == ["2", "2"], co_batched
