"""PushT demonstrations as rosbag2, in the toy demonstration bag's layout, and read back.

The layout is ``trajectory-ensemble bags make-demo-bag --reference``'s (``trajectory_ensemble_node/replay/bags.py``),
so ``replay --reference-topic /reference/actions``, ``calibrate --bag`` and novelty calibration take these bags as
they take the toy's:

- ``/camera/image_raw``: ``sensor_msgs/Image`` rgb8 96x96, the env's own ``pixels`` observation at every control
  step (before each action, and the last one after the final step), header stamp = log time;
- ``/joint_states``: ``sensor_msgs/JointState``, the agent's position (``agent_x``, ``agent_y``, env pixels) at the
  same stamps;
- ``/instruction``: ``std_msgs/String`` at each episode's first frame;
- ``/reference/actions``: one ``trajectory_msgs/JointTrajectory`` per episode, stamped at its first frame, point k
  (the expert's action k, the absolute agent target) at ``(k + 1) / 10 s``: where row k of a chunk served from that
  frame stands;
- ``/clock``: ``rosgraph_msgs/Clock`` with every frame (replay plays only the mapped inputs, so it is ignored there).

Episodes follow one another; each starts one control period after the previous one's last frame. The bag's
``custom_data`` lists them (:data:`EPISODES_KEY`), with their seeds and routes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.replay import bags

from . import INSTRUCTION
from .sim import CONTROL_HZ, PushTError

FRAME_ID = "pusht_camera"
JOINT_NAMES = ("agent_x", "agent_y")
CLOCK_TOPIC = "/clock"
CLOCK_TYPE = "rosgraph_msgs/msg/Clock"
EPISODES_KEY = "trajectory_ensemble.pusht_episodes"
"""``custom_data`` key: JSON list of ``{first_frame_ns, env_seed, expert_seed, success, steps, coverage, max_coverage,
route, routes_open}``."""
GENERATOR = "pusht-demos"
PERIOD_NS = 1_000_000_000 // CONTROL_HZ
TEST_BAG = Path(__file__).resolve().parent / "assets" / "pusht_demonstrations"
"""The committed bag: both expert seeds on one demonstration start (:data:`TEST_BAG_START`), two ways around."""
TEST_BAG_START = (10, (0, 1))


@dataclass(frozen=True)
class RecordedEpisode:
    """One demonstration as a bag holds it.

    Args:
        frames (`np.ndarray` of shape `(K + 1, 96, 96, 3)`, uint8): The camera, before each action and at the end.
        agent (`np.ndarray` of shape `(K + 1, 2)`): The agent's position at each frame.
        actions (`np.ndarray` of shape `(K, 2)`): The expert's absolute targets.
        first_frame_ns (`int`): Stamp of frame 0.
        meta (`dict[str, Any]`): Its entry of :data:`EPISODES_KEY` (seeds, route, steps, coverage).
    """

    frames: np.ndarray
    agent: np.ndarray
    actions: np.ndarray
    first_frame_ns: int
    meta: dict[str, Any]


def _clock_msg(stamp_ns: int) -> Any:
    types = bags.typestore().types
    return types[CLOCK_TYPE](clock=types["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9,
                                                                         nanosec=stamp_ns % 10**9))


def write_demo_bag(out: str | Path, episodes: Sequence[Any], storage: str = "mcap") -> bags.BagInfo:
    """Write ``episodes`` (successful :class:`~.demos.Episode` with frames) one after another into a new bag.

    Args:
        out (`str` or `Path`): Bag folder to create (must not exist).
        episodes (`Sequence[Episode]`): Demonstrations, each with ``frames`` ``[K + 1, 96, 96, 3]``, ``agent_path``
            ``[K + 1, 2]`` and ``actions`` ``[K, 2]``.
        storage (`str`): ``mcap`` or ``sqlite3``.

    Raises:
        PushTError: An episode has no frames, or frames, positions and actions disagree in length.
    """
    if not episodes:
        raise PushTError("write_demo_bag needs at least one episode, got 0")
    listing, start = [], bags.DEMO_START_NS
    for ep in episodes:
        if ep.frames is None or len(ep.frames) != len(ep.actions) + 1 or len(ep.agent_path) != len(ep.frames):
            raise PushTError(f"episode (env seed {ep.env_seed}, expert seed {ep.expert_seed}) needs K + 1 frames and "
                             f"positions for K actions, got {None if ep.frames is None else len(ep.frames)} frames, "
                             f"{len(ep.agent_path)} positions and {len(ep.actions)} actions")
        # Wall time stays out, so that the same seeds write the same bag.
        listing.append({"first_frame_ns": start, **{k: v for k, v in ep.summary().items() if k != "seconds"}})
        start += len(ep.frames) * PERIOD_NS
    custom = {"trajectory_ensemble.generator": GENERATOR, bags.REFERENCE_TOPIC_KEY: bags.DEMO_REFERENCE_TOPIC,
              EPISODES_KEY: json.dumps(listing)}
    with bags.BagRecorder(out, storage, custom_data=custom) as bag:
        for ep, entry in zip(episodes, listing):
            first = entry["first_frame_ns"]
            bag.write_msg(bags.DEMO_INSTRUCTION_TOPIC, first, bags.string_msg(INSTRUCTION))
            bag.write_msg(bags.DEMO_REFERENCE_TOPIC, first, bags.joint_trajectory_msg(
                JOINT_NAMES, np.asarray(ep.actions, dtype=np.float64), 1.0 / CONTROL_HZ, first, FRAME_ID))
            for j, (frame, agent) in enumerate(zip(ep.frames, ep.agent_path)):
                stamp = first + j * PERIOD_NS
                bag.write_msg(CLOCK_TOPIC, stamp, _clock_msg(stamp))
                bag.write_msg(bags.DEMO_IMAGE_TOPIC, stamp, bags.image_msg(frame, stamp, FRAME_ID))
                bag.write_msg(bags.DEMO_STATE_TOPIC, stamp, bags.joint_state_msg(JOINT_NAMES, agent, stamp, FRAME_ID))
    return bags.bag_info(out)


def read_demo_bag(path: str | Path) -> list[RecordedEpisode]:
    """The demonstrations of a bag :func:`write_demo_bag` wrote, through the project's own bag reader.

    Raises:
        PushTError: The bag does not list PushT episodes, or its messages do not match the listing.
    """
    info = bags.bag_info(path)
    try:
        listing = json.loads(info.custom_data[EPISODES_KEY])
    except (KeyError, ValueError):
        raise PushTError(f"{path} is not a PushT demonstration bag (no {EPISODES_KEY!r} in its custom_data)") from None
    images = bags.read_messages(path, bags.DEMO_IMAGE_TOPIC)
    states = bags.read_messages(path, bags.DEMO_STATE_TOPIC)
    references = bags.read_messages(path, bags.DEMO_REFERENCE_TOPIC)
    if len(references) != len(listing) or len(images) != len(states):
        raise PushTError(f"{path}: {len(listing)} episodes listed, {len(references)} reference trajectories, "
                         f"{len(images)} frames and {len(states)} joint states")
    episodes = []
    for k, entry in enumerate(listing):
        first = int(entry["first_frame_ns"])
        end = int(listing[k + 1]["first_frame_ns"]) if k + 1 < len(listing) else None
        mine = [i for i, (t, _) in enumerate(images) if t >= first and (end is None or t < end)]
        frames = np.stack([bags.image_rgb(images[i][1]) for i in mine])
        agent = np.stack([np.asarray(states[i][1].position, dtype=np.float64) for i in mine])
        actions = np.array([p.positions for p in references[k][1].points], dtype=np.float64)
        if len(frames) != len(actions) + 1:
            raise PushTError(f"{path}: episode {k} has {len(frames)} frames for {len(actions)} actions")
        episodes.append(RecordedEpisode(frames, agent, actions, first, entry))
    return episodes
