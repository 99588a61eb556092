"""Shifted scene families of the toy task: observations the policy never saw in training.

Training only ever shows one red disk obstacle of radius 0.14-0.26 on the robot-target line
(:mod:`trajectory_ensemble_node.toy.task`). A shifted scene keeps the robot, target and floor of an in-distribution
scene and changes what the policy must read:

- ``two_obstacles``: a second red disk of the same size range, off the line, beside the first one (passing on one
  side may now be blocked);
- ``recolored``: the one obstacle painted in a colour never seen (purple);
- ``large``: the one obstacle with radius 0.32-0.40, beyond the training range.

They are used to test the uncertainty score (``trajectory-ensemble calibrate`` on toy scenes,
:mod:`.scene_calibration`): a failure detector should flag them
more often than in-distribution scenes. Seeds come from :data:`SHIFTED_SEED_BASE` + i, far from training and
held-out seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trajectory_ensemble_node.toy import task

SHIFTED_SEED_BASE = 2_000_000
"""Shifted scenes use seeds ``SHIFTED_SEED_BASE + i``; neither training nor the held-out range reaches it."""
FAMILIES = ("two_obstacles", "recolored", "large")
RECOLOR = (150, 60, 220)
"""Obstacle colour of the ``recolored`` family (purple; training only has red obstacles)."""


@dataclass(frozen=True)
class ShiftedScene:
    """An in-distribution scene plus the shift applied to it.

    Args:
        base (`task.Scene`): Robot, target and (first) obstacle; ``base.radius`` already holds a ``large`` radius.
        family (`str`): One of :data:`FAMILIES`.
        extra_obstacles (`tuple[tuple[float, float, float], ...]`): ``(x, y, radius)`` of added obstacles.
        obstacle_color (`tuple[int, int, int]`): Colour the obstacles are painted in.
    """

    base: task.Scene
    family: str
    extra_obstacles: tuple[tuple[float, float, float], ...] = ()
    obstacle_color: tuple[int, int, int] = task.OBSTACLE_COLOR

    @property
    def seed(self) -> int:
        return self.base.seed


def make_shifted_scene(seed: int, family: str = "two_obstacles") -> ShiftedScene:
    """The shifted scene of ``seed`` (deterministic) in ``family``.

    Args:
        seed (`int`): Any non-negative int; use :data:`SHIFTED_SEED_BASE` + i.
        family (`str`): One of :data:`FAMILIES`.

    Raises:
        ValueError: for an unknown family (quoted).
    """
    if family not in FAMILIES:
        raise ValueError(f"shifted scene family must be one of {list(FAMILIES)}, got {family!r}")
    base = task.make_scene(seed)
    rng = np.random.default_rng([int(seed), 0x5F1F7])
    if family == "recolored":
        return ShiftedScene(base=base, family=family, obstacle_color=RECOLOR)
    if family == "large":
        from dataclasses import replace

        return ShiftedScene(base=replace(base, radius=float(rng.uniform(0.32, 0.40))), family=family)
    span = base.target - base.robot
    direction = span / np.linalg.norm(span)
    normal = np.array([-direction[1], direction[0]]) * rng.choice([1.0, -1.0])
    # Beside the first obstacle, on one side of the line: one of the two detours is now (partly) blocked.
    centre = base.obstacle + normal * rng.uniform(0.35, 0.45) + direction * rng.uniform(-0.1, 0.1)
    radius = float(rng.uniform(0.14, 0.22))
    return ShiftedScene(base=base, family=family, extra_obstacles=((float(centre[0]), float(centre[1]), radius),))


def shifted_scenes(count: int, seed: int = 0, family: str = "two_obstacles") -> list[ShiftedScene]:
    """``count`` shifted scenes, seeds ``SHIFTED_SEED_BASE + seed + i``."""
    return [make_shifted_scene(SHIFTED_SEED_BASE + seed + i, family) for i in range(count)]


def render_shifted(scene: ShiftedScene, size: int = task.IMAGE_SIZE) -> np.ndarray:
    """Render a shifted scene like :func:`task.render`: obstacles, then target, then robot on top.

    Returns:
        `np.ndarray` of shape `[size, size, 3]`, uint8.
    """
    base = scene.base
    image = task.floor_color(size)
    task._paint_disc(image, base.obstacle, base.radius, scene.obstacle_color)
    for x, y, radius in scene.extra_obstacles:
        task._paint_disc(image, np.array([x, y]), radius, scene.obstacle_color)
    task._paint_disc(image, base.target, task.TARGET_RADIUS, task.TARGET_COLOR)
    task._paint_disc(image, base.robot, task.ROBOT_RADIUS, task.ROBOT_COLOR)
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def collides_shifted(scene: ShiftedScene, waypoints: np.ndarray) -> bool:
    """Whether the chunk comes within :data:`task.COLLISION_CLEARANCE` of any obstacle of the shifted scene."""
    from dataclasses import replace

    if task.collides(scene.base, waypoints):
        return True
    return any(task.collides(replace(scene.base, obstacle=np.array([x, y]), radius=r), waypoints)
               for x, y, r in scene.extra_obstacles)
