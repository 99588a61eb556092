"""``trajectory_ensemble_node.testing``: the documented ten-line example runs as it is written, and a test that fails
or is interrupted while its node runs leaves no process behind (checked by pid and process group)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trajectory_ensemble_node.replay import bags

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "replay-tests.md"
EXAMPLE_MARK = "<!-- the example test: tests/replay/test_replay_testing.py runs it as written -->"

INNER = '''
import os
from pathlib import Path

from trajectory_ensemble_node.testing import ReplayNode, replay_test

OUT = Path(os.environ["REPLAY_TEST_OUT"])
BAG = os.environ["REPLAY_TEST_BAG"]


def test_assertion_fails_while_the_node_runs():
    with ReplayNode({"device": "cpu"}, out=OUT / "failing") as node:
        run = node.replay(BAG, "/reference/actions", candidates=1)
        assert run.reference["rmse"] < 0, "a regression the test catches"


def test_interrupted_while_replaying():
    # rate 0.01: the replay lasts a minute of wall time, so the interrupt lands inside it on any host.
    replay_test(BAG, {"device": "cpu"}, "/reference/actions", out=OUT / "interrupted", candidates=1, rate=0.01)
'''


def example_code() -> str:
    """The python block right after :data:`EXAMPLE_MARK` in docs/replay-tests.md."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(re.escape(EXAMPLE_MARK) + r"\s*```python\n(.*?)```", text, re.S)
    assert match, f"{DOC} has no python block after {EXAMPLE_MARK!r}"
    return match.group(1)


def test_documented_example_runs(tmp_path: Path) -> None:
    """Acceptance 3: the ten-line regression test of docs/replay-tests.md, run exactly as written."""
    pytest.importorskip("trajectory_ensemble_msgs")
    code = example_code()
    assert len(code.strip().splitlines()) <= 10, code
    namespace: dict[str, object] = {"__name__": "replay_tests_example"}
    exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - our own documentation
    tests = [value for name, value in namespace.items() if name.startswith("test_") and callable(value)]
    assert len(tests) == 1, list(namespace)
    tests[0](tmp_path)  # type: ignore[operator]


def _group_alive(pgid: int) -> list[int]:
    """Pids of live (not zombie) processes in process group ``pgid``."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text``."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid()]


def _sigint_not_ignored() -> None:
    # A suite started as a background job of a non-interactive shell (nohup, `make test &`) inherits SIGINT ignored,
    # and Python then never turns Ctrl-C into KeyboardInterrupt: the inner run would finish instead of stopping.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_failed_or_interrupted_test_leaves_no_node(tmp_path: Path) -> None:
    """Acceptance 3: a test whose assertion fails while its node runs, and one interrupted (SIGINT, as Ctrl-C)
    during its replay: afterwards neither node's pid nor process group, nor the replay, is alive."""
    pytest.importorskip("trajectory_ensemble_msgs")
    bag = bags.make_demo_bag(tmp_path / "bag", scene_offsets=(0,), reference=True).path
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "test_inner.py").write_text(INNER)
    out = tmp_path / "out"
    env = {**os.environ, "REPLAY_TEST_OUT": str(out), "REPLAY_TEST_BAG": str(bag)}
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_inner.py"],
                             cwd=tmp_path / "inner", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True, preexec_fn=_sigint_not_ignored)
    try:
        # The second test's replay has started (its node is up) when its output folder appears.
        deadline = time.monotonic() + 600
        while not (out / "interrupted" / "replay").is_dir():
            assert inner.poll() is None, inner.communicate()[0]
            assert time.monotonic() < deadline, "the interrupted test's replay never started"
            time.sleep(0.01)
        os.kill(inner.pid, signal.SIGINT)
        output, _ = inner.communicate(timeout=300)
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()
    assert inner.returncode == 2, output  # pytest: interrupted
    assert "a regression the test catches" in output and "KeyboardInterrupt" in output, output
    for name in ("failing", "interrupted"):
        pid = int((out / name / "node.pid").read_text())
        assert _group_alive(pid) == [], f"{name}: node {pid} still running"
    assert _mentioning(str(out)) == [], "a replay of the inner tests is still running"
