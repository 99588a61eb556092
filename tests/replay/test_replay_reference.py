"""``replay --reference-topic`` over DDS against the real node (toy policy, one node for the module, through
``trajectory_ensemble_node.testing``): the figures recomputed from the recorded bag with ``rosbags`` alone, the gate,
the bad-reference errors, and ``replay`` without the flag as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trajectory_ensemble_node.testing import DEMO_REFERENCE_TOPIC, DEMONSTRATION_BAG, ReplayNode, ReplayTestError
from trajectory_ensemble_node.replay import bags

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NS = "/trajectory_ensemble"
JOINTS = ["robot_x", "robot_y"]
CONFIGS = {"mode@8": {"candidates": 8, "reducer": "mode", "return_candidates": True},
           "mean@8": {"candidates": 8, "reducer": "mean", "return_candidates": True},
           "single": {"candidates": 1}}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplayNode]:
    """The node on the shipped toy policy, its action channels named like the demonstration's joints."""
    pytest.importorskip("trajectory_ensemble_msgs")
    with ReplayNode({"device": "cpu", "joint_names": JOINTS}, out=tmp_path_factory.mktemp("node")) as running:
        yield running


@pytest.fixture(scope="module")
def small_bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two demonstrations plus extra action topics: a 3-wide array, the path 100 s later, a 2-wide array."""
    folder = tmp_path_factory.mktemp("bags")
    demo = bags.make_demo_bag(folder / "demo", scene_offsets=(10, 11), reference=True)
    types = bags.typestore().types
    layout = types["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
    path = folder / "small"
    with bags.BagRecorder(path, "mcap", custom_data=demo.custom_data) as out:
        for topic, msgtype, t_ns, data in bags.iter_raw(demo.path, [t.name for t in demo.topics]):
            out.write(topic, msgtype, t_ns, data)
            if topic == bags.DEMO_STATE_TOPIC:
                position = bags.deserialize(data, msgtype).position
                out.write_msg("/wide", t_ns, types["std_msgs/msg/Float64MultiArray"](
                    layout=layout, data=np.array([*position, 0.0])))
                out.write_msg("/arrays", t_ns, types["std_msgs/msg/Float32MultiArray"](
                    layout=layout, data=np.asarray(position, np.float32)))
            if topic == bags.DEMO_REFERENCE_TOPIC:
                msg = bags.deserialize(data, msgtype)
                msg.header.stamp.sec += 100
                out.write_msg("/later", t_ns, msg)
    return path


# --- an analysis that shares nothing with the tool's: rosbags, numpy, the message definitions -----------------------


def _store() -> Any:
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.ROS2_KILTED)
    for name in ("ActionTrajectory", "CandidateArray"):
        text = (ROOT / "msg" / "msg" / f"{name}.msg").read_text()
        store.register(get_types_from_msg(text, f"trajectory_ensemble_msgs/msg/{name}"))
    return store


def _read(path: Path, topic: str) -> list[Any]:
    from rosbags.rosbag2 import Reader

    store = _store()
    with Reader(path) as reader:
        connections = [c for c in reader.connections if c.topic == topic]
        return [store.deserialize_cdr(raw, c.msgtype) for c, _, raw in reader.messages(connections=connections)]


def _ns(stamp: Any) -> int:
    return stamp.sec * 10**9 + stamp.nanosec


def recompute(bag: Path, with_candidates: bool) -> dict[str, Any]:
    """The open-loop figures from the recorded bag alone: the reference topic and the node's outputs in it."""
    points: dict[str, list[tuple[int, float]]] = {}
    for msg in _read(bag, DEMO_REFERENCE_TOPIC):
        for point in msg.points:
            t = _ns(msg.header.stamp) + point.time_from_start.sec * 10**9 + point.time_from_start.nanosec
            for name, value in zip(msg.joint_names, point.positions):
                points.setdefault(name, []).append((t, float(value)))
    candidates = {_ns(m.header.stamp): np.asarray(m.data, np.float64).reshape(-1, m.horizon, m.action_dim)
                  for m in _read(bag, f"{NS}/candidates")} if with_candidates else {}
    errors, by_step, best_errors, ranks, past = [], {}, [], [], 0
    for msg in _read(bag, f"{NS}/trajectory"):
        served = np.asarray(msg.data, np.float64).reshape(msg.horizon, msg.action_dim)
        stamp = _ns(msg.header.stamp)
        recorded = np.full(served.shape, np.nan)
        for c, name in enumerate(JOINTS):
            t, v = (np.array(x) for x in zip(*sorted(points[name])))
            for k in range(msg.horizon):
                when = stamp + round((k + 1) * float(msg.dt) * 1e9)
                if t[0] <= when <= t[-1]:
                    recorded[k, c] = np.interp((when - t[0]) / 1e9, (t - t[0]) / 1e9, v)
        inside = ~np.isnan(recorded).any(axis=1)
        past += int((~inside).sum())
        err = (served - recorded)[inside]
        errors.append(err)
        for k in np.flatnonzero(inside):
            by_step.setdefault(int(k), []).append(served[k] - recorded[k])
        if stamp in candidates:
            scores = [np.sqrt(np.mean((cand - recorded)[inside] ** 2)) for cand in candidates[stamp]]
            best_errors.append((candidates[stamp][int(np.argmin(scores))] - recorded)[inside])
            ranks.append(1 + sum(s < np.sqrt(np.mean(err ** 2)) for s in scores))
    rows = np.concatenate(errors)
    out = {"rmse": np.sqrt(np.mean(rows ** 2)), "rows_compared": len(rows), "rows_past_recording": past,
           "rmse_per_channel": {n: np.sqrt(np.mean(rows[:, c] ** 2)) for c, n in enumerate(JOINTS)},
           "mae_per_channel": {n: np.mean(np.abs(rows[:, c])) for c, n in enumerate(JOINTS)},
           "error_by_step": [np.sqrt(np.mean(np.square(by_step[k]))) for k in sorted(by_step)]}
    if with_candidates:
        out["best_candidate_rmse"] = np.sqrt(np.mean(np.concatenate(best_errors) ** 2))
        out["served_ranks"] = ranks
    return out


@pytest.mark.parametrize("config", list(CONFIGS))
def test_figures_recomputed_from_the_recorded_bag(node: ReplayNode, config: str) -> None:
    """Acceptance 1: the figures of mode@8, mean@8 and one candidate on the bundled demonstration bag equal
    those computed from the recorded bag with rosbags and numpy alone."""
    options = CONFIGS[config]
    run = node.replay(DEMONSTRATION_BAG, DEMO_REFERENCE_TOPIC, seed=0, name=config.replace("@", "_"), **options)
    assert run.exit_status == 0, run.output
    section = run.reference
    assert section is not None and section["matched_by"] == "joint_names" and section["channels"] == JOINTS
    goals = len(run.summary["goals"])
    assert goals == 6 and section["goals_compared"] == goals
    independent = recompute(run.bag, with_candidates=bool(options.get("return_candidates")))
    assert section["rows_compared"] == independent["rows_compared"] == 6 * 8
    assert section["rows_past_recording"] == independent["rows_past_recording"] == 0
    assert section["rmse"] == pytest.approx(independent["rmse"], rel=1e-9)
    for key in ("rmse_per_channel", "mae_per_channel"):
        assert section[key] == pytest.approx(independent[key], rel=1e-9), key
    assert section["error_by_step"] == pytest.approx(independent["error_by_step"], rel=1e-9)
    if options.get("return_candidates"):
        assert section["best_candidate_rmse"] == pytest.approx(independent["best_candidate_rmse"], rel=1e-9)
        assert [g["served_rank"] for g in section["goals"]] == independent["served_ranks"]
        assert section["best_candidate_rmse"] <= section["rmse"]
    for picture in ("reference.png", "error_by_step.png"):
        assert (run.out / picture).stat().st_size > 10_000
    # The recorded bag holds the reference topic as the input bag had it.
    assert len(bags.read_messages(run.bag, DEMO_REFERENCE_TOPIC)) == 6


def test_gate_exit_status_and_lines(node: ReplayNode, small_bag: Path) -> None:
    """Acceptance 2, the gate: a limit below the error exits 1 naming channel, goal and value; above it, 0."""
    strict = node.replay(small_bag, DEMO_REFERENCE_TOPIC, candidates=2, max_rmse=1e-4,
                         max_rmse_channel={"robot_y": 1e-4})
    assert strict.exit_status == 1, strict.output
    section = strict.reference
    lines = [line for line in strict.output.splitlines() if line.startswith("error: gate:")]
    assert len(lines) == 2 and strict.gate_failures == [line[len("error: "):] for line in lines]
    worst = max(section["goals"], key=lambda g: g["rmse"])
    assert f"rmse {section['rmse']:.4f} over channels robot_x, robot_y" in lines[0]
    assert f"worst goal {worst['index']}: {worst['rmse']:.4f}" in lines[0] and "exceeds --max-rmse 0.0001" in lines[0]
    worst_y = max(section["goals"], key=lambda g: g["rmse_per_channel"]["robot_y"])
    assert lines[1] == (f"error: gate: channel robot_y rmse {section['rmse_per_channel']['robot_y']:.4f} (worst goal "
                        f"{worst_y['index']}: {worst_y['rmse_per_channel']['robot_y']:.4f}) exceeds "
                        "--max-rmse-channel robot_y=0.0001")
    assert strict.summary["problems"] == []
    loose = node.replay(small_bag, DEMO_REFERENCE_TOPIC, candidates=2, max_rmse=10.0,
                        max_rmse_channel={"robot_x": 10.0, "robot_y": 10.0})
    assert loose.exit_status == 0, loose.output
    assert loose.gate_failures == [] and len(loose.reference["gate"]["passed"]) == 3


@pytest.mark.parametrize(("topic", "extra", "message"), [
    ("/nope", [], r"--reference-topic '/nope': no such topic in .*topics of accepted types: \['/arrays', "
                  r"'/joint_states', '/later', '/reference/actions', '/wide'\]"),
    ("/wide", [], r"width mismatch: the served chunks have 2 action channels, /wide \(std_msgs/msg/Float64MultiArray"
                  r", 4 messages, 3 unnamed channels\) has 3"),
    ("/later", [], r"no time overlap: the served rows stand at .* /later is recorded at"),
    ("/reference/actions", ["--max-rmse-channel", "gripper=1"], r"--max-rmse-channel gripper=1: no compared "
                                                                r"channel 'gripper'"),
])
def test_bad_reference_exits_2_naming_it(node: ReplayNode, small_bag: Path, topic: str, extra: list[str],
                                         message: str) -> None:
    """Acceptance 2, bad references: unknown topic, width mismatch, no overlap in time (and a limit on a channel
    that is not compared) exit 2 with a message naming it."""
    import re

    with pytest.raises(ReplayTestError, match=r"replay exit status 2") as caught:
        node.replay(small_bag, topic, candidates=1, extra_args=extra)
    assert re.search(r"error: (reference: )?" + message, str(caught.value)), str(caught.value)


def test_array_reference_by_index_and_channel_choice(node: ReplayNode, small_bag: Path) -> None:
    """Float32MultiArray at log time, by index; --reference-channels picks recorded channels (here x for both)."""
    run = node.replay(small_bag, "/arrays", candidates=1)
    assert run.exit_status == 0, run.output
    assert run.reference["matched_by"] == "index" and run.reference["channels"] == JOINTS
    assert run.reference["rows_compared"] > 0
    chosen = node.replay(small_bag, "/wide", candidates=1, reference_channels=["0", "-"])
    assert chosen.exit_status == 0, chosen.output
    assert chosen.reference["channels"] == ["robot_x"] and chosen.reference["matched_by"] == "--reference-channels"


def test_without_reference_topic_nothing_changes(node: ReplayNode, small_bag: Path) -> None:
    """Acceptance 5: no --reference-topic, no reference section, plot or topic; the summary keys of before."""
    run = node.replay(small_bag, None, candidates=2, return_candidates=True)
    assert run.exit_status == 0, run.output
    assert set(run.summary) == {"bag", "recorded", "problems", "goals"}
    assert not (run.out / "reference.png").exists() and not (run.out / "error_by_step.png").exists()
    assert DEMO_REFERENCE_TOPIC not in {t.name for t in bags.bag_info(run.bag).topics}
    assert not any(line.startswith("reference") for line in run.output.splitlines())
