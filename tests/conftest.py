"""Shared pytest set-up: an isolated ROS 2 domain per test session and the launch_testing skip."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator, Mapping

import pytest

LAUNCH_TESTING_SKIP_REASON = (
    "launch_testing is not installable from PyPI; runs inside the Docker image / a ROS 2 install"
)

# ROS_DOMAIN_ID 0 is everybody's default; 1..101 all map to valid DDS ports on Linux.
_DOMAIN_ID_MIN = 1
_DOMAIN_ID_MAX = 101


def pick_ros_domain_id(pid: int | None = None) -> int:
    """Return a ROS_DOMAIN_ID in 1..101 derived from ``pid`` (default: this process), never 0.

    Two pytest sessions running at once (two developers, or CI beside a developer) get different ids
    unless their pids collide modulo 101, so their DDS traffic does not mix.
    """
    pid = os.getpid() if pid is None else pid
    return _DOMAIN_ID_MIN + pid % (_DOMAIN_ID_MAX - _DOMAIN_ID_MIN + 1)


def ros_subprocess_env(domain_id: int, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Build the environment for a ROS 2 child process: this one's, pinned to ``domain_id`` and loopback.

    ``ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST`` keeps discovery on this machine. Output is unbuffered
    so that a parent reading a "ready" line sees it at once.
    """
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(domain_id)
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env


@pytest.fixture(scope="session")
def ros_domain_id() -> Iterator[int]:
    """A ROS_DOMAIN_ID unique to this test session, also set in ``os.environ`` for subprocesses.

    It is set before any test of the session calls ``rclpy.init``, which reads the variable then.
    """
    domain_id = pick_ros_domain_id()
    saved = {key: os.environ.get(key) for key in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")}
    os.environ["ROS_DOMAIN_ID"] = str(domain_id)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    try:
        yield domain_id
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def ros_env(ros_domain_id: int) -> dict[str, str]:
    """The environment for a ROS 2 child process of this test session (see ``ros_subprocess_env``)."""
    return ros_subprocess_env(ros_domain_id)


def launch_testing_available() -> bool:
    """True when ``import launch_testing`` works (a real ROS 2 install, or the Docker image)."""
    try:
        importlib.import_module("launch_testing")
    except Exception:  # noqa: BLE001 - a broken install counts as missing, whatever it raises
        return False
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``launch_testing`` where launch_testing is missing (any PyPI-only venv)."""
    if launch_testing_available():
        return
    skip = pytest.mark.skip(reason=LAUNCH_TESTING_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("launch_testing") is not None:
            item.add_marker(skip)
