"""``trajectory-ensemble sim``: the pure parts (clock, splicing by stamps, goal trigger, episode end) without ROS, and
one short episode against the real node on sim time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trajectory_ensemble_node.toy import task
from trajectory_ensemble_node.toy.episodes import summarize
from trajectory_ensemble_node.demo.sim_model import (
    NS_PER_S,
    EpisodeRecord,
    Plan,
    SimClock,
    SimSettings,
    episode_end,
    handover_seam,
    row_period_ns,
    row_times,
    should_request,
)

DT = NS_PER_S // 8  # 0.125 s, the toy policy's dt


class FakeWall:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


# --- clock -----------------------------------------------------------------------------------------------------------


def test_clock_advances_at_the_real_time_factor_and_pauses():
    wall = FakeWall()
    clock = SimClock(0.05, start_ns=100 * NS_PER_S, wall=wall)
    wall.t += 2.0  # 2 s of wall time at RTF 0.05 = 0.1 s of sim time
    assert clock.now_ns() == 100 * NS_PER_S + NS_PER_S // 10
    clock.pause()
    wall.t += 10.0
    assert clock.now_ns() == 100 * NS_PER_S + NS_PER_S // 10  # paused: the world waits
    clock.skip(DT)
    clock.resume()
    wall.t += 1.0
    assert clock.now_ns() == 100 * NS_PER_S + NS_PER_S // 10 + DT + NS_PER_S // 20


def test_clock_holds_exactly_at_a_stop_until_resumed_and_an_explicit_pause_is_not_a_hold():
    wall = FakeWall()
    clock = SimClock(0.1, start_ns=0, wall=wall)
    clock.stop_at(2 * DT)
    wall.t += 1.0  # 0.1 s of sim time: not there yet
    assert clock.now_ns() == NS_PER_S // 10 and not clock.paused
    wall.t += 5.0  # would be 0.6 s: holds at the stop, exactly
    assert clock.now_ns() == 2 * DT and clock.paused and clock.held
    wall.t += 5.0
    assert clock.now_ns() == 2 * DT
    clock.resume()
    wall.t += 1.0
    assert clock.now_ns() == 2 * DT + NS_PER_S // 10 and not clock.held
    clock.stop_at(10 * DT)
    clock.stop_at(None)  # canceled before it is reached
    wall.t += 100.0
    assert not clock.paused
    clock.stop_at(0)
    clock.pause()  # an explicit pause cancels the stop and is not a hold
    assert clock.paused and not clock.held


def test_clock_refuses_a_bad_factor_and_skip_while_running():
    with pytest.raises(ValueError, match="got 0"):
        SimClock(0)
    with pytest.raises(ValueError, match="paused"):
        SimClock(1.0).skip(1)


# --- splicing ----------------------------------------------------------------------------------------------------------


def chunk(start: float, horizon: int = 8) -> np.ndarray:
    """Rows ``[H, 2]``: x = start + k + 1 (k the row), y = start, so every row says which chunk and row it is."""
    return np.stack([start + np.arange(1, horizon + 1), np.full(horizon, start)], axis=1).astype(np.float64)


def test_rows_are_timed_from_the_stamp():
    assert row_times(1000, DT, 3).tolist() == [1000 + DT, 1000 + 2 * DT, 1000 + 3 * DT]


@pytest.mark.parametrize(("fps", "own_ns"), [(10.0, 100_000_000), (8.0, 125_000_000), (15.0, 66_666_667)])
def test_a_float32_dt_of_the_sims_own_period_is_that_period(fps, own_ns):
    # The node's message carries dt as float32: 0.1 s reads back 1.49 ns long, which rounding would add to every row.
    wire = float(np.float32(1.0 / fps))
    assert row_period_ns(wire, own_ns) == own_ns
    assert row_period_ns(float(np.float32(0.2)), 100_000_000) == 200_000_003  # another period: rounded, not snapped



def test_a_new_chunk_takes_over_from_its_first_row_still_ahead():
    plan, hold = Plan(), np.zeros(2)
    first = plan.splice(row_times(0, DT, 8), chunk(0.0), now_ns=0, hold=hold)
    assert first is not None and first.first_row == 0 and first.seam is None
    # Planned at step 4, arriving 1.5 steps later: rows 0 (step 5) is in the past, row 1 (step 6) is the first ahead.
    new = chunk(10.0)
    switch = plan.splice(row_times(4 * DT, DT, 8), new, now_ns=4 * DT + DT * 3 // 2, hold=hold)
    assert switch is not None and switch.first_row == 1 and switch.time_ns == 6 * DT
    # The seam is measured against what the old plan had for that time (old row 5: x = 6).
    assert switch.seam == pytest.approx(np.linalg.norm(new[1] - chunk(0.0)[5]))
    # The old rows up to step 5 stay; from step 6 on the new chunk's rows, each at its stamped time.
    assert plan.target(5 * DT, hold).tolist() == chunk(0.0)[4].tolist()
    assert plan.target(6 * DT, hold).tolist() == new[1].tolist()
    assert plan.target(12 * DT, hold).tolist() == new[7].tolist()
    assert plan.target(40 * DT, hold).tolist() == new[7].tolist()  # after the last row: stay there


def test_a_chunk_entirely_in_the_past_changes_nothing_and_targets_interpolate_between_rows():
    plan, hold = Plan(), np.array([-1.0, -1.0])
    assert plan.target(5, hold).tolist() == hold.tolist()  # nothing planned: hold
    plan.splice(row_times(0, DT, 8), chunk(0.0), now_ns=0, hold=hold)
    assert plan.splice(row_times(0, DT, 8), chunk(5.0), now_ns=9 * DT, hold=hold) is None
    assert plan.target(8 * DT, hold).tolist() == chunk(0.0)[7].tolist()
    assert plan.target(DT + DT // 2, hold).tolist() == pytest.approx([1.5, 0.0])  # off-grid: linear between rows


def test_the_seam_is_taken_where_the_new_chunk_takes_over_after_its_frozen_rows():
    plan, hold = Plan(), np.zeros(2)
    assert plan.deviation(row_times(0, DT, 8), chunk(0.0), hold) is None  # nothing to deviate from
    plan.splice(row_times(0, DT, 8), chunk(0.0), now_ns=0, hold=hold)
    # The new chunk (planned at step 4) equals the old plan on its rows 0-1, then leaves it by 0.5.
    new = np.concatenate([chunk(0.0)[4:6], chunk(0.0)[6:] + [0.0, 0.5], np.zeros((2, 2))])
    deviation = plan.deviation(row_times(4 * DT, DT, 8), new, hold)
    assert deviation[:2] == [0.0, 0.0] and deviation[2] == pytest.approx(0.5)
    # Arrived before its 2 frozen rows were over: the robot runs row 1 (frozen, seam 0 there), the jump is at row 2.
    assert handover_seam(deviation, first_row=1, frozen=2) == pytest.approx(0.5)
    assert handover_seam(deviation, first_row=1, frozen=0) == 0.0  # naive: the first row executed
    assert handover_seam(deviation, first_row=None, frozen=2) is None  # came too late for any row
    assert handover_seam(deviation, first_row=1, frozen=9) is None


# --- trigger -----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("execute", "steps", "due"), [(4, 3, False), (4, 4, True), (2, 2, True), (None, 7, False),
                                                       (None, 8, True)])
def test_the_next_goal_is_due_after_s_actions_or_the_whole_chunk(execute, steps, due):
    assert should_request(1000 + steps * DT, 1000, DT, 8, execute) is due


# --- episode end -------------------------------------------------------------------------------------------------------


def test_episode_ends_on_collision_first_then_target_then_budget():
    scene = task.make_scene(task.HELDOUT_SEED_BASE)
    far = np.array([scene.target[0] - 0.5, 0.9])
    assert episode_end(scene, far, far, steps=3) is None
    # A step across the obstacle collides even though it ends beside the target.
    assert episode_end(scene, scene.obstacle - [scene.radius + 0.2, 0], scene.target, steps=3) == "collision"
    near = scene.target + [task.TARGET_RADIUS * 0.9, 0]
    assert episode_end(scene, near, near, steps=3) == "target"
    assert episode_end(scene, far, far, steps=32, budget=32) == "budget"


def test_settings_refuse_bad_values_quoting_them():
    with pytest.raises(ValueError, match="got 9"):
        SimSettings(execute=9)
    with pytest.raises(ValueError, match="real_time_factor .* got -1"):
        SimSettings(real_time_factor=-1.0)
    assert SimSettings(execute=None).mode == "sync" and SimSettings().mode == "s=4"
    with pytest.raises(ValueError, match=r"fixed_delay must be in \[0, 4\] \(with s = 4\), got 5"):
        SimSettings(fixed_delay=5)
    assert SimSettings(fixed_delay=4).fixed_delay == 4 and SimSettings(execute=None, fixed_delay=6).fixed_delay == 6


def test_an_episode_record_feeds_the_in_process_bench_metrics():
    record = EpisodeRecord(task.HELDOUT_SEED_BASE, "s=4", True, positions=[[0.0, 0.0], [0.1, 0.0], [0.2, 0.0]],
                           sides=[1, -1], outcome="target",
                           switches=[{"step": 0, "seam_jump_sim": None}, {"step": 1, "seam_jump_sim": 0.05}])
    metrics = summarize([record.episode()])
    assert metrics["success_rate"] == 1.0 and metrics["mode_flips_per_episode"] == 1.0
    # Chunks planned past the obstacle (side 0) neither flip nor hide a flip between the chunks around them.
    record.sides = [1, 0, -1, 0, 0]
    assert summarize([record.episode()])["mode_flips_per_episode"] == 1.0
    record.sides = [1, 1, 0, 0]
    assert summarize([record.episode()])["mode_flips_per_episode"] == 0.0
    assert metrics["seam_jump_mean"] == pytest.approx(0.05) and metrics["steps_to_target"] == 2.0


def test_the_pusht_panel_switches_are_off_by_default_and_the_toy_report_never_names_them():
    import json

    from trajectory_ensemble_node.demo.sim_report import report

    # Off, the report keeps the toy's bytes: neither key appears, and a record's candidates never reach the JSON.
    record = EpisodeRecord(7, "s=4", True, positions=[[0.0, 0.0]])
    record.candidates[0] = (np.zeros((8, 8, 2), np.float32), np.zeros((8, 2), np.float32))
    doc = report([record], SimSettings())
    assert not {"return_candidates", "hold_for_goals"} & set(doc["settings"])
    assert "candidates" not in doc["episodes"][0] and json.dumps(doc)
    held = report([], SimSettings(fixed_delay=0, hold_for_goals=True, return_candidates=True))["settings"]
    assert held["return_candidates"] is True and held["hold_for_goals"] is True
    with pytest.raises(ValueError, match="hold_for_goals needs a fixed_delay"):
        SimSettings(hold_for_goals=True)


def test_command_line_reads_s_or_sync_and_refuses_anything_else(capsys):
    import argparse

    from trajectory_ensemble_node.demo import sim

    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    assert sim.settings_from(parser.parse_args(["--execute", "sync", "--no-continue"])) == SimSettings(
        execute=None, continue_previous=False)
    args = parser.parse_args(["--execute", "2", "--real-time-factor", "0.2", "--node-name", "/robot1/te"])
    assert (sim.settings_from(args).execute, sim.settings_from(args).real_time_factor, args.node) == (2, 0.2,
                                                                                                      "/robot1/te")
    with pytest.raises(SystemExit):
        parser.parse_args(["--execute", "9"])
    assert "got '9'" in capsys.readouterr().err
    assert sim.settings_from(parser.parse_args(["--fixed-delay", "2"])).fixed_delay == 2
    assert sim.settings_from(parser.parse_args([])).fixed_delay is None


def test_the_demo_closed_loop_takes_chunks_over_two_steps_after_their_goals_unless_told(capsys):
    import argparse

    from trajectory_ensemble_node.demo import demo

    parser = argparse.ArgumentParser()
    demo.add_arguments(parser)
    assert parser.parse_args([]).closed_loop_delay == 2
    assert parser.parse_args(["--closed-loop-delay", "arrival"]).closed_loop_delay is None
    assert parser.parse_args(["--closed-loop-delay", "1"]).closed_loop_delay == 1
    with pytest.raises(SystemExit):
        parser.parse_args(["--closed-loop-delay", "soon"])
    assert "got 'soon'" in capsys.readouterr().err


# --- one episode against the real node ---------------------------------------------------------------------------------


@pytest.mark.ros
@pytest.mark.slow
def test_one_short_episode_through_the_real_node_on_sim_time(tmp_path, ros_domain_id):
    pytest.importorskip("rclpy")
    pytest.importorskip("trajectory_ensemble_msgs")
    from trajectory_ensemble_node.ros.params import PARAMETERS
    from trajectory_ensemble_node.demo.sim_report import node_params, report, simulate

    if "continue_previous" not in {spec.name for spec in PARAMETERS}:
        pytest.skip("this node does not continue chunks yet (no continue_previous parameter)")

    from _node_harness import serve_node

    # Two rows per chunk, so an episode holds several switches even when the policy reaches the target in 8-9 steps.
    settings = SimSettings(real_time_factor=0.1, step_budget=14, candidates=4, execute=2)
    overrides = {**node_params(settings), "candidate_count": 4, "max_candidates": 8, "max_batch_candidates": 8,
                 "reducer": "mode", "instruction": task.INSTRUCTION}
    for _node, _client in serve_node(tmp_path, ros_domain_id, overrides):
        records = simulate(task.heldout_scenes(1), settings, wait_s=60.0, log=print)
    record = records[0]
    doc = report(records, settings)
    assert record.outcome in ("target", "collision", "budget") and len(record.positions) >= 2
    # Chunks were executed: the robot moved, and at least three chunks were switched in by their stamps.
    assert np.linalg.norm(np.asarray(record.positions[-1]) - record.positions[0]) > 0.05
    switches = [s for s in record.switches if s["time_s"] is not None]
    assert len(switches) >= 3
    for s in switches:
        # The first row executed is the first one whose stamped time (stamp + (k + 1) dt) was still ahead on arrival.
        k = s["first_row"]
        assert s["time_s"] == pytest.approx(s["stamp_s"] + (k + 1) * 0.125, abs=1e-6)
        assert s["time_s"] > s["arrival_s"] and (k == 0 or s["stamp_s"] + k * 0.125 <= s["arrival_s"] + 1e-9)
    goals = [g for g in record.goals if g.status == "SUCCEEDED"]
    assert goals[0].reset_context and not any(g.reset_context for g in goals[1:])
    # The node continued the executing chunk for every goal after the episode's first, and says how.
    for g in goals[1:]:
        assert g.continued, (g.continuity_status, g.index)
        assert g.continuity_status == "continued" and math.isfinite(g.seam_jump_node)
    # Where the chunk takes over after its frozen rows (it arrived before they were over), the sim measures the seam
    # the node reports; also past the end of the old chunk, where both compare with its last row (held). A chunk that
    # arrived later than its frozen rows takes over at a later row, where the node measures nothing.
    by_chunk = {s["chunk"]: s for s in switches}
    compared = [(by_chunk[g.index]["seam_jump_sim"], g.seam_jump_node) for g in goals[1:] if g.index in by_chunk
                and by_chunk[g.index]["first_row"] <= g.frozen_actions]
    assert compared and all(sim == pytest.approx(node, abs=1e-4) for sim, node in compared), compared
    assert doc["summary"]["continued_fraction"] == 1.0 and doc["episodes"][0]["scene_seed"] == record.scene_seed


@pytest.mark.ros
@pytest.mark.slow
def test_with_a_fixed_delay_every_chunk_takes_over_d_steps_after_its_goal_and_runs_repeat_exactly(
        tmp_path, ros_domain_id):
    pytest.importorskip("rclpy")
    pytest.importorskip("trajectory_ensemble_msgs")
    from trajectory_ensemble_node.demo.sim_report import node_params, simulate

    from _node_harness import serve_node

    # Real time: a group takes longer than the 2 steps, so the sim stops its clock for every chunk.
    settings = SimSettings(real_time_factor=1.0, step_budget=12, candidates=2, fixed_delay=2)
    overrides = {**node_params(settings), "candidate_count": 2, "max_candidates": 8, "max_batch_candidates": 8,
                 "instruction": task.INSTRUCTION}
    scene = task.heldout_scenes(1)[0]
    for _node, _client in serve_node(tmp_path, ros_domain_id, overrides):
        first, again = simulate([scene, scene], settings, wait_s=60.0, log=print)
    assert first.positions == again.positions and len(first.positions) >= 6, (first.positions, again.positions)
    goals = {g.index: g for g in first.goals if g.status == "SUCCEEDED"}
    later = [s for s in first.switches if s["chunk"] > 0]
    assert later, first.switches
    for s in later:
        goal = goals[s["chunk"]]
        # Taken over exactly 2 steps after the goal was sent, at row 2, the node's frozen count, as asked.
        assert s["arrival_s"] == pytest.approx(goal.sent_s + 2 * 0.125, abs=1e-9)
        assert s["first_row"] == 2 == goal.frozen_actions and goal.continued
        assert s["seam_jump_sim"] == pytest.approx(goal.seam_jump_node, abs=1e-4)
