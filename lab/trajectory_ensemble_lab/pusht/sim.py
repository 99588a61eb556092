"""The PushT environment as the expert sees it: the full state, the T's geometry, and a private copy of the physics.

``gym_pusht``'s own space cannot be copied (``Space.copy`` pickles the env's bound collision callback), so
:class:`PushTSim` builds a second pymunk space from the env's own constructors (``PushTEnv.add_tee``,
``add_circle``, ``add_segment``) and steps it with the env's PD law, substeps and ``dt``. Setting it to the env's
state and replaying the same actions reproduces the env's trajectory to within pymunk's contact warm-starting.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from trajectory_ensemble_node.errors import ErrorCode, TrajectoryEnsembleError

ENV_ID = "gym_pusht/PushT-v0"
MAX_STEPS = 300
"""The env's own episode limit (its ``TimeLimit``)."""
CONTROL_HZ = 10
SUCCESS_COVERAGE = 0.95
"""The env's success: coverage of the target region above this ends the episode."""
AGENT_RADIUS = 15.0
ARENA = (22.0, 490.0)
"""Where the agent's centre can be: the walls at 5 and 506 (radius 2) less the agent's radius."""
GOAL_POSE = np.array([256.0, 256.0, math.pi / 4])
K_P, K_V, SUBSTEP_DT, SUBSTEPS = 100.0, 20.0, 0.01, 10
"""The env's PD gains, physics step and substeps per control step (``PushTEnv.__init__`` and ``step``)."""

# The T in its body frame (PushTEnv.add_tee, scale 30, length 4): the bar, then the stem, and their outline.
BAR = np.array([(-60.0, 30.0), (60.0, 30.0), (60.0, 0.0), (-60.0, 0.0)])
STEM = np.array([(-15.0, 30.0), (-15.0, 120.0), (15.0, 120.0), (15.0, 30.0)])
KEYPOINTS = np.concatenate([BAR, STEM])
"""The 8 vertices of the two rectangles, in body coordinates (the env's ``get_keypoints`` order)."""
OUTLINE = np.array([(-60.0, 0.0), (60.0, 0.0), (60.0, 30.0), (15.0, 30.0), (15.0, 120.0), (-15.0, 120.0),
                    (-15.0, 30.0), (-60.0, 30.0)])
"""The T's outline, counter-clockwise in body coordinates; face i runs from vertex i to vertex i + 1."""
FACES = ("bar_top", "bar_right", "under_right", "stem_right", "stem_end", "stem_left", "under_left", "bar_left")
"""Names of the outline's faces (body frame: the bar at y in [0, 30], the stem below it to y = 120)."""


class PushTError(TrajectoryEnsembleError, ValueError):
    """A PushT setting, seed range or demonstration the lab cannot use (the message quotes the bad value)."""

    code = ErrorCode.INVALID_PARAMETERS


def make_env(pixels: bool = False) -> Any:
    """``gym_pusht/PushT-v0`` as published: its reset seeds, 300-step limit, coverage and success.

    Args:
        pixels (`bool`): Observe ``pixels_agent_pos`` (the 96x96 RGB frame and the agent position) instead of
            ``state``; the expert reads the full state from the env either way.
    """
    import gymnasium as gym
    import gym_pusht  # noqa: F401  (registers the env id)

    return gym.make(ENV_ID, obs_type="pixels_agent_pos" if pixels else "state")


@dataclass(frozen=True)
class PushTState:
    """The full simulator state the expert plans against.

    Args:
        agent (`np.ndarray` of shape `(2,)`): Agent centre, env pixels.
        agent_velocity (`np.ndarray` of shape `(2,)`): Agent velocity, pixels per second.
        block (`np.ndarray` of shape `(3,)`): T pose ``(x, y, angle)``: its body origin and angle (radians).
        block_velocity (`np.ndarray` of shape `(3,)`): ``(vx, vy, angular velocity)``.
    """

    agent: np.ndarray
    agent_velocity: np.ndarray
    block: np.ndarray
    block_velocity: np.ndarray


def render_states(states: np.ndarray, env=None) -> np.ndarray:
    """The env's 96x96 pixel observation of each state, drawn by ``gym_pusht``'s own renderer.

    Args:
        states (`np.ndarray` of shape `[N, 5]`): Agent ``(x, y)``, T ``(x, y, angle)`` (env pixels, radians).
        env (*optional*): A ``make_env(pixels=True)`` env to draw with (reset here).

    Returns:
        `np.ndarray` of shape `[N, 96, 96, 3]`, uint8.
    """
    env = env if env is not None else make_env(pixels=True)
    env.reset(seed=0)
    raw = env.unwrapped
    frames = np.empty((len(states), 96, 96, 3), dtype=np.uint8)
    for i, state in enumerate(np.asarray(states, dtype=np.float64)):
        _place(raw, state[:2], state[2:5])
        frames[i] = raw._render()
    return frames


def set_env_state(env: Any, state: PushTState) -> None:
    """Put a (wrapped, reset) ``PushTEnv``'s agent and T where ``state`` says, with its velocities, so that the
    env's next ``step`` continues from it (what :func:`read_state` read is what it steps from)."""
    raw = env.unwrapped
    _place(raw, state.agent, state.block)
    raw.agent.velocity = tuple(float(v) for v in state.agent_velocity)
    raw.block.velocity = tuple(float(v) for v in state.block_velocity[:2])
    raw.block.angular_velocity = float(state.block_velocity[2])


def _place(raw: Any, agent: np.ndarray, block: np.ndarray) -> None:
    raw.agent.position = (float(agent[0]), float(agent[1]))
    # Angle first: pymunk turns a body about its centre of gravity (as PushTSim.set_state).
    raw.block.angle = float(block[2])
    raw.block.position = (float(block[0]), float(block[1]))
    # Shapes draw (and collide) from their cached world position, which only a step or a reindex updates.
    raw.space.reindex_shapes_for_body(raw.agent)
    raw.space.reindex_shapes_for_body(raw.block)


def read_state(env: Any) -> PushTState:
    """The full state of a (wrapped) ``PushTEnv``."""
    raw = env.unwrapped
    agent, block = raw.agent, raw.block
    return PushTState(np.array(agent.position, dtype=np.float64), np.array(agent.velocity, dtype=np.float64),
                      np.array([*block.position, block.angle], dtype=np.float64),
                      np.array([*block.velocity, block.angular_velocity], dtype=np.float64))


def to_world(pose: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Body-frame ``points`` ``[K, 2]`` in the world, for a T at ``pose`` ``(x, y, angle)``."""
    c, s = math.cos(pose[2]), math.sin(pose[2])
    return points @ np.array([[c, s], [-s, c]]) + pose[:2]


GOAL_KEYPOINTS = to_world(GOAL_POSE, KEYPOINTS)


def keypoint_error(pose: np.ndarray) -> float:
    """Mean distance (pixels) between the T's 8 vertices at ``pose`` and at the target: position and angle in one
    number, zero exactly at the target."""
    return float(np.mean(np.linalg.norm(to_world(pose, KEYPOINTS) - GOAL_KEYPOINTS, axis=1)))


@functools.lru_cache(maxsize=1)
def _goal_region() -> Any:
    import shapely.geometry as sg

    return sg.MultiPolygon([sg.Polygon(to_world(GOAL_POSE, BAR)), sg.Polygon(to_world(GOAL_POSE, STEM))])


def coverage(pose: np.ndarray) -> float:
    """Share of the target region the T covers at ``pose``: the env's ``_get_coverage`` on shapely polygons."""
    import shapely.geometry as sg

    goal = _goal_region()
    block = sg.MultiPolygon([sg.Polygon(to_world(pose, BAR)), sg.Polygon(to_world(pose, STEM))])
    return float(goal.intersection(block).area / goal.area)


class PushTSim:
    """A private pymunk copy of the env's world (walls, agent, T), stepped exactly as ``PushTEnv.step`` steps.

    The shapes come from ``PushTEnv``'s own static constructors, so geometry, mass, inertia and centre of gravity
    are the env's; the space has the env's zero gravity and damping (a block stops the moment nothing pushes it).
    """

    def __init__(self) -> None:
        import pymunk
        from gym_pusht.envs.pusht import PushTEnv

        self._pymunk = pymunk
        self.space = pymunk.Space()
        self.space.gravity = 0, 0
        self.space.damping = 0.0
        self.space.add(*[PushTEnv.add_segment(self.space, a, b, 2) for a, b in
                         (((5, 506), (5, 5)), ((5, 5), (506, 5)), ((506, 5), (506, 506)), ((5, 506), (506, 506)))])
        self.agent = PushTEnv.add_circle(self.space, (256, 400), AGENT_RADIUS)
        self.block, _ = PushTEnv.add_tee(self.space, (256, 300), 0)

    def set_state(self, state: PushTState) -> None:
        """Put agent and T where ``state`` says, with its velocities."""
        self.agent.position = tuple(state.agent)
        self.agent.velocity = tuple(state.agent_velocity)
        # Angle first: pymunk turns a body about its centre of gravity, which moves the origin that position sets.
        self.block.angle = float(state.block[2])
        self.block.position = tuple(state.block[:2])
        self.block.velocity = tuple(state.block_velocity[:2])
        self.block.angular_velocity = float(state.block_velocity[2])

    def step(self, action: np.ndarray) -> None:
        """One control step towards the absolute target ``action`` ``(x, y)``: the env's PD law, 10 substeps."""
        agent, tx, ty = self.agent, float(action[0]), float(action[1])
        for _ in range(SUBSTEPS):
            (px, py), (vx, vy) = agent.position, agent.velocity
            agent.velocity = (vx + (K_P * (tx - px) - K_V * vx) * SUBSTEP_DT,
                              vy + (K_P * (ty - py) - K_V * vy) * SUBSTEP_DT)
            self.space.step(SUBSTEP_DT)

    def block_pose(self) -> np.ndarray:
        """The T's ``(x, y, angle)`` now."""
        return np.array([*self.block.position, self.block.angle], dtype=np.float64)

    def agent_position(self) -> np.ndarray:
        """The agent's centre now."""
        return np.array(self.agent.position, dtype=np.float64)

    def state(self) -> PushTState:
        """The full state now (what :meth:`set_state` takes)."""
        return PushTState(self.agent_position(), np.array(self.agent.velocity, dtype=np.float64), self.block_pose(),
                          np.array([*self.block.velocity, self.block.angular_velocity], dtype=np.float64))
