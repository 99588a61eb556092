"""The bundled toy task: a 2D point robot must reach a target past a disk obstacle, above it or below it.

Normalized scene coordinates (``[-1, 1]``, ``y`` up); the action is ``HORIZON`` waypoints ``[H, 2]``, waypoint ``k``
the position after step ``k + 1``. Scenes are a pure function of their seed; initial scenes are bimodal. The scene
rules and the task's metrics (collision, final error, side, mode agreement): docs/toy-policy.md, "The task".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

HORIZON = 8
"""Action chunk size H (waypoints per chunk). The policy video has ``H + 1`` frames (2 latent frames after frame 0)."""
DOMAIN_NAME = "pusht"
"""Embodiment: raw action width 2 (normalized x, y), domain id 4."""
RESOLUTION_TIER = 256
IMAGE_SIZE = 256
"""Rendered images are ``IMAGE_SIZE x IMAGE_SIZE`` RGB: aspect 1.0 at the 256 tier is a 256 x 256 canvas."""
FPS = 8.0
NUM_INFERENCE_STEPS = 10
GUIDANCE_SCALE = 1.0
"""The toy policy is trained without an unconditional branch, so it is served without classifier-free guidance."""
INSTRUCTION = "move the blue robot to the green target without touching the red obstacle"

ROBOT_RADIUS = 0.06
TARGET_RADIUS = 0.07
EXPERT_CLEARANCE = 0.12
"""Clearance between every expert polyline and the obstacle edge (normalized units; 0.12 = 15 px)."""
COLLISION_CLEARANCE = 0.02
"""A polyline collides when its clearance to the obstacle edge is below this."""
BIMODAL_BAND = 0.05
"""If the obstacle centre is within this distance of the straight robot-target line, both sides are equally good."""
REPLAN_AFTER = HORIZON // 2
"""Mode agreement executes this many waypoints of the first chunk before re-planning."""

BACKGROUND = (20, 20, 30)
"""Background colour at the bottom-left corner; red rises to the right and green upwards (see :func:`floor_color`)."""
FLOOR_RAMP = 60
OBSTACLE_COLOR = (220, 50, 50)
TARGET_COLOR = (40, 200, 90)
ROBOT_COLOR = (60, 130, 255)

TRAIN_SEED_BASE = 0
"""Training scenes use seeds ``TRAIN_SEED_BASE + i``."""
HELDOUT_SEED_BASE = 1_000_000
"""Held-out scenes (quality bench, tests) use seeds ``HELDOUT_SEED_BASE + i``; training never reaches this range."""


@dataclass(frozen=True)
class Scene:
    """One observation of the task.

    Args:
        robot (`np.ndarray` of shape `[2]`): Current robot position.
        target (`np.ndarray` of shape `[2]`): Target position.
        obstacle (`np.ndarray` of shape `[2]`): Obstacle disk centre.
        radius (`float`): Obstacle disk radius.
        start (`np.ndarray` of shape `[2]`): Where the episode started (reference axis for :func:`side`).
        seed (`int`): The seed the scene was made from.
    """

    robot: np.ndarray
    target: np.ndarray
    obstacle: np.ndarray
    radius: float
    start: np.ndarray
    seed: int

    def with_robot(self, position: np.ndarray) -> Scene:
        """The same scene with the robot moved to ``position`` (episode start unchanged)."""
        return replace(self, robot=np.asarray(position, dtype=np.float64).copy())


def _normal(direction: np.ndarray) -> np.ndarray:
    # Left normal of a direction: +90 degrees.
    return np.array([-direction[1], direction[0]])


def _cross(a: np.ndarray, b: np.ndarray) -> float:
    return float(a[0] * b[1] - a[1] * b[0])


def make_scene(seed: int) -> Scene:
    """Make the initial scene of ``seed`` (deterministic): robot left, target right, obstacle on the line between.

    Args:
        seed (`int`): Any non-negative int; use :data:`HELDOUT_SEED_BASE` + i for evaluation.
    """
    rng = np.random.default_rng([int(seed), 0x70A5])
    robot = np.array([rng.uniform(-0.85, -0.6), rng.uniform(-0.45, 0.45)])
    target = np.array([rng.uniform(0.6, 0.85), rng.uniform(-0.45, 0.45)])
    radius = float(rng.uniform(0.14, 0.26))
    along = rng.uniform(0.4, 0.6)
    direction = (target - robot) / np.linalg.norm(target - robot)
    obstacle = robot + along * (target - robot) + _normal(direction) * rng.uniform(-0.03, 0.03)
    return Scene(robot=robot, target=target, obstacle=obstacle, radius=radius, start=robot.copy(), seed=int(seed))


def heldout_scenes(count: int, seed: int = 0) -> list[Scene]:
    """``count`` held-out initial scenes, seeds ``HELDOUT_SEED_BASE + seed + i``."""
    return [make_scene(HELDOUT_SEED_BASE + seed + i) for i in range(count)]


# --- geometry and metrics -------------------------------------------------------------------------------------------


def polyline(start: np.ndarray, waypoints: np.ndarray) -> np.ndarray:
    """``[H + 1, 2]``: the start position followed by the ``[H, 2]`` waypoints."""
    return np.concatenate([np.asarray(start, dtype=np.float64)[None], np.asarray(waypoints, dtype=np.float64)], 0)


def nearest_point(points: np.ndarray, centre: np.ndarray) -> tuple[np.ndarray, float]:
    """Nearest point to ``centre`` on the polyline through ``points`` ``[M, 2]`` (segments, not just vertices).

    Returns:
        `tuple`: the nearest point ``[2]`` and its distance to ``centre``.
    """
    points = np.asarray(points, dtype=np.float64)
    if len(points) == 1:
        return points[0], float(np.linalg.norm(points[0] - centre))
    a, b = points[:-1], points[1:]
    ab = b - a
    length2 = np.maximum((ab * ab).sum(-1), 1e-18)
    t = np.clip(((centre - a) * ab).sum(-1) / length2, 0.0, 1.0)
    closest = a + t[:, None] * ab
    distances = np.linalg.norm(closest - centre, axis=-1)
    i = int(np.argmin(distances))
    return closest[i], float(distances[i])


def clearance(scene: Scene, waypoints: np.ndarray, start: np.ndarray | None = None) -> float:
    """Smallest distance between the polyline ``start -> waypoints`` and the obstacle edge (negative: inside).

    Args:
        scene (`Scene`): The scene the chunk was planned in.
        waypoints (`np.ndarray` of shape `[H, 2]`): The chunk.
        start (`np.ndarray` of shape `[2]`, *optional*): Polyline start; defaults to ``scene.robot``.
    """
    start = scene.robot if start is None else start
    _, distance = nearest_point(polyline(start, waypoints), scene.obstacle)
    return distance - scene.radius


def collides(scene: Scene, waypoints: np.ndarray, start: np.ndarray | None = None) -> bool:
    """Whether the chunk's polyline comes within :data:`COLLISION_CLEARANCE` of the obstacle edge."""
    return clearance(scene, waypoints, start) < COLLISION_CLEARANCE


def final_error(scene: Scene, waypoints: np.ndarray) -> float:
    """Distance from the last waypoint to the target."""
    return float(np.linalg.norm(np.asarray(waypoints, dtype=np.float64)[-1] - scene.target))


def side(scene: Scene, waypoints: np.ndarray, start: np.ndarray | None = None) -> int:
    """Side of the obstacle the polyline ``start -> waypoints`` passes: +1 left of the episode axis, -1 right.

    The episode axis is ``scene.start -> scene.target``; the polyline's point nearest the obstacle centre decides.
    A polyline through the exact centre counts as +1 (measure zero).
    """
    start = scene.robot if start is None else start
    q, _ = nearest_point(polyline(start, waypoints), scene.obstacle)
    return 1 if _cross(scene.target - scene.start, q - scene.obstacle) >= 0 else -1


def passing_side(scene: Scene, waypoints: np.ndarray, start: np.ndarray) -> int:
    """:func:`side` of a chunk planned at ``start`` in an episode, or 0 when the robot has passed the obstacle.

    Passed: ``start`` lies beyond the obstacle's far edge along the episode axis (``scene.start -> scene.target``),
    so no chunk planned there passes the obstacle on either side. :func:`side` would still give a sign, that of
    the robot's offset from the obstacle's axis line, and the target lies within ``BIMODAL_BAND`` of that line:
    a robot settling on the target would count as changing sides.
    """
    axis = scene.target - scene.start
    length = max(float(np.linalg.norm(axis)), 1e-9)
    progress = float(np.dot(np.asarray(start) - scene.start, axis)) / length
    if progress > float(np.dot(scene.obstacle - scene.start, axis)) / length + scene.radius:
        return 0
    return side(scene, waypoints, start=start)


def mode_agreement(scene: Scene, first: np.ndarray, second: np.ndarray) -> bool:
    """Whether two consecutive chunks pass the obstacle on the same side.

    Args:
        scene (`Scene`): The initial scene chunk ``first`` was planned in.
        first (`np.ndarray` of shape `[H, 2]`): Chunk A, planned at ``scene.robot``.
        second (`np.ndarray` of shape `[H, 2]`): Chunk B, planned in ``replan_scene(scene, first)``.
    """
    after = replan_scene(scene, first)
    return side(scene, first) == side(after, second)


def replan_scene(scene: Scene, chunk: np.ndarray) -> Scene:
    """The state reached after executing the first :data:`REPLAN_AFTER` waypoints of ``chunk``."""
    return scene.with_robot(np.asarray(chunk, dtype=np.float64)[REPLAN_AFTER - 1])


# --- expert ---------------------------------------------------------------------------------------------------------


def expert_sides(scene: Scene) -> tuple[int, ...]:
    """The sides the expert may take: both when the obstacle is within :data:`BIMODAL_BAND` of the straight line,
    else only the shorter detour (the side the robot is already on)."""
    direction = (scene.target - scene.robot) / max(np.linalg.norm(scene.target - scene.robot), 1e-9)
    offset = float(np.dot(scene.obstacle - scene.robot, _normal(direction)))
    if abs(offset) < BIMODAL_BAND:
        return (1, -1)
    return (-1 if offset > 0 else 1,)


def expert_path(scene: Scene, side_sign: int, horizon: int = HORIZON) -> np.ndarray:
    """The expert chunk ``[horizon, 2]`` from ``scene.robot`` to ``scene.target`` passing on ``side_sign``.

    The path is the straight line plus a sideways bump ``h * b(t)`` along the left normal times ``side_sign``,
    peaking where the obstacle projects onto the line; ``h`` is the smallest value (found by bisection) for which the
    waypoint polyline keeps :data:`EXPERT_CLEARANCE` from the obstacle, so the demonstrated waypoints themselves,
    not only a continuous curve, are collision-free. Waypoints are equally spaced in ``t``.
    """
    return expert_curve(scene, side_sign, np.arange(1, horizon + 1) / horizon, horizon)


def expert_curve(scene: Scene, side_sign: int, t: np.ndarray, horizon: int = HORIZON) -> np.ndarray:
    """Points ``[len(t), 2]`` of the expert path of :func:`expert_path` at path times ``t`` (clipped to ``[0, 1]``).

    ``t = k / horizon`` is waypoint ``k`` of the chunk planned from ``scene.robot``; ``t >= 1`` is the target. The
    bump height is the one :func:`expert_path` finds for that chunk's waypoints, so the curve passes through them.
    """
    p, g = scene.robot, scene.target
    span = g - p
    length = max(float(np.linalg.norm(span)), 1e-9)
    normal = _normal(span / length) * side_sign
    peak = float(np.clip(np.dot(scene.obstacle - p, span) / length**2, 0.15, 0.85))

    def points(times: np.ndarray) -> np.ndarray:
        bump = np.where(times <= peak, np.sin(0.5 * math.pi * times / peak),
                        np.sin(0.5 * math.pi * (1 - times) / (1 - peak)))
        return lambda height: p + times[:, None] * span + height * bump[:, None] * normal

    path = points(np.arange(1, horizon + 1) / horizon)
    # A mid-episode robot may already be closer than EXPERT_CLEARANCE (jitter); then keep at least its own clearance.
    required = min(EXPERT_CLEARANCE, float(np.linalg.norm(p - scene.obstacle)) - scene.radius - 1e-3)
    if clearance(scene, path(0.0)) >= required:
        height = 0.0
    else:
        low, high = 0.0, 2.0
        for _ in range(40):
            mid = 0.5 * (low + high)
            low, high = (low, mid) if clearance(scene, path(mid)) >= required else (mid, high)
        height = high
    return points(np.clip(np.asarray(t, dtype=np.float64), 0.0, 1.0))(height)


def expert_continuation(scene: Scene, side_sign: int, progress: float, horizon: int = HORIZON) -> np.ndarray:
    """The time-consistent expert chunk ``[horizon, 2]`` of a robot ``progress`` control steps along the expert
    path planned from ``scene.robot``: that same path's points at steps ``progress + 1 .. progress + horizon``,
    staying at the target once the path has reached it (``progress + k >= horizon``).

    Why not re-plan from where the robot is (what :func:`expert_path` of the moved scene does): a re-planned chunk
    always takes ``horizon`` steps to the target, so the chunk planned after executing ``s`` actions moves at a
    different speed and on a different curve than the rest of the chunk it replaces, and the two disagree at the
    same times. A closed-loop executor switches from one chunk to the next at such times, so that disagreement is
    exactly a seam (and a policy imitating it never arrives: each chunk covers the remaining distance in
    ``horizon`` steps). The continuation of one path is what the previous chunk already said, so consecutive chunks
    agree and the robot stops at the target.
    """
    times = (progress + np.arange(1, horizon + 1)) / horizon
    return expert_curve(scene, side_sign, times, horizon)


# --- rendering ------------------------------------------------------------------------------------------------------


def to_pixels(points: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """Normalized ``[..., 2]`` (x right, y up) to pixel ``[..., 2]`` (column, row), pixel centres at +0.5."""
    points = np.asarray(points, dtype=np.float64)
    return np.stack([(points[..., 0] + 1) * 0.5 * size, (1 - points[..., 1]) * 0.5 * size], axis=-1)


def _paint_disc(image: np.ndarray, centre: np.ndarray, radius: float, color: tuple[int, int, int]) -> None:
    size = image.shape[0]
    cx, cy = to_pixels(centre, size)
    r = radius * 0.5 * size
    # Only the disc's bounding box changes; painting there keeps rendering a clip cheap.
    x0, x1 = max(int(cx - r) - 2, 0), min(int(cx + r) + 3, size)
    y0, y1 = max(int(cy - r) - 2, 0), min(int(cy + r) + 3, size)
    if x0 >= x1 or y0 >= y1:
        return
    gx = np.arange(x0, x1) + 0.5
    gy = np.arange(y0, y1) + 0.5
    distance = np.sqrt((gx[None, :] - cx) ** 2 + (gy[:, None] - cy) ** 2)
    # Anti-aliased edge (one-pixel ramp): sub-pixel positions change pixel values smoothly, which the 16x-downsampling
    # VAE needs to localize objects more finely than one latent cell.
    alpha = np.clip(r + 0.5 - distance, 0.0, 1.0)[..., None]
    patch = image[y0:y1, x0:x1]
    image[y0:y1, x0:x1] = patch * (1 - alpha) + np.asarray(color, dtype=np.float64) * alpha


def floor_color(size: int = IMAGE_SIZE) -> np.ndarray:
    """The floor: a colour ramp, red channel rising with x and green with y, ``[size, size, 3]`` float.

    Why: the transformer's only notion of where a vision token lies is the rotary phase in attention scores, which
    never reaches the attended values. A floor whose colour encodes position puts absolute coordinates into every
    vision token's content, so the policy can read where the target and obstacle are instead of learning to
    localize through rotary phases alone (a much slower fit on a CPU budget).
    """
    ramp = (np.arange(size) + 0.5) / size
    image = np.empty((size, size, 3), dtype=np.float64)
    image[..., 0] = BACKGROUND[0] + FLOOR_RAMP * ramp[None, :]
    image[..., 1] = BACKGROUND[1] + FLOOR_RAMP * ramp[::-1, None]
    image[..., 2] = BACKGROUND[2]
    return image


def _background(scene: Scene, size: int) -> np.ndarray:
    image = floor_color(size)
    _paint_disc(image, scene.obstacle, scene.radius, OBSTACLE_COLOR)
    _paint_disc(image, scene.target, TARGET_RADIUS, TARGET_COLOR)
    return image


def _with_robot(background: np.ndarray, position: np.ndarray) -> np.ndarray:
    image = background.copy()
    _paint_disc(image, position, ROBOT_RADIUS, ROBOT_COLOR)
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def render(scene: Scene, robot: np.ndarray | None = None, size: int = IMAGE_SIZE) -> np.ndarray:
    """Render ``scene`` (optionally with the robot at ``robot``) to RGB: obstacle, then target, then robot on top.

    Returns:
        `np.ndarray` of shape `[size, size, 3]`, uint8.
    """
    return _with_robot(_background(scene, size), scene.robot if robot is None else robot)


def render_clip(scene: Scene, waypoints: np.ndarray) -> list[np.ndarray]:
    """The ``H + 1`` frames of the robot following ``waypoints`` from ``scene.robot`` (frame 0 = the observation)."""
    background = _background(scene, IMAGE_SIZE)
    return [_with_robot(background, scene.robot)] + [_with_robot(background, w) for w in np.asarray(waypoints)]
