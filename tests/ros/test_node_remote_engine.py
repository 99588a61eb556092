"""Acceptances 1 and 2 of issue 48: the node with ``engine: openpi`` against a ``serve-openpi`` the test starts, over
DDS.

- a goal equals, bitwise, the same group of the local model (the Python API on the same image and seed);
- a preempted and a canceled goal end their remote requests (the server's ``canceled_on_disconnect``);
- killing the server mid-goal ends the goal with ``REMOTE_DISCONNECTED`` well within its deadline, and after a
  restart on the same port the next goal succeeds;
- against a server restarted as one sample per request (``openpi_samples_per_request: 1``), a goal of N = 8 is 8
  seeded requests reduced on the node, equal bitwise to the local group.

The node and every server are subprocesses; the paced server (``TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S``) holds a group
in its engine for seconds, so cancel, preemption and the kill land mid-group however fast the machine is.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openpi"))  # the OpenPI tests' harness

from _node_harness import BASE_PARAMS, serve_node, succeeded  # noqa: E402
from _openpi_harness import ServerProcess, toy_image, wait_until, write_params  # noqa: E402

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine.context import ExecutionContext
from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel
from trajectory_ensemble_node.toy import ACTION_SETTINGS, INSTRUCTION, load_toy_pipeline, request_kwargs

pytestmark = [pytest.mark.ros, pytest.mark.slow]

SERVED = {**BASE_PARAMS, **ACTION_SETTINGS, "model": "toy", "instruction": INSTRUCTION, "reducer": "mode",
          "candidate_count": 4, "max_candidates": 8, "max_batch_candidates": 8, "max_observation_age_s": 120.0}
STEP_DELAY_S = 1.0
"""The paced server's sleep per step: a 10-step group stays in its engine about 10 s, time enough for a goal, a
cancel or a kill to reach it on a loaded machine."""


def start_server(tmp, name: str, port: int, step_delay_s: float = 0.0, **overrides) -> ServerProcess:
    params = write_params(tmp / f"{name}.yaml", {**SERVED, **overrides})
    env = {"TRAJECTORY_ENSEMBLE_TESTING": "1", "TRAJECTORY_ENSEMBLE_TEST_STEP_DELAY_S": str(step_delay_s)}
    server = ServerProcess(["--params-file", str(params), "--port", str(port)], tmp / f"{name}.log", env)
    server.wait_ready()
    return server


def stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as response:
        return json.loads(response.read())


def running_after(port: int, ended: int) -> bool:
    """Whether ``ended`` groups have ended on the server and the next one is in its engine."""
    now = stats(port)
    return sum(now["groups"].values()) == ended and now["in_engine"] == 1


@pytest.fixture(scope="module")
def remote(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("remote_engine")
    servers = [start_server(tmp, "server-1", 0)]
    port = servers[0].port
    nodes = serve_node(tmp, ros_domain_id, {**SERVED, "engine": "openpi", "engine_url": f"ws://127.0.0.1:{port}",
                                            "engine_timeout_s": 30.0})
    _node, ros = next(nodes)
    try:
        yield tmp, ros, port, servers
    finally:
        for server in servers:
            server.kill()
        nodes.close()


def test_a_goal_on_the_remote_engine_equals_the_local_group_bitwise(remote):
    _tmp, ros, port, _servers = remote
    image, seed = toy_image(seed=4), 2**63 + 11
    ros.publish_rgb(image, stamp_sec=1001.0)
    goal = succeeded(ros.run_goal(use_seed=True, seed=seed, candidate_count=4, reducer="mode"))
    local = Cosmos3ActionModel(load_toy_pipeline()).generate(
        **request_kwargs(image), spec=CandidateTrajectorySpec(count=4, reducer="mode"), base_seed=seed)
    assert goal.base_seed == seed and goal.error_code == ErrorCode.OK
    np.testing.assert_array_equal(np.asarray(goal.trajectory.data, dtype=np.float32).reshape(8, 2),
                                  local.action.numpy())
    assert stats(port)["server"]["replies"] == 1

    # The next goal continues it: the node's own decision (frozen count, alignment by stamps) travels as the
    # request's context extra, and the server guides and selects as the local engine would.
    later = toy_image(seed=6)
    ros.publish_rgb(later, stamp_sec=1001.25)  # two actions (dt 0.125 s) after the first chunk's observation
    continued = succeeded(ros.run_goal(use_seed=True, seed=seed, candidate_count=4, continue_previous=True,
                                       inference_delay=1))
    assert continued.continuity.continued and continued.continuity.frozen_actions == 1
    assert continued.continuity.shift == 2
    context = ExecutionContext(local.action.clone(), previous_stamp=1001.0, dt=0.125, frozen=1, stamp=1001.25)
    local_continued = Cosmos3ActionModel(load_toy_pipeline()).generate(
        **request_kwargs(later), spec=CandidateTrajectorySpec(count=4, reducer="mode_continuity"), base_seed=seed,
        context=context)
    np.testing.assert_array_equal(np.asarray(continued.trajectory.data, dtype=np.float32).reshape(8, 2),
                                  local_continued.action.numpy())
    assert stats(port)["server"]["replies"] == 2


def test_preempt_and_cancel_end_the_remote_requests_then_a_killed_server_fails_the_goal_and_a_restart_serves(remote):
    tmp, ros, port, servers = remote
    servers[0].kill()  # the same port, now paced: groups stay in the engine long enough to be ended mid-way
    servers.append(start_server(tmp, "server-2", port, STEP_DELAY_S))
    ros.publish_rgb(toy_image(seed=5), stamp_sec=1002.0)
    ended = sum(stats(port)["groups"].values())  # whatever the server ran at its start

    first = ros.send_goal(candidate_count=2)
    wait_until(lambda: running_after(port, ended + 0), what="the first goal's group in the remote engine")
    second = ros.send_goal(candidate_count=2)  # goal_policy preempt: the first goal's request is ended
    ros.result(first)
    assert first.result.error_code == ErrorCode.PREEMPTED
    wait_until(lambda: stats(port)["server"].get("canceled_on_disconnect", 0) == 1, what="the preempted request")
    wait_until(lambda: running_after(port, ended + 1), what="the second goal's group in the remote engine")
    ros.cancel(second)
    ros.result(second)
    assert second.result.error_code == ErrorCode.CANCELED
    wait_until(lambda: stats(port)["server"].get("canceled_on_disconnect", 0) == 2, what="the canceled request")

    deadline_s = 60.0
    third = ros.send_goal(candidate_count=2, deadline=_duration(deadline_s))
    wait_until(lambda: running_after(port, ended + 2), what="the third goal's group in the remote engine")
    killed = time.monotonic()
    servers[-1].kill()
    ros.result(third)
    assert third.result.error_code in (ErrorCode.REMOTE_DISCONNECTED, ErrorCode.REMOTE_UNREACHABLE), \
        third.result.error_message
    assert time.monotonic() - killed < deadline_s

    servers.append(start_server(tmp, "server-3", port))
    goal = succeeded(ros.run_goal(candidate_count=2))
    assert goal.error_code == ErrorCode.OK
    assert stats(port)["server"]["replies"] == 1


def test_against_a_one_sample_server_a_goal_of_8_is_8_seeded_requests_equal_to_the_local_group(remote):
    """Acceptance 2: the server restarts as a one-sample-per-request server; the node notices at the next goal."""
    tmp, ros, port, servers = remote
    servers[-1].kill()
    servers.append(start_server(tmp, "server-one-sample", port, openpi_samples_per_request=1))
    image, seed = toy_image(seed=8), 99
    ros.publish_rgb(image, stamp_sec=1003.0)
    goal = succeeded(ros.run_goal(use_seed=True, seed=seed, candidate_count=8, reducer="mode"))
    local = Cosmos3ActionModel(load_toy_pipeline()).generate(
        **request_kwargs(image), spec=CandidateTrajectorySpec(count=8, reducer="mode"), base_seed=seed)
    np.testing.assert_array_equal(np.asarray(goal.trajectory.data, dtype=np.float32).reshape(8, 2),
                                  local.action.numpy())
    assert stats(port)["server"]["requests"] == stats(port)["server"]["replies"] == 8


def _duration(seconds: float):
    from builtin_interfaces.msg import Duration

    return Duration(sec=int(seconds), nanosec=int((seconds % 1) * 1e9))
