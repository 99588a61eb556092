"""Helpers shared by the reliability suite (``tests/reliability``) and the soak (``tests/reliability/soak.py``).

Everything runs over real DDS against the node as a subprocess (:mod:`_node_harness`); nothing is mocked. Each
helper bounds its own waiting, so a node that stops answering fails a test instead of hanging it.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _node_harness import RosClient

TERMINAL_STATUSES = (4, 5, 6)
"""``action_msgs/GoalStatus``: SUCCEEDED, CANCELED, ABORTED."""


@dataclass
class BurstReport:
    """What a burst of goals got back, as the client saw it.

    Args:
        sent (`int`): Goals sent.
        accepted (`int`), rejected (`int`): Goals answered each way.
        unanswered (`int`): Goals with neither answer when the wait ended.
        terminal (`int`): Accepted goals whose result arrived.
        statuses (`dict[int, int]`): Result status -> count.
        codes (`dict[int, int]`): Result ``error_code`` -> count.
        answer_s (`float`): Seconds from the last send until every goal was answered.
        terminal_s (`float`): Seconds from the last send until every accepted goal's result arrived.
    """

    sent: int
    accepted: int = 0
    rejected: int = 0
    unanswered: int = 0
    terminal: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    codes: dict[int, int] = field(default_factory=dict)
    answer_s: float = 0.0
    terminal_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()}


def fire_burst(client: RosClient, count: int, *, answer_timeout_s: float = 60.0,
               terminal_timeout_s: float = 60.0, **goal_fields: Any) -> BurstReport:
    """Send ``count`` goals back to back (no pacing), then wait for every answer and every accepted goal's result.

    Args:
        client (`RosClient`): A connected client.
        count (`int`): Goals to send.
        answer_timeout_s (`float`): How long after the last send every goal must be accepted or rejected.
        terminal_timeout_s (`float`): How long after the last send every accepted goal must be terminal.
        **goal_fields: Fields of each ``GenerateTrajectory.Goal``.
    """
    futures = [client.action.send_goal_async(client.Goal(**goal_fields)) for _ in range(count)]
    last_send = time.monotonic()
    report = BurstReport(sent=count)
    deadline = last_send + answer_timeout_s
    while time.monotonic() < deadline and not all(f.done() for f in futures):
        time.sleep(0.02)
    report.answer_s = time.monotonic() - last_send
    handles = [f.result() for f in futures if f.done()]
    report.unanswered = count - len(handles)
    results = []
    for handle in handles:
        if handle.accepted:
            report.accepted += 1
            results.append(handle.get_result_async())
        else:
            report.rejected += 1
    deadline = last_send + terminal_timeout_s
    while time.monotonic() < deadline and not all(f.done() for f in results):
        time.sleep(0.02)
    report.terminal_s = time.monotonic() - last_send
    for future in results:
        if not future.done():
            continue
        response = future.result()
        if response.status in TERMINAL_STATUSES:
            report.terminal += 1
        report.statuses[int(response.status)] = report.statuses.get(int(response.status), 0) + 1
        code = int(response.result.error_code)
        report.codes[code] = report.codes.get(code, 0) + 1
    return report


def goal_uuid(handle: Any) -> str:
    return str(uuid.UUID(bytes=bytes(bytearray(handle.goal_id.uuid))))


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux ``/proc``), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def wait_for_log(node: Any, fragment: str, timeout_s: float = 15.0) -> bool:
    """Poll the node's log until ``fragment`` appears; False when it did not within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if fragment in node.log():
            return True
        time.sleep(0.1)
    return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
