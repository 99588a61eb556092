"""``bench --pusht`` on a tiny untrained PushT checkpoint: the JSON contract other checks read, methods paired by
seed (``single`` is candidate 0 of the same group: its episode is the one-candidate methods' at ``d = 0``, bit for
bit), continuity blocks per delay, a method the server refuses named on stderr and left out, and the same episodes
through openpi-client against ``serve-openpi`` as in process."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("gym_pusht")
pytest.importorskip("openpi_client.websocket_client_policy")

from trajectory_ensemble_lab.bench import cli
from trajectory_ensemble_lab.pusht import VALIDATION_SEED_BASE
from trajectory_ensemble_lab.pusht.evaluate import serve_params

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "openpi"))
from _openpi_harness import server_process  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

STEPS = 2
COMMON = ["--pusht", "--episodes", "2", "--seed", str(VALIDATION_SEED_BASE), "--count", "2", "--max-steps", "20",
          "--steps", str(STEPS), "--trace"]


def _bench(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


@pytest.fixture(scope="module")
def in_process(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("pusht_bench") / "bench.json"
    argv = [*COMMON, "--methods", "single,mode,mean,pose_gripper", "--delays", "0,2",
            "--continuity", "sync,naive_async,guided_mode", "--policy", str(checkpoint), "--json", str(out)]
    return _bench(argv), json.loads(out.read_text())


def test_the_json_has_every_method_and_delay_with_figures_in_range(in_process):
    status, document = in_process
    assert status == 0
    assert set(document["pusht"]) == {"single", "mode", "mean"}
    assert set(document["continuity"]) == {"sync", "naive_async", "guided_mode"}
    for name, figures in [*document["pusht"].items(),
                          *((f"{m}@{d}", f) for m, by_d in document["continuity"].items() for d, f in by_d.items())]:
        assert figures["episodes"] == 2, name
        assert 0.0 <= figures["coverage_mean"] <= 1.0 and 0.0 <= figures["success_rate"] <= 1.0, name
        low, high = figures["success_rate_ci95"]
        assert 0.0 <= low <= figures["success_rate"] <= high <= 1.0, name
        assert [e["env_seed"] for e in figures["per_episode"]] == [VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + 1]
        assert all(e["steps"] == 20 or e["success"] for e in figures["per_episode"]), name
        assert figures["seam_jump_mean"] >= 0.0
    assert {name: set(by_delay) for name, by_delay in document["continuity"].items()} == {
        "sync": {"0", "2"}, "naive_async": {"0", "2"}, "guided_mode": {"2"}}  # d = 0 cannot be asked of guidance
    settings = document["settings"]
    assert settings["through"] == "process" and settings["count"] == 2 and settings["delays"] == [0, 2]
    assert document["date"] and document["commit"] and document["started"] <= document["date"]
    assert set(document["latency"]["per_count"]) == {"1", "2"}
    assert document["latency"]["control_period_ms"] == 100.0


def test_single_is_candidate_zero_of_the_same_group(in_process):
    # Candidate 0 of a group of 2 with base seed s is the one-candidate draw with seed s (the seeding rule, batched
    # bit for bit), and at d = 0 sync and naive_async execute what single executes: the same episode, every step.
    _, document = in_process
    single = [e["actions"] for e in document["pusht"]["single"]["per_episode"]]
    for name in ("sync", "naive_async"):
        assert [e["actions"] for e in document["continuity"][name]["0"]["per_episode"]] == single, name
    assert [e["actions"] for e in document["pusht"]["mean"]["per_episode"]] != single


def test_continued_methods_freeze_their_first_rows(in_process):
    # guided_mode at d = 2 continues the session's chunk; naive_async switches from row 2 without a context. Both
    # executed their first chunk alike (the same first group), then went their own ways.
    _, document = in_process
    guided = document["continuity"]["guided_mode"]["2"]["per_episode"]
    naive = document["continuity"]["naive_async"]["2"]["per_episode"]
    for g, n in zip(guided, naive):
        assert len(g["seams"]) == len(n["seams"]) >= 1


def test_concurrent_episodes_are_the_serial_episodes(checkpoint, in_process, tmp_path, capsys):
    # Three episodes at once, co-batched in one engine (and a method the server refuses among them): each episode
    # reads only its own frames and seeds, so every method plays what the serial run played, in seed order.
    out = tmp_path / "concurrent.json"
    status = _bench([*COMMON, "--methods", "single,mode,mean,pose_gripper", "--delays", "0,2",
                     "--continuity", "sync,naive_async,guided_mode", "--concurrent", "3", "--policy", str(checkpoint),
                     "--json", str(out)])
    assert status == 0
    together, (_, serial) = json.loads(out.read_text()), in_process
    assert together["settings"]["concurrent"] == 3 and serial["settings"]["concurrent"] == 1
    assert together["latency"]["concurrent"] == 3 and serial["latency"]["concurrent"] == 1
    assert set(together["pusht"]) == {"single", "mode", "mean"}
    assert capsys.readouterr().err.count("method pose_gripper cannot run") == 1
    for name in ("single", "mode", "mean"):
        assert ([e["actions"] for e in together["pusht"][name]["per_episode"]]
                == [e["actions"] for e in serial["pusht"][name]["per_episode"]]), name
    for name, by_delay in serial["continuity"].items():
        for delay, figures in by_delay.items():
            mine = together["continuity"][name][delay]["per_episode"]
            assert [e["actions"] for e in mine] == [e["actions"] for e in figures["per_episode"]], (name, delay)
            assert [e["seams"] for e in mine] == [e["seams"] for e in figures["per_episode"]], (name, delay)


def test_a_method_the_server_refuses_is_named_and_left_out(checkpoint, tmp_path, capsys):
    out = tmp_path / "refused.json"
    status = _bench([*COMMON, "--episodes", "1", "--methods", "pose_gripper,single", "--policy", str(checkpoint),
                     "--json", str(out)])
    assert status == 0
    assert set(json.loads(out.read_text())["pusht"]) == {"single"}
    assert "method pose_gripper cannot run: REDUCER_INVALID_FOR_ACTION_SPACE (13)" in capsys.readouterr().err


def test_guidance_at_no_delay_is_named_and_left_out(checkpoint, tmp_path, capsys):
    # inference_delay 0 means the server's wall-time latency estimate: no request freezes exactly 0 rows.
    out = tmp_path / "d0.json"
    status = _bench([*COMMON, "--episodes", "1", "--methods", "single", "--continuity", "naive_async,guided_mode,bid",
                     "--delays", "0", "--policy", str(checkpoint), "--json", str(out)])
    assert status == 0
    assert set(json.loads(out.read_text())["continuity"]) == {"naive_async"}
    err = capsys.readouterr().err
    assert "method guided_mode cannot run: not at d = 0" in err and "method bid cannot run: not at d = 0" in err


@pytest.mark.parametrize(("flags", "says"), [
    (["--methods", "modal"], "'modal'"),
    (["--continuity", "guided_mode", "--delays", "8"], "--delays in 0..7"),
    (["--concurrent", "0", "--policy", "unused"], "--concurrent must be >= 1"),
])
def test_a_refused_setting_exits_2_and_says_why(flags, says, capsys):
    assert _bench([*COMMON, *flags]) == 2
    assert says in capsys.readouterr().err


def test_through_openpi_client_plays_the_same_episodes(checkpoint, in_process, tmp_path):
    params = serve_params(checkpoint, num_inference_steps=STEPS, candidate_count=2, reducer="mode")
    out = tmp_path / "wire.json"
    with server_process(tmp_path, params, env={"OMP_NUM_THREADS": "1"}) as server:
        status = _bench([*COMMON, "--methods", "single,mode", "--delays", "2", "--continuity", "guided_mode",
                         "--through", "openpi", "--url", f"ws://127.0.0.1:{server.port}", "--json", str(out)])
    assert status == 0
    wire, (_, local) = json.loads(out.read_text()), in_process
    for name in ("single", "mode"):
        assert ([e["actions"] for e in wire["pusht"][name]["per_episode"]]
                == [e["actions"] for e in local["pusht"][name]["per_episode"]]), name
    assert ([e["actions"] for e in wire["continuity"]["guided_mode"]["2"]["per_episode"]]
            == [e["actions"] for e in local["continuity"]["guided_mode"]["2"]["per_episode"]])


@pytest.mark.ros
@pytest.mark.slow
def test_through_the_node_plays_the_same_goals_as_in_process(checkpoint, in_process, tmp_path, ros_domain_id,
                                                             capsys):
    # The sim stops its clock until each chunk arrives (fixed delay), so the node serves the frame of the step its goal
    # was sent at, and goal c carries the in-process request c's seed: the same chunks, the same episode.
    pytest.importorskip("rclpy")
    pytest.importorskip("trajectory_ensemble_msgs")
    out = tmp_path / "node.json"
    status = _bench([*COMMON, "--episodes", "1", "--methods", "single,mode", "--delays", "2",
                     "--continuity", "guided_mode,temporal_ensemble", "--through", "node", "--policy", str(checkpoint),
                     "--json", str(out)])
    assert status == 0
    assert os.environ["ROS_DOMAIN_ID"] == str(ros_domain_id)  # the bench's own domain does not leak into the session
    node, (_, local) = json.loads(out.read_text()), in_process
    assert "method temporal_ensemble cannot run: not through the node" in capsys.readouterr().err
    assert set(node["continuity"]) == {"guided_mode"}
    for name in ("single", "mode"):
        first = node["pusht"][name]["per_episode"][0]
        assert first["env_seed"] == VALIDATION_SEED_BASE
        assert first["actions"] == local["pusht"][name]["per_episode"][0]["actions"], name
    guided = node["continuity"]["guided_mode"]["2"]["per_episode"][0]
    assert guided["steps"] == 20 or guided["success"]
    assert len(guided["seams"]) >= 1


def test_without_policy_an_install_without_the_bundled_weights_is_refused_by_name(monkeypatch, tmp_path, capsys):
    from trajectory_ensemble_node import bundled

    absent = bundled.BundledPolicy("pusht", tmp_path / "absent", "PushT", rebuild="train-pusht")
    monkeypatch.setattr(bundled, "bundled_policy", lambda name: absent if name == "pusht" else None)
    assert _bench(COMMON) == 2
    assert "serves the bundled model: pusht, whose weights this install lacks; give --policy DIR" in \
        capsys.readouterr().err


def test_without_policy_the_bundled_pusht_model_is_served(tmp_path):
    from trajectory_ensemble_node.bundled import bundled_policy

    if not (bundled_policy("pusht").directory / "model_index.json").is_file():
        pytest.skip("this install has no bundled PushT weights")
    out = tmp_path / "shipped.json"
    assert _bench(["--pusht", "--episodes", "1", "--seed", str(VALIDATION_SEED_BASE), "--count", "2",
                   "--max-steps", "8", "--steps", "2", "--methods", "single", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["settings"]["policy"] == str(bundled_policy("pusht").directory)
    assert record["pusht"]["single"]["episodes"] == 1
