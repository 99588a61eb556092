"""Rosbag replay tests for a team's own recordings, in pytest: ``from trajectory_ensemble_node.testing import
replay_test``.

:func:`replay_test` runs the node and ``trajectory-ensemble replay`` as children on an unused ROS domain and returns the
summary; :class:`ReplayNode` keeps one node for several replays. Both children are always stopped, whole process
group included. No rclpy in this process. Usage and an example: docs/replay-tests.md, "In pytest".
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import TrajectoryEnsembleError
from .replay.bags import DEMO_REFERENCE_TOPIC, DEMONSTRATION_BAG
from .cli.launcher import NodeProcess, ros_env, unused_domain_id

__all__ = ["DEMONSTRATION_BAG", "DEMO_REFERENCE_TOPIC", "ReplayNode", "ReplayRun", "ReplayTestError", "replay_test"]

NODE_NAME = "/trajectory_ensemble"
READY_TIMEOUT_S = 600.0
REPLAY_TIMEOUT_S = 1800.0
_LIVE: set[ReplayNode] = set()
_LIVE_LOCK = threading.Lock()


class ReplayTestError(TrajectoryEnsembleError, RuntimeError):
    """The node did not start, or the replay could not judge the run (bad bag, arguments or reference: exit 2;
    node unreachable: exit 3; a timeout); the message ends with the replay's last output lines."""


@dataclass(frozen=True)
class ReplayRun:
    """What one replay produced.

    Args:
        exit_status (`int`): ``replay``'s: 0 every goal succeeded and every limit held, 1 otherwise.
        summary (`dict`): ``summary.json`` (``goals``, ``problems``, and ``reference`` with a reference topic).
        bag (`Path`): The recorded bag (observations, the node's outputs, the reference topic).
        out (`Path`): The replay's output folder (plots beside the bag).
        output (`str`): The replay's stdout and stderr.
        command (`tuple[str, ...]`): The command that ran.
    """

    exit_status: int
    summary: dict[str, Any]
    bag: Path
    out: Path
    output: str
    command: tuple[str, ...]

    @property
    def reference(self) -> dict[str, Any] | None:
        """``summary["reference"]`` (``None`` without a reference topic)."""
        return self.summary.get("reference")

    @property
    def gate_failures(self) -> list[str]:
        """The ``gate:`` lines of the limits that were exceeded."""
        return list(((self.reference or {}).get("gate") or {}).get("failures", []))


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.splitlines()[-lines:])


class ReplayNode:
    """The node in a child process on a ROS domain of its own, for one or more replays (a context manager).

    Args:
        params (`Mapping[str, Any]`, *optional*): ROS parameters (``-p name:=value``); unset ones keep the node's
            defaults (the bundled toy policy).
        out (`str` or `Path`, *optional*): Folder for ``node.log``, ``node.pid`` and each replay's output; default: a
            new temporary folder.
        domain_id (`int`, *optional*): ``ROS_DOMAIN_ID``; default: :func:`~.cli.launcher.unused_domain_id`.
        ready_timeout_s (`float`): Seconds to wait for the model to load.
    """

    def __init__(self, params: Mapping[str, Any] | None = None, out: str | Path | None = None,
                 domain_id: int | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        self.out = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="replay_test_"))
        self.params = dict(params or {})
        self.ready_timeout_s = ready_timeout_s
        self.domain_id = domain_id
        self.env: dict[str, str] = {}
        self.node: NodeProcess | None = None
        self._replays = 0
        self._previous_sigterm: Any = None

    @property
    def pid(self) -> int | None:
        """The node's pid (= its process group id), once started."""
        return None if self.node is None or self.node.proc is None else self.node.proc.pid

    def start(self) -> ReplayNode:
        """Start the node and wait until it is ready.

        Raises:
            ReplayTestError: It exited, or was not ready in time (it is stopped); the message has its last lines.
        """
        from .cli.launcher import NodeStartError

        if self.domain_id is None:
            with _LIVE_LOCK:
                taken = {n.domain_id for n in _LIVE if n.domain_id is not None}
            own = os.environ.get("ROS_DOMAIN_ID", "").strip()
            self.domain_id = unused_domain_id(taken | ({int(own)} if own.isdigit() else set()))
        self.env = ros_env(self.domain_id)
        self.out.mkdir(parents=True, exist_ok=True)
        self.node = NodeProcess(self.params, self.env, log_path=self.out / "node.log")
        with _LIVE_LOCK:
            _LIVE.add(self)
        self._catch_sigterm()
        try:
            self.node.start(ready_timeout_s=self.ready_timeout_s)
        except NodeStartError as error:
            self.stop()
            raise ReplayTestError(str(error)) from None
        except BaseException:
            self.stop()
            raise
        finally:
            if self.pid is not None:
                (self.out / "node.pid").write_text(f"{self.pid}\n", encoding="utf-8")
        return self

    def _catch_sigterm(self) -> None:
        # SIGTERM would end the test process without unwinding, and the node would outlive it.
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt(f"signal {signum} while a replay-test node ran")

        self._previous_sigterm = signal.signal(signal.SIGTERM, interrupt)

    def replay(self, bag: str | Path, reference_topic: str | None = None, *, candidates: int = 0,
               reducer: str = "", return_candidates: bool = False, seed: int | None = 0,
               reference_channels: Sequence[str] | None = None, max_rmse: float | None = None,
               max_rmse_channel: Mapping[str, float] | None = None, goal_every: float | None = None,
               goal_offset: float | None = None, rate: float | None = None, extra_args: Sequence[str] = (),
               name: str | None = None, timeout_s: float = REPLAY_TIMEOUT_S) -> ReplayRun:
        """Run ``trajectory-ensemble replay BAG`` against this node and read what it wrote.

        Args:
            bag (`str` or `Path`): The input rosbag2 folder.
            reference_topic (`str`, *optional*): ``--reference-topic``: the recorded actions to compare with.
            candidates (`int`), reducer (`str`), return_candidates (`bool`): The goals' (0 / "" = node default).
            seed (`int`, *optional*): Goal ``i`` uses base seed ``seed + i`` (``None``: the node picks).
            reference_channels (`Sequence[str]`, *optional*), max_rmse (`float`, *optional*),
            max_rmse_channel (`Mapping[str, float]`, *optional*): ``--reference-channels``, ``--max-rmse``,
                ``--max-rmse-channel``.
            goal_every (`float`, *optional*), goal_offset (`float`, *optional*), rate (`float`, *optional*):
                The goal schedule and playback rate (default: replay's).
            extra_args (`Sequence[str]`): Further ``replay`` flags.
            name (`str`, *optional*): Output subfolder (default ``replay-<n>``).
            timeout_s (`float`): Seconds the replay may take.

        Raises:
            ReplayTestError: Exit status 2 or 3, or the timeout; the message has the replay's last lines.
        """
        if self.node is None:
            self.start()
        self._replays += 1
        out = self.out / (name or f"replay-{self._replays}")
        args = [sys.executable, "-m", "trajectory_ensemble_node.cli", "replay", str(bag), "--out", str(out),
                "--overwrite", "--wait", "60", "--node-namespace", NODE_NAME]
        flags: list[tuple[str, Any]] = [("--candidates", candidates or None), ("--reducer", reducer or None),
                                        ("--seed", seed), ("--reference-topic", reference_topic),
                                        ("--max-rmse", max_rmse), ("--goal-every", goal_every),
                                        ("--goal-offset", goal_offset), ("--rate", rate)]
        if reference_channels:
            flags.append(("--reference-channels", ",".join(reference_channels)))
        args += [part for flag, value in flags if value is not None for part in (flag, str(value))]
        args += [part for n, v in (max_rmse_channel or {}).items() for part in ("--max-rmse-channel", f"{n}={v}")]
        args += ["--return-candidates"] * bool(return_candidates) + list(extra_args)
        proc = subprocess.Popen(args, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            output, _ = proc.communicate()
            raise ReplayTestError(f"replay did not finish within {timeout_s:g} s:\n{_tail(output)}") from None
        except BaseException:
            _kill_group(proc.pid)
            proc.wait()
            raise
        if proc.returncode not in (0, 1):
            raise ReplayTestError(f"replay exit status {proc.returncode} ({' '.join(args[3:])}):\n{_tail(output)}\n"
                                  f"node log {self.out / 'node.log'}")
        summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
        return ReplayRun(proc.returncode, summary, out / "bag", out, output, tuple(args))

    def stop(self) -> int:
        """Stop the node (SIGINT, SIGTERM, SIGKILL), then anything left in its process group; its exit status."""
        code = 0
        try:
            if self.node is not None:
                code = self.node.stop()
                if self.pid is not None:
                    _kill_group(self.pid)
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(self)
            if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._previous_sigterm)
                self._previous_sigterm = None
        return code

    def __enter__(self) -> ReplayNode:
        return self.start() if self.node is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _stop_all() -> None:
    # A test process leaving through sys.exit, a pytest crash: whatever still runs is stopped.
    with _LIVE_LOCK:
        live = list(_LIVE)
    for node in live:
        node.stop()


def replay_test(bag: str | Path, params: Mapping[str, Any] | None = None, reference_topic: str | None = None, *,
                out: str | Path | None = None, ready_timeout_s: float = READY_TIMEOUT_S,
                **replay_options: Any) -> ReplayRun:
    """Start the node with ``params``, replay ``bag`` into it, stop it; what the replay produced.

    Args:
        bag (`str` or `Path`): The input rosbag2 folder (e.g. :data:`DEMONSTRATION_BAG`).
        params (`Mapping[str, Any]`, *optional*): The node's ROS parameters (default: its own).
        reference_topic (`str`, *optional*): The bag's recorded actions, compared with every served chunk.
        out (`str` or `Path`, *optional*): Output folder (``tmp_path`` in a test); default: a temporary folder.
        ready_timeout_s (`float`): Seconds to wait for the model to load.
        **replay_options: :meth:`ReplayNode.replay`'s keyword arguments (``candidates``, ``reducer``,
            ``return_candidates``, ``seed``, ``max_rmse``, ``max_rmse_channel``, ``reference_channels``, ...).

    Raises:
        ReplayTestError: The node did not start, or the replay exited 2 or 3 or timed out.
    """
    with ReplayNode(params, out=out, ready_timeout_s=ready_timeout_s) as node:
        return node.replay(bag, reference_topic, name="replay", **replay_options)
