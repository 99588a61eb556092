"""``pusht-eval`` on a tiny untrained PushT checkpoint (the trainer's own builder, 0 steps): short closed-loop episodes
through openpi-client against a real ``serve-openpi`` process and through the server's policy in this process give the
same chunks, executed actions and T poses bit for bit, and the same coverage to 1e-12 (gym-pusht sums the T's
polygons in the order of a set, which differs between env objects), with and without an inference delay; the coverage
is the env's own; a refused setting exits 2 with its named code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gym_pusht")
pytest.importorskip("openpi_client.websocket_client_policy")

from trajectory_ensemble_node.serving.params import validate
from trajectory_ensemble_lab.pusht import VALIDATION_SEED_BASE
from trajectory_ensemble_lab.pusht import evaluate as ev
from trajectory_ensemble_lab.pusht.sim import make_env

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "openpi"))
from _openpi_harness import server_process  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")

SEEDS = (VALIDATION_SEED_BASE, VALIDATION_SEED_BASE + 1)
SERVE = {"num_inference_steps": 2, "candidate_count": 2, "reducer": "mode"}
EPISODE = {"count": 2, "reducer": "mode", "max_steps": 20}


@pytest.fixture(scope="module")
def faces(checkpoint, tmp_path_factory):
    """The policy in process, and openpi-client against ``serve-openpi`` on the same params (the server's URL)."""
    params = ev.serve_params(checkpoint, **SERVE)
    python = ev.InProcessPolicy(validate(params))
    with server_process(tmp_path_factory.mktemp("pusht_eval_server"), params,
                        env={"OMP_NUM_THREADS": "1"}) as server:
        url = f"ws://127.0.0.1:{server.port}"
        wire = ev.WirePolicy(url)
        try:
            yield python, wire, url
        finally:
            wire.close()
            python.close()


class _Spy:
    """A policy that keeps each chunk it serves."""

    def __init__(self, policy, served: list[np.ndarray]) -> None:
        self.policy, self.served, self.metadata = policy, served, policy.metadata

    def infer(self, obs):
        reply = self.policy.infer(obs)
        if "actions" in reply:
            self.served.append(np.asarray(reply["actions"]))
        return reply


def _replayed_coverage(env_seed: int, actions: list[list[float]]) -> list[float]:
    env = make_env(pixels=True)
    env.reset(seed=env_seed)
    return [float(env.step(np.asarray(a, dtype=np.float32))[4]["coverage"]) for a in actions]


@pytest.mark.parametrize("delay", [0, 2])
def test_the_wire_and_the_policy_in_process_play_the_same_episode_bitwise(faces, delay):
    python, wire, _ = faces
    assert ev.check_served(wire.metadata, ev.EXECUTE, delay) == 16 == ev.check_served(python.metadata, 8, delay)
    for seed in SEEDS[: 1 if delay else 2]:
        a = ev.run_episode(python, seed, delay=delay, **EPISODE)
        b = ev.run_episode(wire, seed, delay=delay, **EPISODE)
        # The same chunks, executed bit for bit, move the T along the same poses bit for bit. The env's own coverage
        # agrees to its last bit only: gym-pusht sums the T's polygons in the order of a set of pymunk shapes, which
        # follows memory addresses, so one pose can give two coverages 1 ulp apart in two env instances.
        assert a.actions == b.actions and a.poses == b.poses and a.continuity == b.continuity
        assert a.coverage == pytest.approx(b.coverage, abs=1e-12)
        assert (a.steps, a.requests, a.success) == (b.steps, b.requests, b.success)
        assert a.max_coverage == pytest.approx(b.max_coverage, abs=1e-12)
        assert a.steps == len(a.actions) == 20 and a.requests == 3
        # The coverage is the env's own: the executed targets replayed in a fresh env give it again.
        assert a.coverage == pytest.approx(_replayed_coverage(seed, a.actions), abs=1e-12)
        assert a.max_coverage == max(a.coverage)
        # Targets in env pixels (denormalized by action_stats.json), not the model's [-1, 1].
        assert np.abs(np.asarray(a.actions)).max() > 2.0
        if delay:
            assert a.continuity[0] == "no previous chunk" and set(a.continuity[1:]) == {"continued"}
            # While chunk k + 1 is inferred the env executes rows 8, 9 of chunk k; those are the rows the server
            # froze at the head of chunk k + 1 (to the float32 round trip of its normalization), so stamps align.
            served: list[np.ndarray] = []
            spy = _Spy(python, served)
            assert ev.run_episode(spy, seed, delay=delay, **EPISODE).actions == a.actions
            for before, after in zip(served, served[1:]):
                np.testing.assert_allclose(after[:delay], before[8:8 + delay], atol=1e-3)
            assert a.actions[8:10] == served[0][8:10].tolist() and a.actions[10:16] == served[1][2:8].tolist()
        else:
            assert set(a.continuity) == {"not requested"}


def test_pusht_eval_writes_the_same_records_through_both_faces(faces, checkpoint, tmp_path, capsys):
    _, _, url = faces
    common = ["--episodes", "2", "--max-steps", "12", "--count", "2", "--reducer", "mode", "--trace"]
    assert ev.main(["--through", "python", "--policy", str(checkpoint), "--steps", "2", *common,
                    "--json", str(tmp_path / "python.json")]) == 0
    assert ev.main(["--through", "openpi", "--url", url, *common, "--json", str(tmp_path / "openpi.json")]) == 0
    python, wire = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("python", "openpi"))
    for record in (python, wire):
        assert {"date", "commit", "episodes", "successes", "success_rate", "success_rate_ci95", "coverage_mean",
                "requests", "settings", "per_episode"} <= set(record)
        assert record["episodes"] == 2 and record["settings"]["seed"] == VALIDATION_SEED_BASE
        for episode in record["per_episode"]:
            assert set(episode) == {"env_seed", "steps", "max_coverage", "success", "requests", "seconds"}
        low, high = record["success_rate_ci95"]
        assert 0.0 <= low <= record["success_rate"] <= high <= 1.0
        assert record["coverage_mean"] == pytest.approx(np.mean([e["max_coverage"] for e in record["per_episode"]]))
    for a, b in zip(python["trace"], wire["trace"], strict=True):
        assert a["actions"] == b["actions"] and a["poses"] == b["poses"] and a["continuity"] == b["continuity"]
        assert a["coverage"] == pytest.approx(b["coverage"], abs=1e-12)
    for a, b in zip(python["per_episode"], wire["per_episode"], strict=True):
        assert {**a, "seconds": 0, "max_coverage": 0} == {**b, "seconds": 0, "max_coverage": 0}
        assert a["max_coverage"] == pytest.approx(b["max_coverage"], abs=1e-12)
    assert "success 0/2" in capsys.readouterr().out or python["successes"] > 0


@pytest.mark.parametrize(("flags", "says"), [
    (["--split", "validation", "--seed", "199999", "--episodes", "2"], "leaves the validation starts"),
    (["--seed", "200000"], "leaves the validation starts"),
    (["--execute", "8", "--delay", "8"], "--delay in 0..execute - 1"),
    (["--through", "python"], "--through python needs --policy"),
    (["--max-steps", "301"], "--max-steps must be in 1..300"),
])
def test_a_refused_setting_exits_2_with_its_named_code(flags, says, capsys):
    assert ev.main(flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: INVALID_PARAMETERS (52): ") and says in err


def test_a_request_the_server_refuses_exits_2_with_the_servers_named_code(faces, capsys):
    _, _, url = faces
    assert ev.main(["--through", "openpi", "--url", url, "--episodes", "1", "--max-steps", "4",
                    "--reducer", "nope"]) == 2
    assert "error: UNKNOWN_REDUCER (12): unknown reducer 'nope'" in capsys.readouterr().err


def test_a_checkpoint_without_action_stats_is_refused(tmp_path, capsys):
    assert ev.main(["--policy", str(tmp_path), "--write-params", str(tmp_path / "p.yaml")]) == 2
    assert "no action_stats.json" in capsys.readouterr().err
