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


def burst_action_client(client: RosClient) -> Any:
    """An action client on ``client``'s node whose goal/cancel/result queues hold a whole burst.

    A burst needs deep queues at *both* ends: with rclpy's default (KEEP_LAST 10) the client's own request writer
    overwrites requests DDS has not delivered yet, before the server could see them. The node's side is
    :data:`~trajectory_ensemble_node.ros.guards.ACTION_SERVICE_QOS`; a client that bursts uses the same.
    """
    from rclpy.action import ActionClient
    from trajectory_ensemble_msgs.action import GenerateTrajectory

    from trajectory_ensemble_node.ros.guards import ACTION_SERVICE_QOS

    import rclpy

    # Its own node: two action clients of one action on one node see each other's goal responses.
    node = rclpy.create_node(f"burst_client_{os.getpid()}_{time.monotonic_ns()}", context=client.context)
    client.executor.add_node(node)
    action = ActionClient(node, GenerateTrajectory, "/trajectory_ensemble/generate_trajectory",
                          goal_service_qos_profile=ACTION_SERVICE_QOS, result_service_qos_profile=ACTION_SERVICE_QOS,
                          cancel_service_qos_profile=ACTION_SERVICE_QOS)
    assert action.wait_for_server(timeout_sec=60.0), "action server not found by the burst client"
    return action


def fire_burst(client: RosClient, count: int, *, action: Any = None, answer_timeout_s: float = 60.0,
               terminal_timeout_s: float = 60.0, **goal_fields: Any) -> BurstReport:
    """Send ``count`` goals back to back (no pacing), then wait for every answer and every accepted goal's result.

    Args:
        client (`RosClient`): A connected client.
        count (`int`): Goals to send.
        answer_timeout_s (`float`): How long after the last send every goal must be accepted or rejected.
        terminal_timeout_s (`float`): How long after the last send every accepted goal must be terminal.
        action (`ActionClient`, *optional*): The client to send with (default: :func:`burst_action_client`).
        **goal_fields: Fields of each ``GenerateTrajectory.Goal``.
    """
    action = action or burst_action_client(client)
    results: list[Any] = []

    def on_answer(future: Any) -> None:
        # Ask for the result at once, as real clients do: the server keeps a result only ~10 s after the end.
        handle = future.result()
        if handle is not None and handle.accepted:
            results.append(handle.get_result_async())

    futures = []
    for _ in range(count):
        future = action.send_goal_async(client.Goal(**goal_fields))
        future.add_done_callback(on_answer)
        futures.append(future)
    last_send = time.monotonic()
    report = BurstReport(sent=count)
    deadline = last_send + answer_timeout_s
    while time.monotonic() < deadline and not all(f.done() for f in futures):
        time.sleep(0.02)
    report.answer_s = time.monotonic() - last_send
    handles = [f.result() for f in futures if f.done()]
    report.unanswered = count - len(handles)
    for handle in handles:
        if handle.accepted:
            report.accepted += 1
        else:
            report.rejected += 1
    deadline = last_send + terminal_timeout_s
    while time.monotonic() < deadline and not (len(results) == report.accepted and all(f.done() for f in results)):
        time.sleep(0.02)
    report.terminal_s = time.monotonic() - last_send
    for future in list(results):
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


def publish_until_received(client: RosClient, stamp: int, timeout_s: float = 30.0, *,
                           counted: str = "frames_received", **image_fields: Any) -> None:
    """Publish a frame until the node's ``/diagnostics`` count it (:meth:`RosClient.publish_image`, which every
    publish of the harness goes through), so a goal's outcome never hangs on a lost frame.

    Args:
        client (`RosClient`): A connected client.
        stamp (`int`): The frame's stamp (seconds).
        timeout_s (`float`): Give up (TimeoutError) after this long.
        counted (`str`): The observations counter the frame must raise: ``frames_received`` for a good frame,
            ``frames_rejected_<cause>`` for one the node refuses.
        **image_fields: Passed to ``image_msg`` (size, encoding...).
    """
    client.publish_image(stamp, counted=counted, timeout=timeout_s, **image_fields)
