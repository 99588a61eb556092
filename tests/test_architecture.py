"""The engine side of the package imports with plain Python and torch: no rclpy, not even transitively.

Each check runs in a fresh interpreter, because this test process may already have imported rclpy elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# The ROS-free modules. Append new engine-side modules here (e.g. "trajectory_ensemble_node.engine",
# "trajectory_ensemble_node.models.cosmos3"); only trajectory_ensemble_node.ros may import rclpy.
ROS_FREE_MODULES = [
    "trajectory_ensemble_node",
    "trajectory_ensemble_node.errors",
    "trajectory_ensemble_node.contract",
    "trajectory_ensemble_node.seeding",
    "trajectory_ensemble_node.reducers",
    "trajectory_ensemble_node.normalization",
    "trajectory_ensemble_node.safety",
    "trajectory_ensemble_node.uncertainty",
    "trajectory_ensemble_node.engine.validity",
    "trajectory_ensemble_node.engine.deadline",
]

# One fresh interpreter imports the modules in list order (cheaper than one interpreter each: every one loads torch)
# and names the first module whose import pulled rclpy in. The finder makes any rclpy import fail loudly, proving no
# module needs it; the sys.modules check is a second line against imports that bypass sys.meta_path.
_CHECK = textwrap.dedent(
    """
    import importlib, sys

    class _BlockRclpy:
        def find_spec(self, name, path=None, target=None):
            if name == "rclpy" or name.startswith("rclpy."):
                raise ImportError(f"rclpy is blocked in this test (imported as {name!r})")
            return None

    sys.meta_path.insert(0, _BlockRclpy())
    for module in sys.argv[1:]:
        try:
            importlib.import_module(module)
        except ImportError as error:
            sys.exit(f"importing {module} failed: {error}")
        leaked = sorted(m for m in sys.modules if m == "rclpy" or m.startswith("rclpy."))
        if leaked:
            sys.exit(f"importing {module} loaded {leaked}")
    print("ok")
    """
)


def run_check(modules: list[str]) -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", _CHECK, *modules],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ros_free_modules_import_without_rclpy():
    proc = run_check(ROS_FREE_MODULES)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_check_catches_an_rclpy_import():
    # Guards the guard: a module that imports rclpy must fail the check, whether or not rclpy is installed.
    proc = run_check(["trajectory_ensemble_node.errors", "rclpy.node"])
    assert proc.returncode != 0 and "rclpy.node" in proc.stderr
