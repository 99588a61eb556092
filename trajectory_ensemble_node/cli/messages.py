"""The ROS message codec built on ``rosbags`` (no rclpy): the typestore, CDR bytes, and message construction.

The custom types are registered from their ``.msg`` files, so the definitions and RIHS01 hashes written into a bag
match what rosidl generates and real ROS 2 tools can read it. It lives in ``cli/`` because the operator commands and
``replay/`` both use it, and ``replay/`` already builds on ``cli/``, never the other way round.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.store import Typestore

from ..errors import FrameError, TrajectoryEnsembleError


class BagError(TrajectoryEnsembleError, ValueError):
    """A bag is missing, unreadable, or lacks what the caller needs (the message says which)."""


class InterfaceDefinitionError(TrajectoryEnsembleError, FileNotFoundError):
    """The ``trajectory_ensemble_msgs`` ``.msg`` files cannot be found to register them in the typestore."""


MSGS_PACKAGE = "trajectory_ensemble_msgs"
CUSTOM_TYPES = ("ActionTrajectory", "CandidateArray")
IMAGE_TYPE = "sensor_msgs/msg/Image"
STATE_TYPE = "sensor_msgs/msg/JointState"
STRING_TYPE = "std_msgs/msg/String"
TRAJECTORY_TYPE = f"{MSGS_PACKAGE}/msg/ActionTrajectory"
CANDIDATES_TYPE = f"{MSGS_PACKAGE}/msg/CandidateArray"
JOINT_TRAJECTORY_TYPE = "trajectory_msgs/msg/JointTrajectory"

# --- typestore ------------------------------------------------------------------------------------------------------


def msg_definition_dirs() -> list[Path]:
    """Folders that may hold ``ActionTrajectory.msg``: the source tree's ``msg/msg``, then installed share dirs."""
    candidates = [Path(__file__).resolve().parents[2] / "msg" / "msg"]
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p] + [sys.prefix]
    candidates += [Path(prefix) / "share" / MSGS_PACKAGE / "msg" for prefix in prefixes]
    return candidates


@functools.lru_cache(maxsize=1)
def typestore() -> Typestore:
    """The ROS 2 Kilted typestore with ``trajectory_ensemble_msgs`` registered from its ``.msg`` files.

    Raises:
        InterfaceDefinitionError: No folder of :func:`msg_definition_dirs` holds every custom ``.msg`` file.
    """
    store = get_typestore(Stores.ROS2_KILTED)
    for folder in msg_definition_dirs():
        files = [folder / f"{name}.msg" for name in CUSTOM_TYPES]
        if all(f.is_file() for f in files):
            types: dict[str, Any] = {}
            for path in files:
                types.update(get_types_from_msg(path.read_text(encoding="utf-8"), f"{MSGS_PACKAGE}/msg/{path.stem}"))
            store.register(types)
            return store
    searched = ", ".join(str(p) for p in msg_definition_dirs())
    raise InterfaceDefinitionError(f"{MSGS_PACKAGE} .msg files not found (searched {searched})")


def serialize(msg: Any) -> bytes:
    """CDR bytes of a ``rosbags`` message (what rclpy publishes and rosbag2 stores)."""
    return bytes(typestore().serialize_cdr(msg, msg.__msgtype__))


def deserialize(data: bytes | memoryview, msgtype: str) -> Any:
    """A ``rosbags`` message from CDR bytes."""
    return typestore().deserialize_cdr(bytes(data), msgtype)


# --- message construction (rosbags classes) -------------------------------------------------------------------------


def make_header(stamp_ns: int, frame_id: str) -> Any:
    """``std_msgs/Header`` with ``stamp_ns`` split into sec/nanosec."""
    types = typestore().types
    stamp = types["builtin_interfaces/msg/Time"](sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000)
    return types["std_msgs/msg/Header"](stamp=stamp, frame_id=frame_id)


def image_msg(rgb: np.ndarray, stamp_ns: int, frame_id: str) -> Any:
    """``sensor_msgs/Image`` (rgb8) of an ``[H, W, 3]`` uint8 array."""
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    if rgb.ndim != 3 or rgb.shape[2] != 3:
        raise BagError(f"expected an RGB image [H, W, 3], got shape {rgb.shape}")
    height, width = rgb.shape[:2]
    return typestore().types[IMAGE_TYPE](
        header=make_header(stamp_ns, frame_id), height=height, width=width, encoding="rgb8", is_bigendian=0,
        step=width * 3, data=rgb.reshape(-1),
    )


def joint_state_msg(names: Sequence[str], positions: Sequence[float], stamp_ns: int, frame_id: str = "") -> Any:
    """``sensor_msgs/JointState`` with positions only (velocity and effort empty, as the message allows)."""
    empty = np.zeros(0, dtype=np.float64)
    return typestore().types[STATE_TYPE](
        header=make_header(stamp_ns, frame_id), name=list(names),
        position=np.asarray(positions, dtype=np.float64), velocity=empty, effort=empty,
    )


def string_msg(text: str) -> Any:
    """``std_msgs/String``."""
    return typestore().types[STRING_TYPE](data=text)


def stamp_ns(msg: Any) -> int:
    """Header stamp of any message with a ``header`` (rosbags or rclpy object) in nanoseconds."""
    from ..serving.observations import stamp_ns as time_ns

    return time_ns(msg.header.stamp)


def image_rgb(msg: Any) -> np.ndarray:
    """RGB ``uint8`` ``[H, W, 3]`` of a ``sensor_msgs/Image`` in any encoding the node accepts (for plots).

    Decoded by the node's own :func:`~trajectory_ensemble_node.serving.frames.image_to_rgb`, so a plot shows
    exactly the frame the node would have served.

    Raises:
        BagError: The node would reject the frame (e.g. an unsupported encoding); the message says why.
    """
    from ..serving.observations import image_to_rgb

    try:
        return image_to_rgb(msg.encoding, msg.height, msg.width, msg.step, msg.data)
    except FrameError as error:
        raise BagError(f"cannot show this image: {error}") from None


def trajectory_array(msg: Any) -> np.ndarray:
    """``[horizon, action_dim]`` float32 of an ``ActionTrajectory`` (rosbags or rclpy object)."""
    return np.asarray(msg.data, dtype=np.float32).reshape(int(msg.horizon), int(msg.action_dim))


def candidates_array(msg: Any) -> np.ndarray:
    """``[count, horizon, action_dim]`` float32 of a ``CandidateArray`` (rosbags or rclpy object)."""
    return np.asarray(msg.data, dtype=np.float32).reshape(-1, int(msg.horizon), int(msg.action_dim))

