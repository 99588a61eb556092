"""Engine results to ROS messages: ``ActionTrajectory``, ``CandidateArray``, ``JointTrajectory``, metric KeyValues.

Pure functions of their arguments (no node, no clock, no DDS), so every field mapping is unit-testable. Arrays are
row-major float32, exactly as the interface files document: ``data[k * action_dim + j]`` is channel ``j`` of step
``k``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from builtin_interfaces.msg import Duration, Time
from diagnostic_msgs.msg import KeyValue
from std_msgs.msg import Header
from trajectory_ensemble_msgs.msg import ActionTrajectory, CandidateArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..contract import EnsembleResult
from ..metrics import numbers_text


def make_header(stamp: Time, frame_id: str) -> Header:
    """A ``std_msgs/Header`` carrying the observation's stamp and frame.

    Args:
        stamp (`builtin_interfaces.msg.Time`): The observation's header stamp.
        frame_id (`str`): The observation's frame id.
    """
    return Header(stamp=Time(sec=int(stamp.sec), nanosec=int(stamp.nanosec)), frame_id=str(frame_id))


def stamp_seconds(stamp: Time) -> float:
    """Seconds of a ``builtin_interfaces/Time`` (the observation stamps continuity aligns chunks by)."""
    return float(stamp.sec) + float(stamp.nanosec) * 1e-9


def _flat_float32(tensor: torch.Tensor | np.ndarray) -> list[float]:
    array = tensor.detach().cpu().numpy() if isinstance(tensor, torch.Tensor) else np.asarray(tensor)
    return np.ascontiguousarray(array, dtype=np.float32).reshape(-1).tolist()


def trajectory_msg(
    result: EnsembleResult, *, header: Header, domain_name: str, dt: float, normalized: bool
) -> ActionTrajectory:
    """The reduced trajectory of ``result``.

    Args:
        result (`EnsembleResult`): A finished group.
        header (`Header`): Stamp and frame of the observation the group was drawn for.
        domain_name (`str`): The embodiment the model was conditioned on.
        dt (`float`): Seconds between rows (``1 / fps``).
        normalized (`bool`): True when no action statistics were configured (data is in model space).
    """
    horizon, action_dim = (int(n) for n in result.action.shape)
    return ActionTrajectory(
        header=header,
        domain_name=domain_name,
        horizon=horizon,
        action_dim=action_dim,
        dt=float(dt),
        data=_flat_float32(result.action),
        reducer=result.spec.reducer,
        candidate_count=int(result.size),
        base_seed=int(result.base_seed),
        normalized=bool(normalized),
    )


def candidates_msg(
    result: EnsembleResult, *, header: Header, domain_name: str, dt: float, normalized: bool
) -> CandidateArray:
    """Every candidate of ``result``, ordered by candidate id.

    Raises:
        ValueError: ``result`` carries no candidates (the request did not ask for them).
    """
    if result.candidates is None:
        raise ValueError(f"result {result.request_id!r} has no candidates (return_candidates was false)")
    _, horizon, action_dim = (int(n) for n in result.candidates.shape)
    return CandidateArray(
        header=header,
        candidate_ids=[int(i) for i in result.candidate_ids],
        seeds=[int(s) for s in result.seeds],
        horizon=horizon,
        action_dim=action_dim,
        data=_flat_float32(result.candidates),
        valid=([bool(v) for v in result.candidate_valid] if result.candidate_valid is not None
               else [True] * len(result.candidate_ids)),
        domain_name=domain_name,
        dt=float(dt),
        normalized=bool(normalized),
    )


def seconds_to_time(seconds: float) -> Time:
    """A ``builtin_interfaces/Time`` from seconds (rounded to the nanosecond); the inverse of :func:`stamp_seconds`."""
    return ns_to_time(int(round(seconds * 1e9)))


def ns_to_time(ns: int) -> Time:
    """A ``builtin_interfaces/Time`` from integer nanoseconds, exactly."""
    return Time(sec=int(ns) // 1_000_000_000, nanosec=int(ns) % 1_000_000_000)


def seconds_to_duration(seconds: float) -> Duration:
    """A non-negative ``builtin_interfaces/Duration``, rounded to the nanosecond."""
    total = int(round(seconds * 1e9))
    if total < 0:
        raise ValueError(f"duration must be >= 0, got {seconds} s")
    return Duration(sec=total // 1_000_000_000, nanosec=total % 1_000_000_000)


def joint_trajectory_msg(
    action: torch.Tensor | np.ndarray, *, joint_names: Sequence[str], dt: float, header: Header
) -> JointTrajectory:
    """A ``trajectory_msgs/JointTrajectory`` with one point per action row.

    Row ``k`` is reached at ``time_from_start = (k + 1) * dt``: row 0 is the first action *after* the observation,
    not the current pose.

    Args:
        action (`torch.Tensor` or `np.ndarray` of shape `[H, D]`): The reduced trajectory.
        joint_names (`Sequence[str]`): ``D`` names, one per action channel.
        dt (`float`): Seconds between rows.
        header (`Header`): Stamp of the observation; a controller starts the trajectory relative to it.

    Raises:
        ValueError: ``len(joint_names) != D``.
    """
    array = action.detach().cpu().numpy() if isinstance(action, torch.Tensor) else np.asarray(action)
    if array.ndim != 2 or array.shape[1] != len(joint_names):
        raise ValueError(f"action of shape {tuple(array.shape)} does not match {len(joint_names)} joint names")
    points = [
        JointTrajectoryPoint(positions=[float(v) for v in row], time_from_start=seconds_to_duration((k + 1) * dt))
        for k, row in enumerate(array.astype(np.float64))
    ]
    return JointTrajectory(header=header, joint_names=list(joint_names), points=points)


def format_value(value: Any) -> str:
    """A metric value as diagnostics text: floats with 3 decimals, ``None`` as ``""``, numbers in a sequence as
    :func:`~trajectory_ensemble_node.metrics.numbers_text`, the rest via ``str``."""
    if value is None:
        return ""
    if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value):
        return numbers_text(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.3f}" if math.isfinite(value) else str(value)
    return str(value)


def metrics_key_values(metrics: Mapping[str, Any]) -> list[KeyValue]:
    """Every metric as a ``diagnostic_msgs/KeyValue``, in the order given.

    The engine already names quantities with their unit (``total_ms``, ``peak_memory_bytes``); the other keys are
    counts (``candidate_count``, ``physical_forwards``) or labels (``fallback_reason``), so keys pass through as-is.
    """
    return [KeyValue(key=str(name), value=format_value(value)) for name, value in metrics.items()]
