"""What a PushT policy may take as its state input: one home for training and for every evaluation face.

Two sets of channels, by name (a face picks channels by name, never by position):

- ``agent`` (:data:`AGENT_STATE_NAMES`): the agent's position, env pixels. What a robot knows of itself, what the
  JointState of the ROS world carries, and what the shipped ``model: pusht`` declares.
- ``pose`` (:data:`POSE_STATE_NAMES`): the agent's position and the T's true pose, its position (env pixels) and
  the cosine and sine of its angle. A lab diagnostic, never shipped: a robot has no such sensor. A policy that is
  handed the pose it would otherwise read from the frame measures how much of the image policy's gap to the state
  oracle is perception (docs/pusht.md, "Is it perception?").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .sim import PushTError

AGENT_STATE_NAMES = ("agent_x", "agent_y")
"""The agent's position, env pixels: the state a PushT policy may take on a robot."""
POSE_STATE_NAMES = (*AGENT_STATE_NAMES, "block_x", "block_y", "block_cos", "block_sin")
"""The agent's position and the T's true pose (the lab's perception diagnostic)."""
STATE_SETS: dict[str, tuple[str, ...]] = {"agent": AGENT_STATE_NAMES, "pose": POSE_STATE_NAMES}
"""The state inputs ``train-pusht --state-input`` declares, by name."""
STATE_RANGES: dict[str, tuple[float, float]] = {
    "agent_x": (0.0, 512.0), "agent_y": (0.0, 512.0), "block_x": (0.0, 512.0), "block_y": (0.0, 512.0),
    "block_cos": (-1.0, 1.0), "block_sin": (-1.0, 1.0),
}
"""Each channel's ``minmax`` range: the arena in env pixels, [-1, 1] for the angle's cosine and sine."""


def state_values(names: Sequence[str], agent: Any, block: Any = None) -> np.ndarray:
    """The channels ``names`` of one PushT state, in that order.

    Args:
        names (`Sequence[str]`): Channels of :data:`STATE_RANGES`.
        agent (array-like of shape `[2]`): The agent's position, env pixels.
        block (array-like of shape `[3]`, *optional*): The T's pose ``(x, y, angle)``, env pixels and radians;
            needed only for the ``block_*`` channels.

    Returns:
        `np.ndarray` of shape `[len(names)]`, float64.

    Raises:
        PushTError: a channel PushT has not, or a ``block_*`` channel without ``block``.
    """
    unknown = [name for name in names if name not in STATE_RANGES]
    if unknown:
        raise PushTError(f"the served model takes the state {list(names)}; PushT has only {list(STATE_RANGES)}, not "
                         f"{unknown}")
    ax, ay = (float(v) for v in np.asarray(agent, dtype=np.float64).reshape(2))
    values = {"agent_x": ax, "agent_y": ay}
    if block is not None:
        bx, by, angle = (float(v) for v in np.asarray(block, dtype=np.float64).reshape(3))
        values.update(block_x=bx, block_y=by, block_cos=math.cos(angle), block_sin=math.sin(angle))
    missing = [name for name in names if name not in values]
    if missing:
        raise PushTError(f"the served model takes the T's pose {missing} as state; this face sends the agent's "
                         "position only (the pose is a lab diagnostic: bench --pusht in process or over the wire)")
    return np.array([values[name] for name in names], dtype=np.float64)


def request_state(metadata: dict[str, Any], agent: Any, block: Any = None) -> dict[str, Any]:
    """The request's state entry for a server whose handshake declares a state input (``metadata["state"]``): the
    channels it names under its key (``observation/state``), in its order; nothing for a model without one.

    Args:
        metadata (`dict`): The server's handshake metadata.
        agent (array-like of shape `[2]`): The agent's position, env pixels.
        block (array-like of shape `[3]`, *optional*): The T's true pose, for a ``pose`` diagnostic model.

    Raises:
        PushTError: as :func:`state_values`.
    """
    declared = metadata.get("state") or {}
    names = list(declared.get("names") or ())
    if not names:
        return {}
    return {declared.get("key", "observation/state"): state_values(names, agent, block)}
