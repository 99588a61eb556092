"""The architecture rule, checked two ways.

Statically: the import graph drawn from the code (every ``import`` of every module of the package, at module level
or inside functions, by ``ast``) has no cycle between packages; ``engine/`` imports no model package; ``models/``
imports neither the toy task, the node nor the tools; the node imports only what ``models.cosmos3`` exports; and only
the node, the tools and the benchmark's ROS modules import rclpy.

At run time: the ROS-free modules import in a fresh interpreter where any rclpy import fails, so not even a
transitive import pulls it in.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "trajectory_ensemble_node"

CORE_MODULES = ("__init__", "_rotations", "continuity", "contract", "errors", "metrics", "normalization", "reducers",
                "safety", "seeding", "uncertainty")
"""Top-level modules that form the ROS-free core; every other top-level module or folder is a package of its own."""

RCLPY_ALLOWED = ("ros", "tools", "bench.cli", "bench.ros_floor", "bench.ros_overhead")
"""Where rclpy may be imported: the node, the tools, and the benchmark's ROS modules (relative to the package)."""

# The ROS-free modules, imported at run time with rclpy blocked.
ROS_FREE_MODULES = [
    "trajectory_ensemble_node",
    "trajectory_ensemble_node.errors",
    "trajectory_ensemble_node.contract",
    "trajectory_ensemble_node.seeding",
    "trajectory_ensemble_node.reducers",
    "trajectory_ensemble_node.normalization",
    "trajectory_ensemble_node.engine",
    "trajectory_ensemble_node.models.cosmos3",
    "trajectory_ensemble_node.service",
    "trajectory_ensemble_node.catalog",
    "trajectory_ensemble_node.ros.goals",
    "trajectory_ensemble_node.ros.params",
    "trajectory_ensemble_node.ros.observations",
    "trajectory_ensemble_node.safety",
    "trajectory_ensemble_node.uncertainty",
    "trajectory_ensemble_node.engine.validity",
    "trajectory_ensemble_node.engine.deadline",
]


# --- the static import graph --------------------------------------------------------------------------------------


def package_sources(root: Path = REPO_ROOT / PACKAGE) -> dict[str, str]:
    """Every module of the package by dotted name (``pkg/__init__.py`` is ``pkg``), with its source."""
    sources = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        sources[".".join(parts)] = path.read_text(encoding="utf-8")
    return sources


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """Module -> every module it imports (internal ones by full name, external ones by top-level name)."""
    graph: dict[str, set[str]] = {}
    for module, source in sources.items():
        is_package = any(other.startswith(module + ".") for other in sources)
        base_parts = module.split(".") if is_package else module.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # ``from pkg import name`` imports the submodule ``pkg.name`` when there is one.
                targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names)
        graph[module] = {t if t.startswith(PACKAGE + ".") or t == PACKAGE else t.split(".")[0] for t in targets}
    return graph


def package_of(module: str) -> str:
    """The architectural package of a module: ``core``, or the first name under the package (``engine``, ...)."""
    parts = module.split(".")[1:] or ["__init__"]
    return "core" if len(parts) == 1 and parts[0] in CORE_MODULES else parts[0]


def _within(module: str, *prefixes: str) -> bool:
    return any(module == f"{PACKAGE}.{p}" or module.startswith(f"{PACKAGE}.{p}.") for p in prefixes)


def package_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Cycles in the package-level graph, each as the packages along it (empty when there is none)."""
    edges: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = package_of(module)
        edges.setdefault(source, set()).update(
            package_of(t) for t in targets if t.startswith(PACKAGE + ".") and package_of(t) != source
        )
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return cycles


def violations(sources: Mapping[str, str]) -> list[str]:
    """Every broken rule, one line each: ``"<module> imports <target>: <rule>"`` (empty when the code is clean)."""
    graph = import_graph(sources)
    found = [f"package cycle: {' -> '.join(cycle)}" for cycle in package_cycles(graph)]
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _within(module, "engine") and _within(target, "models"):
                found.append(f"{module} imports {target}: engine/ never imports a model package")
            if _within(module, "models") and _within(target, "toy", "ros", "tools"):
                found.append(f"{module} imports {target}: models/ imports neither toy, ros nor tools")
            if _within(module, "ros") and _within(target, "models.cosmos3") and target != f"{PACKAGE}.models.cosmos3":
                found.append(f"{module} imports {target}: ros/ uses only what models.cosmos3 exports")
            if target == "rclpy" and not _within(module, *RCLPY_ALLOWED):
                found.append(f"{module} imports rclpy: only ros/, tools/ and the bench's ROS modules may")
    return found


def test_the_import_graph_follows_the_architecture():
    sources = package_sources()
    assert f"{PACKAGE}.engine.scheduler" in sources and f"{PACKAGE}.ros.node" in sources
    assert violations(sources) == []


def test_the_static_check_catches_each_kind_of_violation():
    # Guards the guard: one small fake package breaking every rule, with imports in all the spellings it must read.
    fake = {
        PACKAGE: "",
        f"{PACKAGE}.contract": "",
        f"{PACKAGE}.engine": "",
        f"{PACKAGE}.engine.scheduler": "def f():\n    from ..models.cosmos3 import adapter\n",
        f"{PACKAGE}.models": "",
        f"{PACKAGE}.models.cosmos3": "",
        f"{PACKAGE}.models.cosmos3.adapter": "from ... import engine\nimport trajectory_ensemble_node.toy.task\n",
        f"{PACKAGE}.toy": "",
        f"{PACKAGE}.toy.task": "",
        f"{PACKAGE}.ros": "",
        f"{PACKAGE}.ros.node": "from ..models.cosmos3.adapter import X\nfrom ..models.cosmos3 import Y\n",
        f"{PACKAGE}.service": "import rclpy.node\n",
    }
    found = "\n".join(violations(fake))
    assert "package cycle: engine -> models -> engine" in found
    assert f"{PACKAGE}.engine.scheduler imports {PACKAGE}.models.cosmos3.adapter: engine/" in found
    assert f"{PACKAGE}.models.cosmos3.adapter imports {PACKAGE}.toy.task: models/" in found
    assert f"{PACKAGE}.ros.node imports {PACKAGE}.models.cosmos3.adapter: ros/" in found
    assert f"{PACKAGE}.ros.node imports {PACKAGE}.models.cosmos3: " not in found
    assert f"{PACKAGE}.service imports rclpy" in found


# --- the run-time check -------------------------------------------------------------------------------------------

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
