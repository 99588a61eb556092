"""A limits file the toy policy violates on purpose, over real DDS (issue 17): the node's drop counts match a
direct computation on the candidates it returns.

The node serves the bundled toy policy (the default model) with a limits file that forbids the upper half of the
workspace (``y <= 0``, a keep-out region) and caps the speed along ``x``. The policy passes the obstacle above or
below, so some candidates of a scene break the position limit and others do not.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import Stamps, metrics_dict, serve_node  # noqa: E402
from action_msgs.msg import GoalStatus  # noqa: E402

from trajectory_ensemble_node.errors import ErrorCode  # noqa: E402
from trajectory_ensemble_node.toy import ACTION_SETTINGS, INSTRUCTION, task  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

Y_MAX = 0.0
X_MAX_VELOCITY = 1.6  # units/s at dt = 1/8: 0.2 per action; the policy's steps are about that long
COUNT = 8
stamps = Stamps(7000)


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("node_limits")
    limits = tmp / "limits.yaml"
    limits.write_text(yaml.safe_dump({"version": 1, "channels": [
        {"name": "x", "max_velocity": X_MAX_VELOCITY}, {"name": "y", "max": Y_MAX}]}))
    yield from serve_node(tmp, ros_domain_id, {
        **ACTION_SETTINGS, "model": "toy", "instruction": INSTRUCTION, "reducer": "mode", "candidate_count": COUNT,
        "limits_file": str(limits),
    })


def direct_reasons(candidate: np.ndarray) -> set[str]:
    """What the limits file says of one candidate ``[H, 2]``, computed here without the node's code."""
    reasons = set()
    if not np.isfinite(candidate).all():
        return {"non_finite"}
    if (candidate[:, 1] > Y_MAX).any():
        reasons.add("max")
    if (np.abs(np.diff(candidate[:, 0])) * ACTION_SETTINGS["fps"] > X_MAX_VELOCITY).any():
        reasons.add("max_velocity")
    return reasons


def test_drop_counts_match_a_direct_computation(served):
    client = served[1]
    mixed = 0
    for scene in task.heldout_scenes(4, seed=30):
        client.publish_rgb(task.render(scene), stamps())
        outcome = client.run_goal(return_candidates=True, use_seed=True, seed=11)
        if outcome.status != GoalStatus.STATUS_SUCCEEDED:
            # Every candidate broke a limit: aborted with the counts, and nothing to compare per candidate.
            assert outcome.result.error_code == ErrorCode.TOO_FEW_VALID_CANDIDATES, outcome.result.error_message
            assert outcome.result.validity.dropped == COUNT
            continue
        result = outcome.result
        candidates = np.asarray(result.candidates.data, dtype=np.float64).reshape(COUNT, -1, 2)
        reasons = [direct_reasons(c) for c in candidates]
        assert list(result.candidates.valid) == [not r for r in reasons]
        assert result.validity.dropped == sum(bool(r) for r in reasons)
        assert result.validity.valid == sum(not r for r in reasons)
        expected = {name: sum(name in r for r in reasons) for name in ("max", "max_velocity")}
        got = dict(zip(result.validity.drop_reasons, result.validity.drop_counts))
        assert got == {name: n for name, n in expected.items() if n}
        metrics = metrics_dict(result)
        assert {name: int(metrics[f"dropped_{name}"]) for name in expected} == expected
        # What is published was reduced from the valid candidates only, and is itself within the limits.
        assert not direct_reasons(np.asarray(result.trajectory.data, dtype=np.float64).reshape(-1, 2))
        mixed += 0 < result.validity.dropped < COUNT
    assert mixed >= 1, "no scene had both valid and dropped candidates: the limits no longer split the policy"
