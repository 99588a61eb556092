"""Recorded actions and open-loop metrics without ROS: every reference type read from a bag, time alignment,
channel matching, the metrics against hand-computed values, and the gate's lines."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trajectory_ensemble_node.replay import bags
from trajectory_ensemble_node.replay.open_loop import (
    GateLimitError,
    check_gate,
    compare_goal,
    match_channels,
    parse_channel_limit,
    row_times_ns,
    summarize,
)
from trajectory_ensemble_node.replay.reference import ReferenceError, read_reference

T0 = 1_700_000_000 * 1_000_000_000
MS = 1_000_000


def _types() -> dict:
    return bags.typestore().types


def _array_msg(values: list[float], wide: bool = True) -> object:
    types = _types()
    name = "std_msgs/msg/Float64MultiArray" if wide else "std_msgs/msg/Float32MultiArray"
    layout = types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
    return types[name](layout=layout, data=np.asarray(values, dtype=np.float64 if wide else np.float32))


def _trajectory_msg(stamp_ns: int, rows: np.ndarray, dt: float) -> object:
    return _types()[bags.TRAJECTORY_TYPE](
        header=bags.make_header(stamp_ns, "cam"), domain_name="pusht", horizon=rows.shape[0], action_dim=rows.shape[1],
        dt=dt, data=np.asarray(rows, np.float32).reshape(-1), reducer="mode", candidate_count=1, base_seed=0,
        normalized=False)


def test_joint_state_by_name_at_header_stamp(tmp_path: Path) -> None:
    """JointState: positions by joint name at header.stamp; a message naming some joints feeds only those."""
    with bags.BagRecorder(tmp_path / "b", "sqlite3") as bag:
        for i in range(3):
            bag.write_msg("/cmd", T0 + 5 * MS + i * 100 * MS,
                          bags.joint_state_msg(("a", "b"), (i, 10 * i), T0 + i * 100 * MS))
        bag.write_msg("/cmd", T0 + 400 * MS, bags.joint_state_msg(("b",), (99.0,), T0 + 350 * MS))
    series = read_reference(tmp_path / "b", "/cmd")
    assert series.names == ("a", "b") and series.messages == 4
    assert list(series.channels[0].times_ns - T0) == [0, 100 * MS, 200 * MS]
    assert list(series.channels[1].values) == [0, 10, 20, 99]
    # Halfway between samples: linear; past channel a's last sample: unknown.
    got = series.sample([0, 1], np.array([T0 + 50 * MS, T0 + 300 * MS]))
    np.testing.assert_allclose(got[0], [0.5, 5.0])
    assert np.isnan(got[1, 0]) and got[1, 1] == pytest.approx(20 + 79 * (100 / 150))
    assert series.span_ns([0, 1]) == (T0, T0 + 200 * MS)


def test_joint_trajectory_points_and_splicing(tmp_path: Path) -> None:
    """JointTrajectory: point j at header.stamp + time_from_start; a later message replaces from its first point."""
    first = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    second = np.array([[-1.0, -2.0], [-3.0, -4.0]])
    with bags.BagRecorder(tmp_path / "b", "mcap") as bag:
        bag.write_msg("/ref", T0, bags.joint_trajectory_msg(("x", "y"), first, 0.1, T0))
        # Stamped 0.15 s in: its first point (0.25 s) takes over from the first message's points at 0.3 and 0.4 s.
        bag.write_msg("/ref", T0 + 150 * MS, bags.joint_trajectory_msg(("x", "y"), second, 0.1, T0 + 150 * MS))
    series = read_reference(tmp_path / "b", "/ref")
    assert series.names == ("x", "y")
    assert list(series.channels[0].times_ns - T0) == [100 * MS, 200 * MS, 250 * MS, 350 * MS]
    assert list(series.channels[0].values) == [1.0, 3.0, -1.0, -3.0]
    # A zero header stamp means "now": the log time stands in.
    with bags.BagRecorder(tmp_path / "z", "mcap") as bag:
        bag.write_msg("/ref", T0 + 7 * MS, bags.joint_trajectory_msg(("x",), first[:, :1], 0.1, 0))
    assert series_first(read_reference(tmp_path / "z", "/ref")) == T0 + 107 * MS


def series_first(series: object) -> int:
    return series.channels[0].first_ns  # type: ignore[attr-defined]


@pytest.mark.parametrize("wide", [True, False])
def test_multi_arrays_at_log_time(tmp_path: Path, wide: bool) -> None:
    """Float64/Float32MultiArray: data at the log time, unnamed channels; a width change names the message."""
    with bags.BagRecorder(tmp_path / "b", "sqlite3") as bag:
        for i in range(3):
            bag.write_msg("/act", T0 + i * 50 * MS, _array_msg([i, -i, 0.5], wide))
    series = read_reference(tmp_path / "b", "/act")
    assert series.names is None and series.width == 3
    assert list(series.channels[1].values) == [0, -1, -2]
    with bags.BagRecorder(tmp_path / "bad", "sqlite3") as bag:
        bag.write_msg("/act", T0, _array_msg([1, 2], wide))
        bag.write_msg("/act", T0 + MS, _array_msg([1, 2, 3], wide))
    with pytest.raises(ReferenceError, match="message 1 holds 3 values, the first held 2"):
        read_reference(tmp_path / "bad", "/act")


def test_action_trajectory_rows_at_stamp_plus_k_dt(tmp_path: Path) -> None:
    """This node's ActionTrajectory as the reference (e.g. a previous checkpoint's recording)."""
    rows = np.arange(8, dtype=np.float64).reshape(4, 2)
    with bags.BagRecorder(tmp_path / "b", "mcap") as bag:
        bag.write_msg("/old/trajectory", T0 + 3 * MS, _trajectory_msg(T0, rows, 0.125))
    series = read_reference(tmp_path / "b", "/old/trajectory")
    assert series.names is None and series.width == 2
    assert list(series.channels[1].times_ns - T0) == [125 * MS, 250 * MS, 375 * MS, 500 * MS]
    assert list(series.channels[1].values) == [1, 3, 5, 7]


def test_reference_errors_name_the_problem(tmp_path: Path) -> None:
    """Unknown topic, a type that cannot be compared, no samples: each error names it."""
    with bags.BagRecorder(tmp_path / "b", "mcap") as bag:
        bag.write_msg("/cmd", T0, bags.joint_state_msg(("a",), (1.0,), T0))
        bag.write_msg("/words", T0, bags.string_msg("hi"))
        bag.write_msg("/empty", T0, bags.joint_trajectory_msg(("a",), np.zeros((0, 1)), 0.1, T0))
    with pytest.raises(ReferenceError, match=r"'/nope': no such topic .*\['/cmd', '/empty'\]"):
        read_reference(tmp_path / "b", "/nope")
    with pytest.raises(ReferenceError, match="'/words' carries std_msgs/msg/String"):
        read_reference(tmp_path / "b", "/words")
    with pytest.raises(ReferenceError, match="'/empty' .* holds no samples"):
        read_reference(tmp_path / "b", "/empty")


def _series(tmp_path: Path, names: tuple[str, ...] = ("x", "y", "z")) -> object:
    positions = np.stack([np.arange(1, 11) * 0.1 * (c + 1) for c in range(len(names))], axis=1)
    with bags.BagRecorder(tmp_path / "ref", "mcap") as bag:
        bag.write_msg("/ref", T0, bags.joint_trajectory_msg(names, positions, 0.1, T0))
    return read_reference(tmp_path / "ref", "/ref")


def test_channel_matching_rules(tmp_path: Path) -> None:
    """By name when both sides have names, else by index (equal widths), or as --reference-channels says."""
    series = _series(tmp_path)
    by_name = match_channels(series, 2, served_names=("z", "x"))
    assert (by_name.names, by_name.served, by_name.reference, by_name.matched_by) == (
        ("z", "x"), (0, 1), (2, 0), "joint_names")
    by_index = match_channels(series, 3)
    assert by_index.reference == (0, 1, 2) and by_index.names == ("x", "y", "z") and by_index.matched_by == "index"
    chosen = match_channels(series, 3, selectors=("y", "-", "0"))
    assert (chosen.served, chosen.reference, chosen.names) == ((0, 2), (1, 0), ("y", "x"))
    with pytest.raises(ReferenceError, match="width mismatch: the served chunks have 2 action channels, .* has 3"):
        match_channels(series, 2)
    with pytest.raises(ReferenceError, match="served channel 'q'"):
        match_channels(series, 2, served_names=("x", "q"))
    with pytest.raises(ReferenceError, match="entry 1 'w': no such channel"):
        match_channels(series, 2, selectors=("x", "w"))
    with pytest.raises(ReferenceError, match="gives 1 entries"):
        match_channels(series, 2, selectors=("x",))


def test_alignment_and_metrics_by_hand(tmp_path: Path) -> None:
    """Row k at stamp + (k+1) dt against the interpolated recording; rows past its end are left out and counted."""
    series = _series(tmp_path, ("x", "y"))  # x(t) = t (s), y(t) = 2t, recorded at 0.1 .. 1.0 s
    channels = match_channels(series, 2)
    # Goal 1 from t = 0.05: rows at 0.15, 0.25, 0.35, 0.45; goal 2 from 0.85: rows at 0.95, 1.05 (past), ...
    served1 = np.array([[0.15, 0.30], [0.25, 0.50], [0.45, 0.70], [0.45, 0.90]])  # row 2 off by +0.1 on x
    served2 = np.array([[0.95, 2.10], [9.0, 9.0], [9.0, 9.0], [9.0, 9.0]])  # y off by +0.2 at 0.95; rest past
    cands = np.stack([served2, served2 - np.array([0.0, 0.2])])  # candidate 1 equals the recording
    g1 = compare_goal(1, T0 + 50 * MS, 0.1, served1, None, series, channels)
    g2 = compare_goal(2, T0 + 850 * MS, 0.1, served2, cands, series, channels)
    assert list(g1.times_ns - T0) == [150 * MS, 250 * MS, 350 * MS, 450 * MS]
    assert list(g2.compared) == [True, False, False, False] and g2.past.sum() == 3
    section = summarize([g1, g2], series, channels)
    assert section["rows_compared"] == 5 and section["rows_past_recording"] == 3
    assert section["rows_before_recording"] == 0
    # Errors: x has 0.1 at one row of 5; y has 0.2 at one row of 5.
    assert section["rmse_per_channel"]["x"] == pytest.approx(np.sqrt(0.01 / 5))
    assert section["rmse_per_channel"]["y"] == pytest.approx(np.sqrt(0.04 / 5))
    assert section["mae_per_channel"]["y"] == pytest.approx(0.2 / 5)
    assert section["rmse"] == pytest.approx(np.sqrt(0.05 / 10))
    assert section["error_by_step"][0] == pytest.approx(np.sqrt(0.04 / 4))  # step 0: two goals, y of goal 2
    assert section["error_by_step"][2] == pytest.approx(np.sqrt(0.01 / 2))  # step 2: goal 1 only
    assert section["rows_by_step"] == [2, 1, 1, 1]
    goal2 = section["goals"][1]
    assert goal2["rmse"] == pytest.approx(np.sqrt(0.04 / 2)) and goal2["rows_past_recording"] == 3
    assert goal2["best_candidate"] == 1 and goal2["best_candidate_rmse"] == pytest.approx(0.0)
    assert goal2["served_rank"] == 2  # one candidate strictly closer than what was served
    assert "served_rank" not in section["goals"][0]
    assert section["best_candidate_rmse"] == pytest.approx(0.0)
    assert list(row_times_ns(T0, 1 / 15, 3) - T0) == [66_666_667, 133_333_333, 200_000_000]


def test_no_overlap_is_an_error(tmp_path: Path) -> None:
    series = _series(tmp_path, ("x", "y"))
    channels = match_channels(series, 2)
    goal = compare_goal(1, T0 + 5_000 * MS, 0.1, np.zeros((4, 2)), None, series, channels)
    with pytest.raises(ReferenceError, match=r"no time overlap: the served rows stand at .* is recorded at"):
        summarize([goal], series, channels)


def test_gate_lines_name_channel_goal_and_value(tmp_path: Path) -> None:
    series = _series(tmp_path, ("x", "y"))
    channels = match_channels(series, 2)
    served = np.array([[0.1, 0.2], [0.2, 0.4], [0.3, 0.6], [0.4, 1.0]])  # y off by 0.2 at the last row
    later = np.array([[0.4, 0.8], [0.5, 1.0], [0.6, 1.2], [0.7, 1.4]]) + [0.0, 0.5]  # y off by 0.5 throughout
    section = summarize([compare_goal(1, T0, 0.1, served, None, series, channels),
                         compare_goal(2, T0 + 300 * MS, 0.1, later, None, series, channels)], series, channels)
    failures, passes = check_gate(section, max_rmse=0.01, max_rmse_channel={"x": 1.0, "y": 0.1})
    assert len(failures) == 2 and len(passes) == 1
    assert failures[0].startswith("gate: rmse ") and "worst channel y" in failures[0] and "worst goal 2" in failures[0]
    assert failures[0].endswith("exceeds --max-rmse 0.01")
    assert failures[1].startswith(f"gate: channel y rmse {section['rmse_per_channel']['y']:.4f} (worst goal 2: ")
    assert failures[1].endswith("exceeds --max-rmse-channel y=0.1")
    assert passes[0].startswith("gate: channel x rmse 0.0000 (worst goal ")
    assert passes[0].endswith("within --max-rmse-channel x=1")
    assert check_gate(section, max_rmse=10.0)[0] == []
    with pytest.raises(GateLimitError, match="no compared channel 'q'"):
        check_gate(section, max_rmse_channel={"q": 1.0})
    assert parse_channel_limit("robot_x=0.25") == ("robot_x", 0.25)
    for bad in ("robot_x", "=1", "x=-1", "x=abc"):
        with pytest.raises(GateLimitError, match="NAME=VALUE"):
            parse_channel_limit(bad)
