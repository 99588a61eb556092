"""Whether ``launch_testing`` (a real ROS 2 install, or the Docker image) is importable here.

Its own module, not the root ``conftest``: another ``conftest.py`` (``tests/openpi/``) takes the module name
``conftest`` once collected, so ``from conftest import ...`` would resolve to whichever was imported last.
"""

from __future__ import annotations

import importlib

LAUNCH_TESTING_SKIP_REASON = (
    "launch_testing is not installable from PyPI; runs inside the Docker image / a ROS 2 install"
)


def launch_testing_available() -> bool:
    """True when ``import launch_testing`` works."""
    try:
        importlib.import_module("launch_testing")
    except Exception:  # noqa: BLE001 - a broken install counts as missing, whatever it raises
        return False
    return True
