"""The installable workspace: manifests, packaging, launch file and parameter file agree with each other."""

from __future__ import annotations

import ast
import os
import types
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from trajectory_ensemble_node.serving.params import PARAMETERS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (ROS 2 Humble's Ubuntu) has no tomllib
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FILE = ROOT / "launch" / "serve.launch.py"
CONFIG_FILE = ROOT / "config" / "serve.yaml"

NODE_NAME = "trajectory_ensemble"
# Where the node serves GenerateTrajectory (~/generate_trajectory), for the launch test below.
ACTION_NAME = f"/{NODE_NAME}/generate_trajectory"

# Every parameter the node reads: its parameter table is the one list (serving/params.py imports without rclpy).
PARAMETER_NAMES = {spec.name for spec in PARAMETERS}
# The node's key in serve.yaml: the wildcard matches it in any namespace.
CONFIG_KEY = f"/**/{NODE_NAME}"


def _tags(root: ET.Element, tag: str) -> list[str]:
    """Return the text of every direct child ``tag`` of ``root``."""
    return [(el.text or "").strip() for el in root.findall(tag)]


def test_node_package_xml() -> None:
    """package.xml names the ament_python package and exactly the declared dependencies."""
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3"
    assert _tags(root, "name") == ["trajectory_ensemble"]
    assert set(_tags(root, "depend")) == {
        "rclpy", "std_msgs", "sensor_msgs", "diagnostic_msgs", "trajectory_msgs", "action_msgs",
        "unique_identifier_msgs", "trajectory_ensemble_msgs", "lifecycle_msgs", "visualization_msgs",
    }  # fmt: skip
    assert _tags(root, "exec_depend") == ["launch_ros"]
    assert set(_tags(root, "test_depend")) == {"launch_testing", "launch_testing_ros"}
    assert root.findtext("export/build_type") == "ament_python"


def test_msgs_package_xml() -> None:
    """msg/package.xml is an ament_cmake interface package in rosidl_interface_packages."""
    root = ET.parse(ROOT / "msg" / "package.xml").getroot()
    assert root.get("format") == "3"
    assert _tags(root, "name") == ["trajectory_ensemble_msgs"]
    assert _tags(root, "member_of_group") == ["rosidl_interface_packages"]
    assert root.findtext("export/build_type") == "ament_cmake"
    assert "rosidl_default_generators" in _tags(root, "buildtool_depend")


def test_manifests_are_valid_catkin_packages() -> None:
    """catkin_pkg (what colcon and rosdep use) accepts both manifests without warnings."""
    from catkin_pkg.package import parse_package

    for folder, name in ((ROOT, "trajectory_ensemble"), (ROOT / "msg", "trajectory_ensemble_msgs")):
        warnings: list[str] = []
        package = parse_package(str(folder / "package.xml"), warnings=warnings)
        package.validate()
        assert package.name == name
        assert warnings == []


def test_pyproject_matches_manifest() -> None:
    """pip's metadata uses the manifest's name and version and exposes both console scripts."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    root = ET.parse(ROOT / "package.xml").getroot()
    assert project["name"] == root.findtext("name")
    assert project["version"] == root.findtext("version")
    assert project["scripts"] == {
        "trajectory-ensemble": "trajectory_ensemble_node.cli:main",
        "trajectory_ensemble_node": "trajectory_ensemble_node.cli:node_main",
    }
    assert "diffusers==0.42.1" in project["dependencies"]


def test_colcon_reads_setup_py(tmp_path: Path) -> None:
    """colcon's view of setup.py parses and installs the ament marker, manifest, launch and config.

    colcon evaluates the configured options with ``ast.literal_eval``; this fails on a
    ``SpecifierSet`` from pyproject's ``requires-python`` unless setup.py keeps it a string.
    """
    setup_py = pytest.importorskip(
        "colcon_python_setup_py.package_identification.python_setup_py",
        reason="colcon-python-setup-py comes with the [build] extra",
    )
    info: dict[str, Any] = setup_py.get_setup_information(ROOT / "setup.py", env=dict(os.environ))
    assert info["metadata"]["name"] == "trajectory_ensemble"
    data_files = {dest: files for dest, files in info["data_files"]}
    assert data_files["share/ament_index/resource_index/packages"] == ["resource/trajectory_ensemble"]
    assert data_files["share/trajectory_ensemble"] == ["package.xml"]
    assert data_files["share/trajectory_ensemble/launch"] == ["launch/serve.launch.py"]
    # The node's parameters, and serve-ray's `serve run` config beside them.
    assert sorted(data_files["share/trajectory_ensemble/config"]) == ["config/serve.yaml", "config/serve_ray.yaml"]
    assert info["packages"] and all(p.startswith("trajectory_ensemble_node") for p in info["packages"])


def _call_name(node: ast.Call) -> str:
    """Return the called name of ``node`` (``Node`` for both ``Node(...)`` and ``x.Node(...)``)."""
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _const(node: ast.AST) -> Any:
    """Return the value of a literal node, or None for anything computed."""
    return node.value if isinstance(node, ast.Constant) else None


def test_launch_file_declares_arguments_and_node() -> None:
    """serve.launch.py parses, declares params_file/namespace/device/autostart and starts the managed node."""
    tree = ast.parse(LAUNCH_FILE.read_text(), filename=str(LAUNCH_FILE))
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in functions
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]

    declared = {_const(c.args[0]): c for c in calls if _call_name(c) == "DeclareLaunchArgument"}
    assert set(declared) == {"params_file", "namespace", "device", "autostart"}
    defaults = {name: {k.arg: k.value for k in call.keywords}.get("default_value") for name, call in declared.items()}
    assert _const(defaults["namespace"]) == ""
    assert _const(defaults["device"]) == "auto"
    assert _const(defaults["autostart"]) == "true"

    # launch_ros's LifecycleNode action: a managed node that a lifecycle manager (or autostart) drives.
    nodes = [c for c in calls if _call_name(c) == "LifecycleNode"]
    assert len(nodes) == 1
    kwargs = {k.arg: k.value for k in nodes[0].keywords}
    assert _const(kwargs["package"]) == "trajectory_ensemble"
    assert _const(kwargs["executable"]) == "trajectory_ensemble_node"
    assert _const(kwargs["name"]) == NODE_NAME
    assert _const(kwargs["output"]) == "screen"
    assert _const(kwargs["emulate_tty"]) is True
    assert isinstance(kwargs["parameters"], ast.List) and len(kwargs["parameters"].elts) == 2
    assert "get_package_share_directory" in {_call_name(c) for c in calls}

    # The file also compiles as Python (not only parses), as ros2 launch will exec it.
    compile(LAUNCH_FILE.read_text(), str(LAUNCH_FILE), "exec")


def test_config_holds_every_parameter() -> None:
    """serve.yaml is a ROS 2 parameter file for the node holding exactly the parameters the node reads."""
    data = yaml.safe_load(CONFIG_FILE.read_text())
    assert list(data) == [CONFIG_KEY]
    params = data[CONFIG_KEY]["ros__parameters"]
    assert set(params) == PARAMETER_NAMES
    assert params["model"] == "toy" and params["device"] == "auto"
    assert params["candidate_count"] <= params["max_candidates"]
    # ROS 2 cannot type an empty list, so "unset" string lists hold one empty string.
    assert params["joint_names"] == [""] and params["image_topics"] == [""]
    assert isinstance(params["fps"], float) and isinstance(params["guidance_scale"], float)
    assert isinstance(params["max_observation_age_s"], float)


@pytest.mark.launch_testing
@pytest.mark.ros
def test_serve_launch_starts_action_server(ros_domain_id: int) -> None:
    """``ros2 launch trajectory_ensemble serve.launch.py`` brings up the GenerateTrajectory server.

    Runs the launch file under launch_testing's own runner (what its pytest plugin does for a
    ``generate_test_description`` module). The test module is built here rather than at import time so
    that, where the plugin is installed, it does not take over this whole file.
    """
    import launch
    import launch_testing.actions
    import launch_testing.markers
    from ament_index_python.packages import get_package_share_directory
    from launch.launch_description_sources import PythonLaunchDescriptionSource
    from launch_testing.loader import LoadTestsFromPythonModule
    from launch_testing.test_runner import LaunchTestRunner

    installed_launch_file = os.path.join(
        get_package_share_directory("trajectory_ensemble"), "launch", "serve.launch.py"
    )

    @launch_testing.markers.keep_alive
    def generate_test_description() -> launch.LaunchDescription:
        return launch.LaunchDescription(
            [
                launch.actions.IncludeLaunchDescription(
                    PythonLaunchDescriptionSource(installed_launch_file),
                    launch_arguments={"device": "cpu"}.items(),
                ),
                launch_testing.actions.ReadyToTest(),
            ]
        )

    class WaitForActionServer(unittest.TestCase):
        def test_action_server_appears(self) -> None:
            import rclpy
            from rclpy.action import ActionClient
            from trajectory_ensemble_msgs.action import GenerateTrajectory

            context = rclpy.Context()
            rclpy.init(context=context)
            try:
                node = rclpy.create_node("te_launch_test_client", context=context)
                client = ActionClient(node, GenerateTrajectory, ACTION_NAME)
                self.assertTrue(client.wait_for_server(timeout_sec=120.0), f"{ACTION_NAME} never appeared")
                client.destroy()
                node.destroy_node()
            finally:
                rclpy.shutdown(context=context)

    module = types.ModuleType("serve_launch_test")
    module.generate_test_description = generate_test_description  # type: ignore[attr-defined]
    module.WaitForActionServer = WaitForActionServer  # type: ignore[attr-defined]

    runner = LaunchTestRunner(test_runs=LoadTestsFromPythonModule(module, name=module.__name__))
    runner.validate()
    results = runner.run()
    failed = {str(run): result for run, result in results.items() if not result.wasSuccessful()}
    assert not failed, f"launch test failed: {failed}"
