"""Run the node as a child process (for ``demo`` and ``bench --ros``): start, wait until ready, stop cleanly.

The node runs in its own process, as on a robot, so everything between the tools and the node goes over real DDS.
This module only manages the process; it does not import rclpy.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from ..errors import TrajectoryEnsembleError


class NodeStartError(TrajectoryEnsembleError, RuntimeError):
    """The node process exited, or did not report ready in time; the message ends with its last output lines."""


READY_MARKER = "] ready: action "
"""The node logs ``[<notice>] ready: action <name>, ...`` once its action server is up."""
_TAIL_LINES = 30


def pick_domain_id(environ: Mapping[str, str] | None = None) -> int:
    """``ROS_DOMAIN_ID`` from the environment, else one in 1..101 derived from this pid.

    Not 0: a demo on a shared machine must not answer (or send) another user's goals on the default domain. Two
    processes started at once (two test sessions, a demo beside CI) get different ids unless their pids collide
    modulo 101, so their DDS traffic does not mix.

    Args:
        environ (`Mapping[str, str]`, *optional*): Where to look for ``ROS_DOMAIN_ID``; defaults to ``os.environ``.
            Pass ``{}`` to always derive the id from the pid (a test session isolating itself).
    """
    value = (os.environ if environ is None else environ).get("ROS_DOMAIN_ID", "").strip()
    if value.isdigit():
        return int(value)
    return 1 + os.getpid() % 101


RTPS_PORT_BASE = 7400
RTPS_DOMAIN_GAIN = 250
"""The RTPS well-known ports: a participant of domain ``D`` binds UDP ports in ``[7400 + 250 D, 7400 + 250 (D + 1))``
(discovery and user traffic, unicast and multicast), whatever the vendor."""


def _bound_udp_ports() -> set[int]:
    ports: set[int] = set()
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        ports.update(int(line.split()[1].rsplit(":", 1)[1], 16) for line in lines if line.strip())
    return ports


def unused_domain_id(exclude: set[int] | None = None) -> int:
    """A ``ROS_DOMAIN_ID`` in 1..101 that no DDS participant on this host uses now, for a node a test owns alone.

    A domain is in use when some socket is bound to one of its RTPS ports (read from ``/proc/net/udp``), so two
    processes that each derive a domain from their pid cannot end up serving each other's goals, as happens with
    :func:`pick_domain_id` on a busy shared machine. The search starts at a pid-derived id; where ``/proc`` cannot be
    read it returns that id. A participant that starts between this call and the node's start can still collide.

    Args:
        exclude (`set[int]`, *optional*): Ids never to return (e.g. the caller's own domain).
    """
    exclude = set(exclude or ())
    bound = _bound_udp_ports()
    first = os.getpid() % 101
    for step in range(101):
        domain = 1 + (first + step) % 101
        low = RTPS_PORT_BASE + RTPS_DOMAIN_GAIN * domain
        if domain not in exclude and not any(low <= port < low + RTPS_DOMAIN_GAIN for port in bound):
            return domain
    return 1 + first


def ros_env(domain_id: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment pinned to ``domain_id``, discovery on this host, line-buffered logs."""
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(domain_id)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env["PYTHONUNBUFFERED"] = "1"
    # rcutils buffers console logging when stdout is a pipe; the ready line must arrive when it is written.
    env["RCUTILS_LOGGING_BUFFERED_STREAM"] = "1"
    if extra:
        env.update(extra)
    return env


def format_param(name: str, value: Any) -> str:
    """``name:=value`` in ROS command-line syntax (bools lowercase, lists bracketed)."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (list, tuple)):
        text = "[" + ",".join(format_param("x", v)[3:] for v in value) + "]"
    else:
        text = str(value)
    return f"{name}:={text}"


class NodeProcess:
    """The ``trajectory_ensemble`` node in a child process.

    Args:
        params (`Mapping[str, Any]`): ROS parameters, passed as ``-p name:=value``.
        env (`Mapping[str, str]`): The child's environment (see :func:`ros_env`).
        log_path (`Path`, *optional*): File that receives everything the node prints.
        echo (`TextIO`, *optional*): Stream that also receives the node's startup lines (until ready).
        namespace (`str`): Push the node into this namespace (``-r __ns:=``); "" = the root.
    """

    def __init__(self, params: Mapping[str, Any], env: Mapping[str, str], log_path: Path | None = None,
                 echo: TextIO | None = None, namespace: str = "") -> None:
        self.params = dict(params)
        self.namespace = namespace
        self.env = dict(env)
        self.log_path = log_path
        self.echo = echo
        self.proc: subprocess.Popen[str] | None = None
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def command(self) -> list[str]:
        """The child's command line (``trajectory-ensemble serve --ros-args -p ...``, via this interpreter)."""
        args = [sys.executable, "-m", "trajectory_ensemble_node.cli", "serve", "--ros-args"]
        for name, value in self.params.items():
            args += ["-p", format_param(name, value)]
        if self.namespace:
            args += ["-r", f"__ns:={self.namespace}"]
        return args

    def start(self, ready_timeout_s: float = 300.0) -> None:
        """Start the node and return once it reports ready.

        Raises:
            NodeStartError: It exited first, or was not ready after ``ready_timeout_s`` (then it is stopped).
        """
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, start_new_session=True)
        self._reader = threading.Thread(target=self._read, name="node-output", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + ready_timeout_s
        while not self._ready.wait(0.2):
            if self.proc.poll() is not None:
                self._reader.join(timeout=2.0)
                raise NodeStartError(f"the node exited with status {self.proc.returncode} before it was ready; "
                                     f"last output:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise NodeStartError(f"the node was not ready after {ready_timeout_s:g} s; last output:\n{self.tail()}")

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        log = self.log_path.open("w", encoding="utf-8") if self.log_path is not None else None
        try:
            for line in self.proc.stdout:
                self._tail.append(line.rstrip())
                if log is not None:
                    log.write(line)
                    log.flush()
                if self.echo is not None and not self._ready.is_set():
                    self.echo.write(f"  node | {line}")
                    self.echo.flush()
                if READY_MARKER in line:
                    self._ready.set()
        finally:
            if log is not None:
                log.close()

    def tail(self) -> str:
        """The node's last output lines."""
        return "\n".join(self._tail)

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGINT (the node ends its goals and exits), then SIGTERM, then SIGKILL; returns the exit status."""
        if self.proc is None:
            return 0
        for sig, wait_s in ((signal.SIGINT, timeout_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if self.proc.poll() is not None:
                break
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        if self._reader is not None:
            self._reader.join(timeout=2.0)
        return int(self.proc.returncode if self.proc.returncode is not None else -1)

    def __enter__(self) -> NodeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
