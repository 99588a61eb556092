"""The architecture rule, checked two ways.

Statically: the import graph drawn from the code (every ``import`` of every module of the product package and of the
lab, at module level or inside functions, by ``ast``) has no cycle, neither between packages nor between files;
``engine/`` imports no model package; ``models/`` imports neither the toy task, the node nor the tools; code outside
``models/cosmos3`` imports only what ``models.cosmos3`` exports; the product never imports the lab; only the node,
the tools and the lab's ROS modules import rclpy; the two faces are apart (``openpi/`` never imports ``ros/``, nor
``ros/`` ``openpi/``, and neither imports ``fleet/``); ``serving/``, the layer both faces share, imports neither face;
``remote/`` is a served model, not a face, and imports no face (``ros/``, ``openpi/``, ``fleet/``), nor does
``wire/``, the codec and schemas they all speak; ``fleet/``, a backend of the OpenPI face, never imports ``ros/``.
Every product package has a layer (:data:`LAYERS`, docs/development.md) and imports nothing from a layer above. No
module stands a ``SimpleNamespace`` in for a message. The tests mirror the product: every folder under ``tests/`` is
a product package's path or one of the harness folders (:data:`TEST_HARNESS_FOLDERS`).

At run time: every module of the ROS-free packages (the core, ``serving/``, ``engine/``, ``models/``, ``wire/``,
``openpi/``, ``remote/``, the service and the catalog) imports in a fresh interpreter where any rclpy import fails, so
not even a transitive import pulls it in. No list of exceptions inside ``ros/`` is kept: what needs no rclpy lives outside it.
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
LAB = "trajectory_ensemble_lab"
LAB_ROOT = REPO_ROOT / "lab" / LAB

CORE_MODULES = ("__init__", "_rotations", "contract", "error_codes", "errors", "metrics", "normalization", "novelty",
                "quoting", "reducers", "safety", "seeding", "stats", "uncertainty")
"""Top-level modules that form the ROS-free core; every other top-level module or folder is a package of its own."""

MODEL_NEVER_IMPORTS = ("toy", "ros", "openpi", "serving", "cli", "replay", "calibration", "demo")
"""What models/ stays below: the task it was trained on, the faces, the serving layer and the offline tools."""
RCLPY_ALLOWED = ("ros", "cli", "replay", "demo")
"""Where rclpy may be imported in the product (relative to the package): the node, the operator commands, the bag
replay and the toy's simulator and demo harness. Calibration reaches the node only through replay."""
LAB_RCLPY_ALLOWED = ("bench.ros_floor", "bench.ros_overhead", "bench.closed_loop_ros", "bench.clock_rate",
                     "grpo.ros", "toy.markers_figure")
"""Where rclpy may be imported in the lab: its measurements and training through the node."""
PUSHT_STACK = ("gym_pusht", "gymnasium", "pymunk", "pygame")
"""gym-pusht and what it brings: the lab's and ``make test``'s, never a dependency of the product's wheel."""

FACES = ("ros", "openpi", "fleet")
"""The ways in (the node, ``serve-openpi``, and ``serve-ray`` in front of the OpenPI face): what ``remote/`` and
``wire/`` never import."""
ROS_FREE_PACKAGES = ("core", "serving", "engine", "models", "wire", "openpi", "remote", "service", "catalog")
"""Packages (as :func:`package_of` names them) whose every module imports with rclpy blocked."""
LAYERS = (
    ("core", "provenance"),
    ("engine", "service", "models"),
    ("catalog", "bundled", "toy"),
    ("serving",),
    ("wire",),
    ("remote",),
    ("ros", "openpi", "fleet"),
    ("cli", "replay", "calibration", "demo", "testing"),
)
"""The product's packages (as :func:`package_of` names them), bottom up: each imports from its own layer and the ones
below, never from above (docs/development.md, "Layers"). A new package is placed here."""
_LAYER_OF = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}


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
        graph[module] = {t if _internal(t) else t.split(".")[0] for t in targets}
    return graph


def _internal(name: str) -> bool:
    return any(name == top or name.startswith(top + ".") for top in (PACKAGE, LAB))


def file_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every cycle between files, as the modules of each strongly connected component (sorted; empty when none).

    A package ``__init__`` importing its own submodules (to re-export them) is no cycle: importing ``pkg.sub``
    runs ``pkg/__init__`` first whatever it imports, so those edges are left out.
    """
    edges = {m: {t for t in targets if t in graph and t != m and not t.startswith(m + ".")}
             for m, targets in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return sorted(components)


def package_of(module: str) -> str:
    """The architectural package of a module: ``core``, the first name under the package (``engine``, ...), or
    ``lab.<folder>`` for a lab module."""
    top, *parts = module.split(".")
    parts = parts or ["__init__"]
    if top == LAB:
        # The lab's folders are packages of their own: lab.toy is not the product's toy.
        return f"lab.{parts[0]}"
    return "core" if parts[0] in CORE_MODULES else parts[0]


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
    unplaced = sorted({package_of(m) for m in graph if m.startswith(PACKAGE)} - set(_LAYER_OF))
    found += [f"package {package} has no layer in LAYERS" for package in unplaced]
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if _within(module, "engine") and _within(target, "models"):
                found.append(f"{module} imports {target}: engine/ never imports a model package")
            if _within(module, "models") and _within(target, *MODEL_NEVER_IMPORTS):
                found.append(f"{module} imports {target}: models/ imports no task, face or tool ({MODEL_NEVER_IMPORTS})")
            if (_within(target, "models.cosmos3") and target != f"{PACKAGE}.models.cosmos3"
                    and not _within(module, "models.cosmos3")):
                found.append(f"{module} imports {target}: outside models/cosmos3, only what models.cosmos3 exports")
            if module.startswith(PACKAGE) and (target == LAB or target.startswith(LAB + ".")):
                found.append(f"{module} imports {target}: the product never imports the lab")
            if module.startswith(PACKAGE) and target.split(".")[0] in PUSHT_STACK:
                found.append(f"{module} imports {target}: PushT's simulator is the lab's, never the product's")
            lab_ros = any(module == f"{LAB}.{m}" or module.startswith(f"{LAB}.{m}.") for m in LAB_RCLPY_ALLOWED)
            if target == "rclpy" and not (_within(module, *RCLPY_ALLOWED) or lab_ros):
                found.append(f"{module} imports rclpy: only ros/, cli/, replay/, demo/ and the lab's ROS modules may")
            if _within(module, "openpi") and _within(target, "ros"):
                found.append(f"{module} imports {target}: the OpenPI face never imports the node (faces apart)")
            if _within(module, "ros") and _within(target, "openpi"):
                found.append(f"{module} imports {target}: the node never imports the OpenPI face (faces apart)")
            if _within(module, "serving") and _within(target, "ros", "openpi"):
                found.append(f"{module} imports {target}: serving/ is shared by the faces and imports neither")
            if _within(module, "ros", "openpi") and _within(target, "fleet"):
                found.append(f"{module} imports {target}: neither face imports fleet/ (a backend behind the OpenPI "
                             "face)")
            if _within(module, "remote") and _within(target, *FACES):
                found.append(f"{module} imports {target}: remote/ is a served model, not a face; it imports no face")
            if _within(module, "wire") and _within(target, *FACES, "remote"):
                found.append(f"{module} imports {target}: wire/ is neutral ground; it imports no face nor remote/")
            if _within(module, "fleet") and _within(target, "ros"):
                found.append(f"{module} imports {target}: fleet/, a backend of the OpenPI face, never imports the node")
            if (module.startswith(PACKAGE) and target.startswith(PACKAGE + ".")
                    and _LAYER_OF.get(package_of(target), -1) > _LAYER_OF.get(package_of(module), len(LAYERS))):
                found.append(f"{module} imports {target}: {package_of(module)} never imports a layer above its own "
                             f"({package_of(target)}; LAYERS)")
    found += [f"file cycle: {' <-> '.join(cycle)}" for cycle in file_cycles(graph)]
    return found


def test_the_import_graph_follows_the_architecture():
    sources = {**package_sources(), **package_sources(LAB_ROOT)}
    assert f"{PACKAGE}.engine.scheduler" in sources and f"{PACKAGE}.ros.node" in sources
    assert f"{LAB}.bench.cli" in sources and f"{LAB}.toy.train" in sources
    assert violations(sources) == []


def test_the_cycle_check_finds_a_planted_file_cycle():
    # Guards the guard: a cycle through a function-local import, and one through a relative import, are found;
    # a package __init__ re-exporting its submodule is not a cycle.
    fake = {
        PACKAGE: "",
        f"{PACKAGE}.replay": "from .a import x\n",
        f"{PACKAGE}.replay.a": "from . import b\n",
        f"{PACKAGE}.replay.b": "def f():\n    from trajectory_ensemble_node.replay import c\n",
        f"{PACKAGE}.replay.c": "from .a import y\n",
        f"{PACKAGE}.reducers": "from . import continuity\n",
        f"{PACKAGE}.continuity": "def g():\n    from .reducers import mean\n",
        f"{PACKAGE}.engine": "from .run import GroupRun\n",
        f"{PACKAGE}.engine.run": "",
    }
    cycles = file_cycles(import_graph(fake))
    assert [f"{PACKAGE}.replay.a", f"{PACKAGE}.replay.b", f"{PACKAGE}.replay.c"] in cycles
    assert [f"{PACKAGE}.continuity", f"{PACKAGE}.reducers"] in cycles
    assert len(cycles) == 2
    assert any(line.startswith("file cycle: ") for line in violations(fake))


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
        f"{PACKAGE}.demo": "",
        f"{PACKAGE}.demo.demo": "from trajectory_ensemble_lab.toy import quality\ndef f():\n    import gym_pusht\n",
        f"{PACKAGE}.toy.episodes": "from ..models.cosmos3.tiny import CONFIGS\n",
        LAB: "",
        f"{LAB}.toy": "",
        f"{LAB}.toy.quality": "import rclpy\nfrom trajectory_ensemble_node.models.cosmos3.packing import forward_items\n",
        f"{LAB}.grpo": "",
        f"{LAB}.grpo.ros": "import rclpy\nfrom trajectory_ensemble_node.models.cosmos3 import read_record\n",
    }
    found = "\n".join(violations(fake))
    assert "package cycle: engine -> models -> engine" in found
    assert f"{PACKAGE}.engine.scheduler imports {PACKAGE}.models.cosmos3.adapter: engine/" in found
    assert f"{PACKAGE}.models.cosmos3.adapter imports {PACKAGE}.toy.task: models/" in found
    assert f"{PACKAGE}.ros.node imports {PACKAGE}.models.cosmos3.adapter: outside models/cosmos3" in found
    assert f"{PACKAGE}.ros.node imports {PACKAGE}.models.cosmos3: " not in found
    assert f"{PACKAGE}.service imports rclpy" in found
    assert f"{PACKAGE}.demo.demo imports {LAB}.toy.quality: the product never imports the lab" in found
    assert f"{PACKAGE}.demo.demo imports gym_pusht: PushT's simulator is the lab's" in found
    assert f"{PACKAGE}.toy.episodes imports {PACKAGE}.models.cosmos3.tiny: outside models/cosmos3" in found
    assert f"{LAB}.toy.quality imports {PACKAGE}.models.cosmos3.packing: outside models/cosmos3" in found
    assert f"{LAB}.toy.quality imports rclpy" in found and f"{LAB}.grpo.ros imports" not in found


def test_the_faces_check_finds_planted_imports():
    # Guards the guard: each face importing the other, and the shared layer importing either face or rclpy, in the
    # spellings the graph reads (relative, absolute, function-local, ``from pkg import module``).
    fake = {
        PACKAGE: "",
        f"{PACKAGE}.ros": "",
        f"{PACKAGE}.ros.goals": "",
        f"{PACKAGE}.ros.node": "def f():\n    from ..openpi import policy\n",
        f"{PACKAGE}.openpi": "",
        f"{PACKAGE}.openpi.policy": "from ..ros.goals import plan_goal\n",
        f"{PACKAGE}.openpi.extras": "import trajectory_ensemble_node.ros.goals\n",
        f"{PACKAGE}.serving": "",
        f"{PACKAGE}.serving.params": "from ..ros import goals\n",
        f"{PACKAGE}.serving.planning": "from trajectory_ensemble_node.openpi import extras\n",
        f"{PACKAGE}.serving.frames": "import rclpy\n",
    }
    found = "\n".join(violations(fake))
    assert f"{PACKAGE}.openpi.policy imports {PACKAGE}.ros.goals: the OpenPI face never imports the node" in found
    assert f"{PACKAGE}.openpi.extras imports {PACKAGE}.ros.goals: the OpenPI face never imports the node" in found
    assert f"{PACKAGE}.ros.node imports {PACKAGE}.openpi.policy: the node never imports the OpenPI face" in found
    assert f"{PACKAGE}.serving.params imports {PACKAGE}.ros.goals: serving/ is shared" in found
    assert f"{PACKAGE}.serving.planning imports {PACKAGE}.openpi.extras: serving/ is shared" in found
    assert f"{PACKAGE}.serving.frames imports rclpy" in found


def test_the_served_model_and_backend_checks_find_planted_imports():
    # Guards the guard: remote/ reaching each face, the wire package reaching a face or remote/, either face reaching
    # fleet/, and fleet/ reaching the node, in the spellings the graph reads; fleet/ importing the OpenPI face (it
    # is that face's backend) and everything importing wire/ stay allowed.
    fake = {
        PACKAGE: "",
        f"{PACKAGE}.ros": "",
        f"{PACKAGE}.ros.goals": "",
        f"{PACKAGE}.ros.node": "from ..wire import codec\ndef f():\n    from ..fleet import backend\n",
        f"{PACKAGE}.openpi": "",
        f"{PACKAGE}.openpi.policy": "import trajectory_ensemble_node.fleet.protocol\n",
        f"{PACKAGE}.openpi.server": "from ..wire import codec\n",
        f"{PACKAGE}.fleet": "",
        f"{PACKAGE}.fleet.backend": "from ..openpi.policy import Job\n",
        f"{PACKAGE}.fleet.protocol": "from ..ros import goals\n",
        f"{PACKAGE}.remote": "",
        f"{PACKAGE}.remote.client": "from ..openpi import server\nfrom ..wire.codec import pack\n",
        f"{PACKAGE}.remote.model": "def f():\n    from trajectory_ensemble_node.ros.goals import x\n",
        f"{PACKAGE}.remote.groups": "from ..fleet import protocol\n",
        f"{PACKAGE}.wire": "",
        f"{PACKAGE}.wire.codec": "",
        f"{PACKAGE}.wire.schemas": "from ..openpi.policy import Job\nfrom ..remote import client\n",
    }
    found = violations(fake)
    expected = [
        f"{PACKAGE}.ros.node imports {PACKAGE}.fleet.backend: neither face imports fleet/",
        f"{PACKAGE}.openpi.policy imports {PACKAGE}.fleet.protocol: neither face imports fleet/",
        f"{PACKAGE}.remote.client imports {PACKAGE}.openpi.server: remote/ is a served model, not a face",
        f"{PACKAGE}.remote.model imports {PACKAGE}.ros.goals: remote/ is a served model, not a face",
        f"{PACKAGE}.remote.groups imports {PACKAGE}.fleet.protocol: remote/ is a served model, not a face",
        f"{PACKAGE}.wire.schemas imports {PACKAGE}.openpi.policy: wire/ is neutral ground",
        f"{PACKAGE}.wire.schemas imports {PACKAGE}.remote.client: wire/ is neutral ground",
        f"{PACKAGE}.fleet.protocol imports {PACKAGE}.ros.goals: fleet/, a backend of the OpenPI face, never imports",
    ]
    for line in expected:
        assert sum(f.startswith(line) for f in found) == 1, (line, found)
    assert not [f for f in found if f.startswith(f"{PACKAGE}.fleet.backend ") or "imports " + f"{PACKAGE}.wire" in f]


# --- no message look-alikes -----------------------------------------------------------------------------------------


def simple_namespaces(sources: Mapping[str, str]) -> list[str]:
    """Every use of ``types.SimpleNamespace`` (imported, or reached as an attribute), one line each: a face must
    build the neutral request type instead of a look-alike of another face's message."""
    found = []
    for module, source in sorted(sources.items()):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module == "types":
                hits = [a.name for a in node.names if a.name == "SimpleNamespace"]
            elif isinstance(node, ast.Attribute):
                hits = [node.attr] if node.attr == "SimpleNamespace" else []
            elif isinstance(node, ast.Name):
                hits = [node.id] if node.id == "SimpleNamespace" else []
            else:
                hits = []
            found += [f"{module}:{node.lineno} uses SimpleNamespace" for _ in hits]
    return found


def test_the_layer_check_finds_an_import_from_above_and_an_unplaced_package():
    # Guards the guard: serving/ reaching remote/ (a layer up) and a package with no layer are found; importing down
    # (the node holding a remote model) and within a layer (fleet/ behind the OpenPI face) stay allowed.
    fake = {
        PACKAGE: "",
        f"{PACKAGE}.serving": "",
        f"{PACKAGE}.serving.model_factory": "def f():\n    from ..remote import client\n",
        f"{PACKAGE}.remote": "",
        f"{PACKAGE}.remote.client": "",
        f"{PACKAGE}.ros": "",
        f"{PACKAGE}.ros.model_host": "from ..remote.client import RemoteClient\n",
        f"{PACKAGE}.openpi": "",
        f"{PACKAGE}.openpi.server": "",
        f"{PACKAGE}.fleet": "",
        f"{PACKAGE}.fleet.app": "from ..openpi.server import OpenPIServer\n",
        f"{PACKAGE}.gadgets": "",
    }
    found = violations(fake)
    assert found == [
        "package gadgets has no layer in LAYERS",
        f"{PACKAGE}.serving.model_factory imports {PACKAGE}.remote.client: serving never imports a layer above its own "
        "(remote; LAYERS)",
    ]


def test_no_module_of_the_package_uses_a_simple_namespace():
    assert simple_namespaces(package_sources()) == []


def test_the_simple_namespace_scan_finds_planted_uses():
    fake = {
        f"{PACKAGE}.openpi.extras": "from types import SimpleNamespace\ngoal = SimpleNamespace(seed=1)\n",
        f"{PACKAGE}.openpi.schemas": "import types\nmsg = types.SimpleNamespace(data=b'')\n",
        f"{PACKAGE}.serving.planning": "from dataclasses import dataclass\n",
    }
    assert simple_namespaces(fake) == [
        f"{PACKAGE}.openpi.extras:1 uses SimpleNamespace",
        f"{PACKAGE}.openpi.extras:2 uses SimpleNamespace",
        f"{PACKAGE}.openpi.schemas:2 uses SimpleNamespace",
    ]


# --- one home per request concept --------------------------------------------------------------------------------


def constructions(sources: Mapping[str, str], name: str) -> list[str]:
    """Every product module that calls ``name(...)`` (a bare name or an attribute, e.g. ``pipeline.name(...)``)."""
    found = []
    for module, source in sorted(sources.items()):
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and name in (getattr(node.func, "id", None), getattr(node.func, "attr", None)):
                found.append(module)
                break
    return found


def functions_named(sources: Mapping[str, str], name: str) -> list[str]:
    """Every product function or method called ``name``, as ``module:line``."""
    return [f"{module}:{node.lineno}" for module, source in sorted(sources.items())
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name]


def test_one_product_module_builds_the_models_condition():
    # A second model family then touches one module, and a request means the same on every face.
    assert constructions(package_sources(), "CosmosActionCondition") == [f"{PACKAGE}.models.cosmos3.conditioning"]


def test_one_product_function_is_named_plan_goal():
    # The faces' shared planning; a face's own step says what it plans (``ros.goals.plan_action_goal``).
    found = functions_named(package_sources(), "plan_goal")
    assert [where.split(":")[0] for where in found] == [f"{PACKAGE}.serving.planning"], found


def test_the_one_home_checks_find_planted_copies():
    fake = {
        f"{PACKAGE}.models.cosmos3.conditioning": "def policy_condition(i):\n    return CosmosActionCondition(image=i)\n",
        f"{PACKAGE}.toy": "import diffusers\ndef f(i):\n    return diffusers.CosmosActionCondition(mode='policy')\n",
        f"{PACKAGE}.serving.planning": "def plan_goal(request):\n    pass\n",
        f"{PACKAGE}.ros.goals": "class Goals:\n    def plan_goal(self, goal):\n        pass\n",
        f"{PACKAGE}.openpi.extras": "from ..serving.planning import plan_goal\nplan_goal(None)\n",
    }
    assert constructions(fake, "CosmosActionCondition") == [f"{PACKAGE}.models.cosmos3.conditioning", f"{PACKAGE}.toy"]
    assert functions_named(fake, "plan_goal") == [f"{PACKAGE}.ros.goals:2", f"{PACKAGE}.serving.planning:1"]


# --- no re-export-only modules ------------------------------------------------------------------------------------


def reexport_only_modules(sources: Mapping[str, str]) -> list[str]:
    """Every module (package ``__init__`` files aside) whose body, past its docstring, is only imports, ``__all__``
    and aliases of imported names: a shim that hides where its names live. When code moves, its callers move with it."""
    found = []
    for module, source in sorted(sources.items()):
        if module == PACKAGE or module.rsplit(".", 1)[-1] == "__init__" or module in _PACKAGES_OF(sources):
            continue
        body = ast.parse(source).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        imported: set[str] = set()
        only = bool(body)
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Assign) and all(isinstance(x, ast.Name) for x in node.targets) and (
                any(x.id == "__all__" for x in node.targets)
                or (isinstance(node.value, ast.Name) and node.value.id in imported)
            ):
                continue
            elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # an attribute docstring
            elif _is_main_guard(node):
                continue  # ``python -m old.path`` running the new home's main
            else:
                only = False
                break
        if only:
            found.append(f"{module} only re-exports")
    return found


def _is_main_guard(node: ast.stmt) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__")


def _PACKAGES_OF(sources: Mapping[str, str]) -> set[str]:
    # A module that other modules sit under is a package's __init__ (package_sources names it by the package).
    return {m.rsplit(".", 1)[0] for m in sources if "." in m}


def test_no_module_of_the_package_only_re_exports():
    assert reexport_only_modules(package_sources()) == []


def test_the_re_export_scan_finds_planted_shims():
    fake = {
        PACKAGE: "",
        f"{PACKAGE}.serving": "from .params import PARAMETERS\n__all__ = ['PARAMETERS']\n",
        f"{PACKAGE}.serving.params": "PARAMETERS = ()\n",
        f"{PACKAGE}.ros": "",
        f"{PACKAGE}.ros.params": '"""Old path."""\nfrom ..serving.params import PARAMETERS  # noqa\n__all__ = ["PARAMETERS"]\n',
        f"{PACKAGE}.ros.host": "from .node import Host\nServing = Host\n\"\"\"Old name.\"\"\"\n",
        f"{PACKAGE}.ros.node": "from ..serving.params import PARAMETERS\nclass Host:\n    pass\n",
        f"{PACKAGE}.ros.empty": '"""Nothing here."""\n',
        f"{PACKAGE}.ros.bags": "from ..replay.bags import main\nif __name__ == '__main__':\n    main()\n",
    }
    assert reexport_only_modules(fake) == [
        f"{PACKAGE}.ros.bags only re-exports", f"{PACKAGE}.ros.host only re-exports",
        f"{PACKAGE}.ros.params only re-exports",
    ]


# --- the tests mirror the product ---------------------------------------------------------------------------------

TEST_HARNESS_FOLDERS = ("fuzz", "reliability", "packaging")
"""Folders under ``tests/`` that are no product package: hypothesis over every hostile input surface, hostile load
and misconfiguration over DDS, and the wheel, image, launch files and workspace (docs/development.md, "Tests")."""


def product_package_folders(root: Path = REPO_ROOT / PACKAGE) -> set[str]:
    """Every package folder of the product, relative to it (``engine``, ``models/cosmos3``, ...)."""
    return {init.parent.relative_to(root).as_posix() for init in root.rglob("__init__.py") if init.parent != root}


def misplaced_test_folders(tests_root: Path, packages: set[str]) -> list[str]:
    """Each folder under ``tests_root`` holding a file that is neither a product package's path nor inside a harness
    folder, e.g. one left named after a removed package (``tools``). Empty folders, ``__pycache__`` and hidden ones
    (pytest never collects them) hold no test."""
    folders = {path.parent.relative_to(tests_root).as_posix() for path in tests_root.rglob("*")
               if path.is_file() and not any(part == "__pycache__" or part.startswith(".")
                                             for part in path.relative_to(tests_root).parts)}
    return sorted(
        f"tests/{folder} is neither a product package nor a harness folder ({', '.join(TEST_HARNESS_FOLDERS)})"
        for folder in folders - {"."}
        if folder not in packages and folder.split("/")[0] not in TEST_HARNESS_FOLDERS
    )


def test_every_test_folder_is_a_product_package_or_a_harness_folder():
    packages = product_package_folders()
    assert not packages & set(TEST_HARNESS_FOLDERS), "a harness folder would hide a product package's tests"
    assert misplaced_test_folders(REPO_ROOT / "tests", packages) == []


def test_the_test_folder_check_finds_a_removed_package_and_a_folder_that_is_no_package(tmp_path: Path):
    # Guards the guard: a folder named after the removed tools/, and models/gadget under a real package, are found;
    # a package, a nested package, a harness folder's own subfolder, caches, a hidden and an empty folder pass.
    for name in ("test_core.py", "engine/test_engine.py", "models/cosmos3/test_state.py", "fuzz/soak/run.py",
                 "packaging/test_wheel.py", "tools/test_calibrate.py", "models/gadget/test_gadget.py",
                 "__pycache__/x.pyc", "serving/__pycache__/y.pyc", ".hypothesis/examples/z"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "remote").mkdir()
    found = misplaced_test_folders(tmp_path, {"engine", "models", "models/cosmos3", "serving", "remote"})
    assert [line.split(" is ")[0] for line in found] == ["tests/models/gadget", "tests/tools"]


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


def ros_free_modules(sources: Mapping[str, str]) -> list[str]:
    """Every module of :data:`ROS_FREE_PACKAGES`, packages before their modules."""
    return sorted(m for m in sources if m.startswith(PACKAGE) and package_of(m) in ROS_FREE_PACKAGES)


def test_the_ros_free_packages_are_listed_whole():
    modules = ros_free_modules(package_sources())
    for expected in ("serving.params", "serving.planning", "serving.model_factory", "serving.observation_buffer",
                     "openpi.cli", "openpi.server", "wire.codec", "wire.schemas", "remote.client", "engine.scheduler",
                     "models.cosmos3", "service", "catalog", "errors", "reducers"):
        assert f"{PACKAGE}.{expected}" in modules
    assert not [m for m in modules if _within(m, "ros", "tools", "toy")]


def test_ros_free_modules_import_without_rclpy():
    proc = run_check(ros_free_modules(package_sources()))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_check_catches_an_rclpy_import():
    # Guards the guard: a module that imports rclpy must fail the check, whether or not rclpy is installed.
    proc = run_check(["trajectory_ensemble_node.errors", "rclpy.node"])
    assert proc.returncode != 0 and "rclpy.node" in proc.stderr


def test_the_products_wheel_does_not_depend_on_the_pusht_stack():
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    named = [d for d in project["dependencies"] if any(name in d.replace("-", "_") for name in PUSHT_STACK)]
    assert named == [], f"the product's wheel must not depend on PushT's simulator: {named}"
