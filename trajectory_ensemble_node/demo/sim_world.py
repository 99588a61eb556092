"""What the simulated robot of ``trajectory-ensemble sim`` acts in: the seam between its ROS machinery
(:class:`.sim_robot.SimRobot`: ``/clock``, camera, goals, chunks executed at their stamps) and a world.

:class:`ToyWorld` is the toy task's point robot, as the sim always ran it. The PushT world
(``trajectory_ensemble_lab.pusht.ros_world``) lives in the lab: the product never imports ``gym_pusht``.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from ..toy import task
from ..toy.episodes import scene_seed
from .sim_model import episode_end


class SimWorld(Protocol):
    """A world the sim's robot acts in, one episode at a time.

    ``fps`` and ``horizon`` are the served policy's control rate and chunk length (``SimSettings.fps`` and
    ``horizon`` must match them); targets are in the units the node serves (``action_units``).
    """

    name: str
    frame_id: str
    fps: float
    horizon: int

    def episode_id(self, episode: Any) -> int:
        """The number that names ``episode`` in the records (toy: the scene seed; PushT: the env reset seed)."""
        ...

    def first_seed(self, base_seed: int, episode: Any) -> int:
        """Candidate base seed of the episode's first goal (goal ``c`` adds ``c``)."""
        ...

    def reset(self, episode: Any) -> np.ndarray:
        """Start ``episode``; returns where the robot is ``[D]``, the target it holds until a chunk comes."""
        ...

    def render(self, position: np.ndarray) -> np.ndarray:
        """The camera frame ``[H, W, 3]`` uint8 now, the robot's last target being ``position`` ``[D]``."""
        ...

    def step(self, previous: np.ndarray, target: np.ndarray, steps: int, budget: int) -> tuple[np.ndarray, str]:
        """Execute one control step towards ``target`` ``[D]`` (step number ``steps``, 1-based).

        Returns:
            `tuple[np.ndarray, str]`: The robot's position ``[D]`` recorded for the step, and how the episode ended
            (``""``: it goes on).
        """
        ...

    def passing_side(self, rows: np.ndarray, start: np.ndarray) -> int:
        """Which way a chunk ``rows`` ``[H, D]`` planned from ``start`` ``[D]`` goes (0 where the world has none)."""
        ...

    def joint_state(self) -> tuple[tuple[str, ...], np.ndarray] | None:
        """The robot's state at the frame :meth:`render` draws now: joint names and values ``[J]``, published as a
        ``JointState`` with the frame's stamp (a model that takes the state pairs the two); ``None`` where the
        world publishes none."""
        ...


class ToyWorld:
    """The toy task's point robot: it is where its plan says, and the episode ends on a collision, at the target or
    at the step budget (:func:`.sim_model.episode_end`)."""

    name = "toy"
    frame_id = "toy_camera"
    fps = task.FPS
    horizon = task.HORIZON

    def __init__(self) -> None:
        self.scene: task.Scene | None = None

    def episode_id(self, episode: task.Scene) -> int:
        return int(episode.seed)

    def first_seed(self, base_seed: int, episode: task.Scene) -> int:
        return scene_seed(base_seed, episode)

    def reset(self, episode: task.Scene) -> np.ndarray:
        self.scene = episode
        return np.asarray(episode.robot, dtype=np.float64).copy()

    def render(self, position: np.ndarray) -> np.ndarray:
        return task.render(self._scene(), robot=position)

    def step(self, previous: np.ndarray, target: np.ndarray, steps: int, budget: int) -> tuple[np.ndarray, str]:
        return target, episode_end(self._scene(), previous, target, steps, budget) or ""

    def passing_side(self, rows: np.ndarray, start: np.ndarray) -> int:
        return task.passing_side(self._scene(), rows, start=start)

    def joint_state(self) -> None:
        return None  # the toy policy takes no state

    def _scene(self) -> task.Scene:
        if self.scene is None:
            raise RuntimeError("ToyWorld: reset(scene) first")
        return self.scene
