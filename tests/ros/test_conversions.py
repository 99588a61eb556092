"""ros/conversions.py: results into ActionTrajectory, CandidateArray, JointTrajectory and key-values (no DDS)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from trajectory_ensemble_node.contract import CandidateGroup, CandidateTrajectorySpec, EnsembleResult  # noqa: E402
from trajectory_ensemble_node.ros import conversions  # noqa: E402


def ensemble_result(count: int = 3, horizon: int = 4, width: int = 2, *, candidates: bool = True) -> EnsembleResult:
    spec = CandidateTrajectorySpec(count=count, reducer="mean", return_candidates=candidates)
    cands = torch.arange(count * horizon * width, dtype=torch.float32).reshape(count, horizon, width)
    return EnsembleResult(
        group=CandidateGroup.for_spec("r", spec), spec=spec, action=cands.mean(0), candidate_ids=tuple(range(count)),
        seeds=tuple(range(100, 100 + count)), candidates=cands if candidates else None,
        metrics={"total_ms": 12.5, "candidate_count": count, "fallback_reason": None},
    )


def test_trajectory_and_candidates_are_row_major_and_carry_the_observation_header():
    result = ensemble_result()
    stamp = SimpleNamespace(sec=42, nanosec=7)
    header = conversions.make_header(stamp, "cam")
    msg = conversions.trajectory_msg(result, header=header, domain_name="pusht", dt=0.125, normalized=True)
    assert (msg.header.stamp.sec, msg.header.stamp.nanosec, msg.header.frame_id) == (42, 7, "cam")
    assert (msg.horizon, msg.action_dim, msg.candidate_count, msg.base_seed) == (4, 2, 3, 100)
    assert msg.reducer == "mean" and msg.normalized and msg.dt == pytest.approx(0.125)
    np.testing.assert_allclose(np.asarray(msg.data).reshape(4, 2), result.action.numpy())
    cands = conversions.candidates_msg(result, header=header, domain_name="pusht", dt=0.125, normalized=False)
    assert list(cands.seeds) == [100, 101, 102] and list(cands.candidate_ids) == [0, 1, 2]
    np.testing.assert_array_equal(np.asarray(cands.data).reshape(3, 4, 2), result.candidates.numpy())
    with pytest.raises(ValueError, match="no candidates"):
        conversions.candidates_msg(ensemble_result(candidates=False), header=header, domain_name="x", dt=1.0,
                                   normalized=True)


def test_joint_trajectory_points_are_reached_at_k_plus_one_dt():
    action = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    header = conversions.make_header(SimpleNamespace(sec=1, nanosec=0), "base")
    msg = conversions.joint_trajectory_msg(action, joint_names=["x", "y"], dt=0.4, header=header)
    assert list(msg.joint_names) == ["x", "y"] and len(msg.points) == 3
    times = [p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in msg.points]
    assert times == pytest.approx([0.4, 0.8, 1.2])
    assert list(msg.points[2].positions) == [4.0, 5.0]
    with pytest.raises(ValueError, match="2 joint names"):
        conversions.joint_trajectory_msg(torch.zeros(3, 5), joint_names=["x", "y"], dt=0.1, header=header)


def test_metrics_become_key_values_with_units_kept_in_the_names():
    values = {kv.key: kv.value for kv in conversions.metrics_key_values(ensemble_result().metrics)}
    assert values == {"total_ms": "12.500", "candidate_count": "3", "fallback_reason": ""}


def test_nanoseconds_become_a_time_exactly_and_seconds_round_to_the_nanosecond():
    from trajectory_ensemble_node.serving.observations import stamp_ns

    big = 1_767_225_601 * 1_000_000_000 + 123_456_789  # past float64's nanosecond precision in seconds
    time_msg = conversions.ns_to_time(big)
    assert (time_msg.sec, time_msg.nanosec) == (1_767_225_601, 123_456_789) and stamp_ns(time_msg) == big
    assert (conversions.seconds_to_time(2.5).sec, conversions.seconds_to_time(2.5).nanosec) == (2, 500_000_000)
