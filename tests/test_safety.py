"""Action limits (YAML schema, validation) and per-candidate verdicts, against direct computations."""

from __future__ import annotations


import pytest
import torch

from trajectory_ensemble_node.errors import ErrorCode, LimitsFileError
from trajectory_ensemble_node.safety import ActionLimits, ChannelLimits, check_trajectories, load_limits

GOOD = """
version: 1
channels:
  - {name: x, min: -1.0, max: 1.0, max_velocity: 2.0, max_acceleration: 10.0, max_start_jump: 0.3}
  - {name: y, max_velocity: 2.0}
"""


def test_limits_file_loads_with_names_and_nulls(tmp_path):
    path = tmp_path / "limits.yaml"
    path.write_text(GOOD)
    limits = load_limits(path)
    assert limits.width == 2 and [c.name for c in limits.channels] == ["x", "y"]
    assert limits.channels[0].max_start_jump == 0.3 and limits.channels[1].min is None


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("channels: [{min: 1.0, max: 0.5}]", "min=1.0, max=0.5"),
        ("channels: [{max_velocity: -2}]", "-2"),
        ("channels: [{max: .nan}]", "nan"),
        ("channels: [{maxx: 1}]", "'maxx'"),
        ("channels: []", "[]"),
        ("version: 2\nchannels: [{max: 1}]", "2"),
        ("channels: [{max: [1, 2]}]", "[1, 2]"),
    ],
)
def test_bad_limits_are_refused_quoting_the_value(tmp_path, text, quoted):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(LimitsFileError, match="bad.yaml") as info:
        load_limits(path)
    assert quoted in str(info.value)
    assert info.value.code == ErrorCode.LIMITS_FILE_INVALID


def test_missing_file_is_a_named_error(tmp_path):
    with pytest.raises(LimitsFileError, match="cannot read"):
        load_limits(tmp_path / "nope.yaml")


def test_verdicts_match_finite_differences():
    torch.manual_seed(0)
    dt = 0.1
    trajectories = torch.cumsum(torch.randn(16, 8, 2) * 0.1, dim=1)
    trajectories[3, 4, 1] = float("nan")
    limits = ActionLimits((ChannelLimits(min=-0.4, max=0.4, max_velocity=1.5, max_acceleration=20.0),) * 2)
    report = check_trajectories(trajectories, limits, dt=dt)
    x = trajectories.double()
    finite = torch.isfinite(x).flatten(1).all(1)
    velocity = ((x[:, 1:] - x[:, :-1]).abs() / dt).flatten(1).amax(1)
    acceleration = ((x[:, 2:] - 2 * x[:, 1:-1] + x[:, :-2]).abs() / dt**2).flatten(1).amax(1)
    expected = finite & (x.flatten(1).amax(1) <= 0.4) & (x.flatten(1).amin(1) >= -0.4) & (velocity <= 1.5) & (
        acceleration <= 20.0)
    assert report.valid.tolist() == expected.tolist()
    counts = report.counts()
    assert counts["dropped_non_finite"] == 1 and report.verdicts[3].reasons == ("non_finite",)
    assert counts["dropped_max_velocity"] == int((finite & (velocity > 1.5)).sum())
    assert counts["valid_candidates"] + counts["dropped_candidates"] == 16


def test_clamp_fixes_positions_only():
    trajectories = torch.tensor([[[0.0], [0.5], [1.2]], [[0.0], [2.0], [0.0]]])
    limits = ActionLimits((ChannelLimits(min=-1.0, max=1.0, max_velocity=15.0),))
    report = check_trajectories(trajectories, limits, dt=0.1, clamp_positions=True)
    first, second = report.verdicts
    assert first.valid and first.clamped and float(report.trajectories[0].max()) == 1.0
    # Clamped to 1.0, the second moves 1.0 per 0.1 s = 10 units/s, within 15: clamped and kept.
    assert second.clamped
    strict = check_trajectories(trajectories, ActionLimits((ChannelLimits(min=-1.0, max=1.0, max_velocity=5.0),)),
                                dt=0.1, clamp_positions=True)
    assert not strict.verdicts[1].valid and strict.verdicts[1].reasons == ("max_velocity",)
