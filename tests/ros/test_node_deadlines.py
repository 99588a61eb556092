"""Per-goal deadlines over real DDS (issue 17): the node fits fewer denoising steps to a deadline it can meet.

One node process (the random tiny model, 4 candidates, 8 steps) serves the module, every physical forward paced to
at least 2 s (test-only step delay). Two premises make the claim a count rather than a race, on an idle or a loaded
host alike (issue 45: under load 3-5 a fixed deadline fell below the grown encode + step cost, and the goal was
refused as unmeetable):

- the deadline comes from the node's own measured costs, as its goals report them: the most any goal so far spent
  encoding and post-processing, plus :data:`ROOM_STEPS` of the slowest engine iteration (its total time less queue,
  encode and post-processing, per step). The engine plans from running averages of the same measurements, which
  never exceed their maxima, so the deadline is never refused and at least one step fits;
- it stays below the least time all 8 steps can be planned to take (8 x 2 s, the pacing, by the engine's own
  arithmetic), so fewer than 8 steps fit whatever the load. With both cores busy beside the suite (load 9-11) a goal
  spent up to 4.8 s encoding and post-processing and 2.7 s an iteration: a deadline of about 11 s, well under 16 s.
  A host where even that does not hold is named by the assertion, not hidden.

How close goals come to their deadline is a speed figure, reported by ``bench --ros``, not asserted here.
"""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, metrics_dict, serve_node, succeeded  # noqa: E402
from builtin_interfaces.msg import Duration  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

COUNT = 4
STEPS = 8
STEP_DELAY_S = 2.0
ROOM_STEPS = 2  # iterations' worth of time a deadline leaves after encoding and post-processing
SAFETY = 1.1  # engine/deadline.py's SAFETY_FACTOR: the engine plans with costs inflated by it
CEILING_S = 0.9 * SAFETY * STEPS * STEP_DELAY_S  # below the least time all 8 paced steps can be planned to take
stamps = Stamps(5500)


class Costs:
    """The most each part of a goal has cost so far (ms), from the goals' own metrics."""

    def __init__(self) -> None:
        self.fixed_ms = self.step_ms = 0.0

    def add(self, metrics: dict[str, str]) -> None:
        post = float(metrics["action_postprocess_ms"]) + float(metrics["reduce_ms"])
        fixed = float(metrics["encode_ms"]) + post
        # Engine iterations, as the engine times them: everything between encoding and post-processing.
        steps = (float(metrics["total_ms"]) - float(metrics["queue_ms"]) - fixed) / int(metrics["steps_used"])
        self.fixed_ms, self.step_ms = max(self.fixed_ms, fixed), max(self.step_ms, steps)

    def deadline_s(self) -> float:
        deadline_s = SAFETY * (self.fixed_ms + ROOM_STEPS * self.step_ms) / 1000.0
        assert deadline_s < CEILING_S, (
            f"the premise does not hold on this host: encode + post-processing ({self.fixed_ms:.0f} ms) + "
            f"{ROOM_STEPS} iterations ({self.step_ms:.0f} ms each) take {deadline_s:.2f} s, not under "
            f"{CEILING_S:.2f} s")
        return deadline_s


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_deadlines")
    yield from serve_node(tmp, ros_domain_id, {"candidate_count": COUNT, "num_inference_steps": STEPS,
                                               "max_observation_age_s": 120.0}, step_delay_s=STEP_DELAY_S)


@pytest.fixture
def client(served):
    return served[1]


def test_a_deadline_shorter_than_the_goal_is_met_with_fewer_steps(client):
    # Without a deadline: every step, and no deadline in the metrics. This goal also replaces the start-up cost
    # measurement by its own, so the planner's step time is a paced one from here on.
    client.publish_image(stamps())
    result = succeeded(client.run_goal())
    assert result.steps_planned == result.steps_fitted == result.steps_used == STEPS
    metrics = metrics_dict(result)
    assert "deadline_met" not in metrics
    costs = Costs()
    for _ in range(2):
        costs.add(metrics)
        deadline_s = costs.deadline_s()
        nanos = int(deadline_s * 1e9)
        client.publish_image(stamps())
        result = succeeded(client.run_goal(deadline=Duration(sec=nanos // 1_000_000_000,
                                                             nanosec=nanos % 1_000_000_000)))
        metrics = metrics_dict(result)
        # Fitted after encoding to what is left of the deadline (about ROOM_STEPS steps, and under 8 by the
        # pacing), then possibly stopped early: never more steps than fitted, never none.
        assert result.steps_planned == STEPS and result.steps_used < result.steps_planned
        assert 1 <= result.steps_used <= result.steps_fitted < result.steps_planned, metrics
        assert (int(metrics["steps_planned"]), int(metrics["steps_fitted"]), int(metrics["steps_used"])) == (
            result.steps_planned, result.steps_fitted, result.steps_used)
        # The engine's deadline is the goal's, less what passed between acceptance and submission.
        assert 0 < float(metrics["deadline_ms"]) <= deadline_s * 1000.0 + 1e-3, metrics
        # deadline_met is the engine's own comparison: its total time (from submission) against that deadline.
        total_ms, deadline_ms = float(metrics["total_ms"]), float(metrics["deadline_ms"])
        assert metrics["deadline_met"] in ("true", "false")
        if abs(total_ms - deadline_ms) > 0.002:  # the metrics carry 3 decimals
            assert metrics["deadline_met"] == ("true" if total_ms < deadline_ms else "false"), metrics
