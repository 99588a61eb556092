"""ros/serve.py: the serve command passes the params file and ROS arguments through."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy")

from trajectory_ensemble_node.ros import serve  # noqa: E402


def test_serve_passes_the_params_file_and_ros_args_through(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    params_file = tmp_path / "p.yaml"
    params_file.write_text("{}")
    args = parser.parse_args(["--params-file", str(params_file), "--ros-args", "-p", "fps:=5.0", "-r", "__ns:=/r"])
    assert serve.build_argv(args.params_file, args.ros_args) == [
        "trajectory_ensemble_node", "--ros-args", "--params-file", str(params_file), "-p", "fps:=5.0", "-r", "__ns:=/r"]
    assert serve.build_argv(None, []) == ["trajectory_ensemble_node"]
    with pytest.raises(SystemExit, match="does not exist"):
        serve.build_argv(str(tmp_path / "missing.yaml"), [])
