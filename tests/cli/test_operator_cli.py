"""``send-goal``, ``diagnostics`` and ``params`` as a user runs them: CLI subprocesses against a real node over DDS.

One node serves the module (tiny model, droid_lerobot: width 10, chunk 8, 3 steps) with ``goal_policy: reject``, one
candidate per microbatch and a test-only pause before every forward, so a goal of 8 candidates runs long enough for a
second goal to be rejected and for Ctrl-C to land while it denoises.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("rclpy")
pytest.importorskip("trajectory_ensemble_msgs")

from _node_harness import NODE, NS, serve_node, stamp_sec  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

CLI_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def served(tmp_path_factory, ros_domain_id):
    tmp = tmp_path_factory.mktemp("operator_cli")
    # 0.8 s per physical forward: the 8-candidate goal of the Ctrl-C test (24 forwards) must outlast another
    # send-goal's start on a loaded CPU. Its first goal is no longer slowed by one-time costs: the node measures
    # its costs at start-up.
    yield from serve_node(tmp, ros_domain_id, {"goal_policy": "reject", "max_batch_candidates": 1,
                                               "max_observation_age_s": 120.0}, step_delay_s=0.8)


@pytest.fixture
def env(ros_env):
    return ros_env


def cli(env, *args: str, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trajectory_ensemble_node.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def field(stdout: str, name: str) -> str:
    """The value of a ``  name: value`` result line."""
    return next(line.split(": ", 1)[1] for line in stdout.splitlines() if line.strip().startswith(f"{name}:"))


class _Running:
    """A CLI subprocess whose stdout lines are collected as they come."""

    def __init__(self, env, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "trajectory_ensemble_node.cli", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, predicate, timeout: float, what: str, count: int = 1) -> str:
        """The ``count``-th line that satisfies ``predicate``, once printed (AssertionError on exit or timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in list(self.lines) if predicate(line)]
            if len(found) >= count:
                return found[count - 1]
            if self.proc.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no {what} (exit status {self.proc.poll()}):\n" + "\n".join(self.lines))

    def finish(self, timeout: float = CLI_TIMEOUT_S) -> tuple[int, str]:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code, "\n".join(self.lines)


@pytest.fixture
def running(env) -> Iterator[list[_Running]]:
    started: list[_Running] = []
    yield started
    for item in started:
        if item.proc.poll() is None:
            item.proc.kill()
            item.proc.wait(10)


def test_send_goal_with_a_toy_scene_prints_feedback_and_the_result_of_the_published_trajectory(served, env):
    client = served[1]
    client.clear("trajectory")
    proc = cli(env, "send-goal", "--count", "2", "--seed", "11", "--toy-scene", "5", "--return-candidates",
               "--instruction", "reach the target", "--print-data")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert f"published toy scene 5 on {NS}/observation/image (256x256 rgb8" in out
    lines = out.splitlines()
    accepted = next(i for i, line in enumerate(lines) if line.startswith("goal ") and "accepted by" in line)
    feedback = [line for line in lines if line.startswith("feedback: ")]
    assert feedback[-1] == "feedback: done 3/3" and "feedback: reducing 3/3" in feedback
    assert "feedback: denoising 3/3" in feedback
    assert all(lines.index(line) > accepted for line in feedback)
    assert "result: SUCCEEDED" in lines and lines.index("feedback: done 3/3") < lines.index("result: SUCCEEDED")
    assert field(out, "error") == "0 OK" and field(out, "base_seed") == "11"
    assert field(out, "weights_version") == "0"
    assert field(out, "trajectory").startswith("8 x 10 (horizon x action_dim), reducer mean, 2 candidates, dt 0.1 s")
    assert field(out, "candidates").startswith("2 x 8 x 10, seeds [11, ")
    assert sum(line.startswith("    ") and ": " in line for line in lines) == 8 + 2  # rows, then candidates
    assert float(field(out, "metrics.total_ms")) > 0
    assert field(out, "validity") == "2 valid, 0 dropped"
    assert field(out, "steps") == "3 used of 3 planned (3 fitted to the deadline)"
    assert field(out, "continuity") == "not requested"
    # What it printed is what the node published: the stamp is the toy frame's.
    published = client.wait(lambda: client.messages("trajectory"), 10, "~/trajectory")[-1]
    printed_stamp = field(out, "trajectory").rsplit("stamp ", 1)[1]
    assert f"{stamp_sec(published)}.{published.header.stamp.nanosec:09d}" == printed_stamp
    assert published.base_seed == 11 and published.candidate_count == 2


def test_params_list_get_and_set_through_the_parameter_services(served, env):
    listed = cli(env, "params", "list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert ["candidate_count", "=", "3", "(integer,", "read-only)"] in rows, listed.stdout
    assert ["fault_injection", "=", "''", "(string,", "writable)"] in rows, listed.stdout
    assert cli(env, "params", "get", "max_candidates").stdout == "8\n"
    assert cli(env, "params", "get", "fps", "--node", NS).stdout == "10.0\n"

    read_only = cli(env, "params", "set", "candidate_count", "4")
    assert read_only.returncode == 1 and "refused candidate_count = 4" in read_only.stderr
    assert "read-only" in read_only.stderr
    refused = cli(env, "params", "set", "fault_injection", "bogus")
    # The node's own reason, quoting the value.
    assert refused.returncode == 1 and "'bogus' is not one of" in refused.stderr, refused.stderr
    wrong_type = cli(env, "params", "set", "fps", "fast")
    assert wrong_type.returncode == 2 and "fps is a double parameter: expected a number, got 'fast'" in \
        wrong_type.stderr
    missing = cli(env, "params", "get", "no_such_parameter")
    assert missing.returncode == 1 and f"{NS} has no parameter 'no_such_parameter'" in missing.stderr
    assert cli(env, "params", "get", "candidate_count").stdout == "3\n"  # nothing changed


def test_a_fault_armed_with_params_set_makes_send_goal_exit_aborted(served, env):
    armed = cli(env, "params", "set", "fault_injection", "engine_exception")
    assert armed.returncode == 0 and armed.stdout == "set fault_injection = engine_exception (string)\n", armed.stderr
    proc = cli(env, "send-goal", "--count", "1", "--toy-scene", "6")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "result: ABORTED" in proc.stdout.splitlines()
    assert field(proc.stdout, "error").startswith("31 ENGINE_FAILURE: ")
    assert "trajectory:" not in proc.stdout


def test_ctrl_c_cancels_the_goal_and_a_goal_beyond_capacity_exits_rejected(served, env, running):
    long_goal = _Running(env, "send-goal", "--count", "8", "--toy-scene", "7")
    running.append(long_goal)
    long_goal.wait_line(lambda line: line.startswith("feedback: denoising"), CLI_TIMEOUT_S, "denoising feedback")
    # goal_policy reject, one goal running: the next one is refused at acceptance.
    rejected = cli(env, "send-goal", "--count", "1")
    assert rejected.returncode == 4, rejected.stdout + rejected.stderr
    assert rejected.stdout.splitlines()[-1] == "result: REJECTED"
    assert long_goal.proc.poll() is None, "the long goal ended before Ctrl-C:\n" + "\n".join(long_goal.lines)
    long_goal.proc.send_signal(signal.SIGINT)
    code, out = long_goal.finish()
    assert code == 5, out
    assert "canceling goal" in out and "(Ctrl-C); waiting for its terminal state" in out
    assert "result: CANCELED" in out.splitlines() and field(out, "error").startswith("40 CANCELED")


def test_diagnostics_once_prints_this_nodes_statuses_and_follows_until_ctrl_c(served, env, running):
    once = cli(env, "diagnostics", "--once")
    assert once.returncode == 0, once.stderr
    headers = [line for line in once.stdout.splitlines() if not line.startswith("    ")]
    assert {line.split()[2] + " " + line.split()[3] for line in headers} == {
        f"{NODE}: engine", f"{NODE}: goals", f"{NODE}: observations"}, once.stdout
    assert any(line.startswith("    goals_succeeded: ") for line in once.stdout.splitlines())

    follow = _Running(env, "diagnostics")
    running.append(follow)
    # The node publishes at 1 Hz: a second update shows it keeps following.
    follow.wait_line(lambda line: f"{NODE}: engine" in line, 60, "a second engine status", count=2)
    follow.proc.send_signal(signal.SIGINT)
    code, out = follow.finish(30)
    assert code == 0 and sum(f"{NODE}: engine" in line for line in out.splitlines()) >= 2, out

    other = cli(env, "diagnostics", "--once", "--node", "/somebody_else", "--timeout", "3")
    assert other.returncode == 3 and "no status named 'somebody_else: ...' on /diagnostics" in other.stderr


def test_without_a_node_each_command_says_what_it_waited_for_and_exits_unreachable(env):
    goal = cli(env, "send-goal", "--node", "/nobody_here/trajectory_ensemble", "--wait", "3")
    assert goal.returncode == 3, goal.stdout + goal.stderr
    assert goal.stdout.startswith("waiting for the action server /nobody_here/trajectory_ensemble/generate_trajectory")
    assert goal.stderr.startswith("error: node not reachable: no action server "
                                  "/nobody_here/trajectory_ensemble/generate_trajectory after 3 s")
    params = cli(env, "params", "list", "--node", "/nobody_here/trajectory_ensemble", "--wait", "3")
    assert params.returncode == 3 and "no parameter services /nobody_here/trajectory_ensemble/" in params.stderr


def test_a_goal_past_its_timeout_is_canceled_and_exits_timeout(served, env):
    proc = cli(env, "send-goal", "--count", "8", "--timeout", "2", "--toy-scene", "8")
    assert proc.returncode == 6, proc.stdout + proc.stderr
    assert "(no result after --timeout 2 s); waiting for its terminal state" in proc.stdout
    assert "result: CANCELED" in proc.stdout.splitlines()
