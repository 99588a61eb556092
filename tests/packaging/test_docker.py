"""docker/Dockerfile checked statically (no Docker engine here), and its entry point's argument handling."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
OVERLAY = ROOT / "docker" / "params_overlay.py"


def _instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the Dockerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = pending + line
        pending = ""
        keyword, _, rest = text.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def _args(keyword: str) -> list[str]:
    return [rest for kw, rest in _instructions() if kw == keyword]


def _dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def _ignored(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pattern) or path.startswith(pattern.rstrip("/") + "/")
               for pattern in _dockerignore())


def test_from_ros_kilted_ros_base() -> None:
    """One stage, on the official ROS 2 Kilted base image."""
    assert _args("FROM") == ["ros:kilted-ros-base"]


def test_every_copy_source_exists_and_is_in_the_context() -> None:
    """Every COPY source is in the repository and not excluded by .dockerignore."""
    copies = _args("COPY")
    assert copies
    for rest in copies:
        parts = [p for p in rest.split() if not p.startswith("--")]
        for source in parts[:-1]:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
            assert not _ignored(source), f"COPY {source}: excluded by .dockerignore"


def test_context_excludes_build_trees() -> None:
    """The venv, outputs and build trees never enter the build context."""
    for path in (".venv", "out", "msg/build", "ros2_ws", ".git"):
        assert _ignored(path), path


def test_entrypoint_is_copied_executable_and_launches_the_node() -> None:
    """ENTRYPOINT (exec form) is the copied entrypoint.sh, which sources ROS 2 + the workspace and launches."""
    (entry,) = _args("ENTRYPOINT")
    command = json.loads(entry)
    assert command == ["/opt/trajectory_ensemble/entrypoint.sh"]
    assert "docker/entrypoint.sh /opt/trajectory_ensemble/entrypoint.sh" in _args("COPY")
    assert ENTRYPOINT.stat().st_mode & stat.S_IXUSR, "docker/entrypoint.sh must be executable (COPY keeps the mode)"
    text = ENTRYPOINT.read_text()
    for needle in ("/opt/ros/kilted/setup.bash", "/ws/install/setup.bash",
                   "ros2 launch trajectory_ensemble serve.launch.py"):
        assert needle in text
    subprocess.run(["bash", "-n", str(ENTRYPOINT)], check=True)


def test_torch_cuda_pin_and_python_dependencies() -> None:
    """torch 2.13.0 from the PyTorch CUDA index; diffusers pinned as in pyproject; every dependency installed."""
    text = " ".join(rest for _, rest in _instructions())
    assert "ARG TORCH_VERSION=2.13.0" in "\n".join(f"{k} {r}" for k, r in _instructions())
    torch_install = (r'"torch==\$\{TORCH_VERSION\}"\s+--index-url\s+'
                     r'"https://download\.pytorch\.org/whl/\$\{TORCH_CUDA\}"')
    assert re.search(torch_install, text)
    assert re.search(r"ARG TORCH_CUDA=cu1\d\d", "\n".join(f"{k} {r}" for k, r in _instructions()))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = [d for d in project["dependencies"] if d.startswith("diffusers")]
    assert pins == ["diffusers==0.42.1"]
    assert "ARG DIFFUSERS_VERSION=0.42.1" in "\n".join(f"{k} {r}" for k, r in _instructions())
    pip_text = " ".join(rest for kw, rest in _instructions() if kw == "RUN" and "pip install" in rest)
    for dependency in project["dependencies"]:
        name = re.split(r"[<>=!~\[; ]", dependency, maxsplit=1)[0]
        assert re.search(rf'(^|[\s"]){re.escape(name)}([\s"<>=]|$)', pip_text), f"{name} is not pip-installed"


def test_colcon_builds_both_packages_from_the_copied_layout() -> None:
    """The workspace holds both packages where colcon finds them, and the build checks what the launch needs."""
    copies = _args("COPY")
    assert "msg /ws/src/trajectory_ensemble_msgs" in copies
    assert "trajectory_ensemble_node /ws/src/trajectory_ensemble/trajectory_ensemble_node" in copies
    root_files = next(c for c in copies if c.startswith("package.xml "))
    # Everything setup.py and pyproject.toml read at build time (readme included).
    for name in ("package.xml", "setup.py", "setup.cfg", "pyproject.toml", "README.md"):
        assert name in root_files.split()
    run = " ".join(_args("RUN"))
    assert "colcon build" in run and "source /opt/ros/kilted/setup.bash" in run
    assert "install/trajectory_ensemble/lib/trajectory_ensemble/trajectory_ensemble_node" in run


def test_params_overlay(tmp_path: Path) -> None:
    """model:=, ints, bools and lists override serve.yaml's values under its own node key."""
    out = tmp_path / "merged.yaml"
    proc = subprocess.run(
        [sys.executable, str(OVERLAY), str(ROOT / "config" / "serve.yaml"), str(out), "model:=/models/cosmos3",
         "num_inference_steps:=4", "publish_candidates:=true", "joint_names:=[a, b]", "guidance_scale:=3.0"],
        capture_output=True, text=True, check=True,
    )
    assert "model = '/models/cosmos3'" in proc.stdout
    base = yaml.safe_load((ROOT / "config" / "serve.yaml").read_text())
    merged = yaml.safe_load(out.read_text())
    assert list(merged) == list(base)
    params = next(iter(merged.values()))["ros__parameters"]
    expected = dict(next(iter(base.values()))["ros__parameters"])
    expected.update(model="/models/cosmos3", num_inference_steps=4, publish_candidates=True, joint_names=["a", "b"],
                    guidance_scale=3.0)
    assert params == expected
    bad = subprocess.run([sys.executable, str(OVERLAY), str(ROOT / "config" / "serve.yaml"), str(out), "model"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "name:=value" in bad.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_entrypoint_argument_handling(tmp_path: Path) -> None:
    """Launch arguments go to ros2 launch, other name:=value into a merged params file, commands run as given."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ros2").write_text('#!/usr/bin/env bash\necho "ros2 $*"\n')
    (fake / "ros2").chmod(0o755)
    (fake / "python3").symlink_to(sys.executable)
    env = dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}", TE_ROS_SETUP="/dev/null", TE_WS_SETUP="/dev/null",
               TE_DEFAULT_PARAMS=str(ROOT / "config" / "serve.yaml"), TE_PARAMS_OVERLAY=str(OVERLAY),
               TMPDIR=str(tmp_path))

    def entry(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(ENTRYPOINT), *args], env=env, capture_output=True, text=True)

    plain = entry()
    assert plain.returncode == 0 and plain.stdout.strip() == (
        f"ros2 launch trajectory_ensemble serve.launch.py params_file:={ROOT / 'config' / 'serve.yaml'}")
    tuned = entry("model:=/models/cosmos3", "device:=cuda", "namespace:=robot1")
    merged = tmp_path / "trajectory_ensemble_params.yaml"
    assert tuned.returncode == 0, tuned.stderr
    assert tuned.stdout.strip().endswith(
        f"ros2 launch trajectory_ensemble serve.launch.py params_file:={merged} device:=cuda namespace:=robot1")
    assert next(iter(yaml.safe_load(merged.read_text()).values()))["ros__parameters"]["model"] == "/models/cosmos3"
    command = entry("echo", "hello")
    assert command.stdout.strip() == "hello"
    bad = entry("model:=x", "oops")
    assert bad.returncode == 2 and "expected name:=value" in bad.stderr
