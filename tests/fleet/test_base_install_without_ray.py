"""The product's base install never imports ``ray``: only ``trajectory_ensemble_node.fleet`` (the ``.[fleet]`` extra)
may, and lazily. One fresh interpreter, ``ray`` blocked (``sys.modules['ray'] = None`` makes any import of it fail),
imports every other module of the package."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import trajectory_ensemble_node

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "trajectory_ensemble_node"

_CHECK = textwrap.dedent(
    """
    import importlib, sys

    sys.modules["ray"] = None  # any "import ray" (or ray.x) now raises ImportError
    for module in sys.argv[1:]:
        try:
            importlib.import_module(module)
        except ImportError as error:
            sys.exit(f"importing {module} failed: {error}")
        leaked = sorted(m for m in sys.modules if m.startswith("ray.") and sys.modules[m] is not None)
        if leaked:
            sys.exit(f"importing {module} loaded {leaked}")
    print("ok")
    """
)


def non_fleet_modules() -> list[str]:
    """Every module of the package but the fleet's, packages before their modules."""
    found = [PACKAGE] + [info.name for info in pkgutil.walk_packages(trajectory_ensemble_node.__path__, PACKAGE + ".")]
    # A __main__ module runs its command when imported; what it runs is imported by its package's modules anyway.
    return sorted(m for m in found if not (m == f"{PACKAGE}.fleet" or m.startswith(f"{PACKAGE}.fleet.")
                                           or m.endswith(".__main__")))


def run_check(modules: list[str]) -> subprocess.CompletedProcess[str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", _CHECK, *modules], cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": pythonpath}, capture_output=True, text=True, timeout=300)


def test_every_module_but_the_fleet_imports_without_ray():
    modules = non_fleet_modules()
    assert f"{PACKAGE}.openpi.server" in modules and f"{PACKAGE}.cli.dispatch" in modules
    proc = run_check(modules)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_check_catches_a_ray_import():
    proc = run_check([f"{PACKAGE}.errors", "ray.serve"])
    assert proc.returncode != 0 and "ray" in proc.stderr
