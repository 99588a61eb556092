#!/usr/bin/env bash
# Entry point of the trajectory_ensemble image: source ROS 2 and the workspace, then
#   - no arguments, or only name:=value arguments: ros2 launch trajectory_ensemble serve.launch.py
#     (params_file:=, namespace:=, device:= go to the launch file; any other name:=value overrides that node
#     parameter on top of the parameter file, e.g. model:=/models/cosmos3 num_inference_steps:=4);
#   - anything else: run it as a command (bash, ros2 topic echo ..., python3 -m pytest ...).
set -eo pipefail

# Overridable so the argument handling can be tested outside the image.
source "${TE_ROS_SETUP:-/opt/ros/kilted/setup.bash}"
source "${TE_WS_SETUP:-/ws/install/setup.bash}"
params_file="${TE_DEFAULT_PARAMS:-/ws/install/trajectory_ensemble/share/trajectory_ensemble/config/serve.yaml}"
overlay_tool="${TE_PARAMS_OVERLAY:-/opt/trajectory_ensemble/params_overlay.py}"

if [[ $# -gt 0 && "$1" != *":="* ]]; then
  exec "$@"
fi

launch_args=()
overrides=()
for arg in "$@"; do
  case "$arg" in
    params_file:=*) params_file="${arg#params_file:=}" ;;
    namespace:=* | device:=*) launch_args+=("$arg") ;;
    *:=*) overrides+=("$arg") ;;
    *) echo "error: expected name:=value, got '$arg'" >&2; exit 2 ;;
  esac
done

if [[ ${#overrides[@]} -gt 0 ]]; then
  merged="${TMPDIR:-/tmp}/trajectory_ensemble_params.yaml"
  python3 "$overlay_tool" "$params_file" "$merged" "${overrides[@]}"
  params_file="$merged"
fi

exec ros2 launch trajectory_ensemble serve.launch.py "params_file:=$params_file" "${launch_args[@]}"
