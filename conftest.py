"""Shared pytest set-up of both test trees (``tests/``, the product's, and ``lab/tests/``): an isolated ROS 2 domain
per test session, the launch_testing skip, and ``tests/`` on ``sys.path`` so that both trees import the one set of
shared helpers (``_node_harness``, ``_cosmos3``, ``_reliability_harness``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests"))

from _launch_testing import LAUNCH_TESTING_SKIP_REASON, launch_testing_available

from trajectory_ensemble_node.cli.launcher import pick_domain_id
from trajectory_ensemble_node.cli.launcher import ros_env as ros_env_for

@pytest.fixture(scope="session")
def ros_domain_id() -> Iterator[int]:
    """A ROS_DOMAIN_ID unique to this test session, also set in ``os.environ`` for subprocesses.

    It is set before any test of the session calls ``rclpy.init``, which reads the variable then.
    """
    domain_id = pick_domain_id(environ={})  # from the pid, whatever the developer's shell says
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
    """The environment for a ROS 2 child process of this test session (the tools' launcher builds it)."""
    return ros_env_for(ros_domain_id)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``launch_testing`` where launch_testing is missing (any PyPI-only venv)."""
    if launch_testing_available():
        return
    skip = pytest.mark.skip(reason=LAUNCH_TESTING_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("launch_testing") is not None:
            item.add_marker(skip)
