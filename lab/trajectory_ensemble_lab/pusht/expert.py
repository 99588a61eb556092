"""A PushT expert against the full state: sampled pushes, each rolled out in a private copy of the physics.

Every plan is one *push*: go to a point just outside a face of the T (around the T the way the push's ``side``
says, never through it), then push along that face's inward normal (turned by a small angle) for a distance. The
expert samples pushes on every face, rolls each out in :class:`~.sim.PushTSim` from the exact current state,
and executes the one whose final T pose is nearest the target (mean distance of the T's vertices,
:func:`~.sim.keypoint_error`) per control step spent; it plans again when the push is done or the T strays from
the prediction. A rollout that reaches the env's success ends there and wins by its length.

**The route is explicit and seeded.** The first plan scores every face on both sides of the T and groups the
rollouts by :class:`ExpertRoute` (the face pushed first, the way around the T the approach takes). Every route
within :data:`ROUTE_TOLERANCE` of the best improvement is a good way to start, and the expert's own seed draws one
of them uniformly: two seeds on the same start go around the T in different ways whenever the start allows it.
Later pushes are the best of seeded samples, so they differ too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import shapely
import shapely.geometry as sg
import shapely.ops

from .sim import (AGENT_RADIUS, ARENA, FACES, OUTLINE, SUCCESS_COVERAGE, PushTSim, PushTState, coverage,
                  keypoint_error, to_world)

GAP = 10.0
"""Pixels between the agent's edge and the face where a push starts."""
CLEARANCE = AGENT_RADIUS + 6.0
"""How far the approach keeps the agent's centre from the T (the PD lag cuts corners by a few pixels)."""
APPROACH_SPEED = 22.0
"""Pixels per control step the approach target moves along its path."""
PUSH_SPEED = 12.0
"""Pixels per control step the push target moves: slow enough that the T follows the agent, not its momentum."""
SETTLE_STEPS = 4
"""At most this many steps holding a target for the agent to arrive (within :data:`SETTLE_TOLERANCE`)."""
SETTLE_TOLERANCE = 4.0
STEP_COST = 0.25
"""Keypoint pixels a control step is worth: the 300-step budget makes a fast push better than a slightly better
slow one."""
FIRST_SAMPLES_PER_ROUTE = 5
SAMPLES = 36
REFINE = 10
ROUTE_TOLERANCE = 0.6
"""A route is a good way to start when its best first push gains at least this share of the best route's gain."""
REPLAN_DRIFT = 3.0
"""Keypoint pixels between the T and its predicted pose that make the expert plan again before the push ends."""
SUCCESS_CHECK = 4.0
"""Keypoint error under which a rollout asks shapely for the coverage: no pose of 20 000 drawn around the target
covered more than 0.95 with an error above 2.84 px, and shapely's intersection is the rollout's dearest call."""
SIDES = {1: "ccw", -1: "cw"}
"""The way around the T an approach goes, by the sign of the angle it sweeps about the T's centre (env pixel
coordinates, y down: ``ccw`` here is clockwise in the rendered picture)."""


@dataclass(frozen=True)
class ExpertRoute:
    """How the expert starts an episode: the mode of the demonstration.

    Args:
        face (`str`): The face of the T it pushes first (one of :data:`~.sim.FACES`).
        side (`str`): ``"ccw"`` or ``"cw"``: the way around the T its approach to that face goes.
    """

    face: str
    side: str

    def as_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"face": self.face, "side": self.side}


@dataclass(frozen=True)
class Push:
    """One push: where on the T, which way, how far.

    Args:
        face (`int`): Index into :data:`~.sim.FACES`.
        at (`float`): Contact point along the face, 0 at its first vertex, 1 at its second.
        angle (`float`): Push direction, radians from the face's inward normal.
        distance (`float`): Pixels the push target travels past the contact.
        side (`int`): +1 or -1: the way around the T the approach goes (:data:`SIDES`).
        resume (`bool`): Push on from where the agent is, along the previous push (no approach).
    """

    face: int
    at: float
    angle: float
    distance: float
    side: int
    resume: bool = False


@dataclass
class Plan:
    """A push rolled out: the actions to send and what the rollout predicts.

    Args:
        push (`Push`): What was planned.
        actions (`np.ndarray` of shape `(K, 2)`): Absolute agent targets, one per control step.
        poses (`np.ndarray` of shape `(K, 3)`): Predicted T pose after each action.
        cost (`float`): Final keypoint error plus :data:`STEP_COST` per step; far below zero when it succeeds.
        side (`int`): The sign of the angle the approach sweeps about the T (0 without an approach).
        success (`bool`): The rollout reached the env's success.
        direction (`np.ndarray` of shape `(2,)`): Unit direction of the push (zeros when it has none), what a
            ``resume`` push continues along.
    """

    push: Push
    actions: np.ndarray
    poses: np.ndarray
    cost: float
    side: int
    success: bool
    direction: np.ndarray = field(default_factory=lambda: np.zeros(2))


def _outline_polygon(pose: np.ndarray) -> sg.Polygon:
    return sg.Polygon(to_world(pose, OUTLINE))


def _face_frame(pose: np.ndarray, face: int, at: float) -> tuple[np.ndarray, np.ndarray]:
    """Contact point and outward unit normal of ``face`` at ``at``, in the world."""
    a, b = to_world(pose, OUTLINE[[face, (face + 1) % len(OUTLINE)]])
    edge = b - a
    normal = np.array([edge[1], -edge[0]]) / np.linalg.norm(edge)
    return a + at * edge, normal


def _rotate(v: np.ndarray, angle: float) -> np.ndarray:
    c, s = math.cos(angle), math.sin(angle)
    return np.array([c * v[0] - s * v[1], s * v[0] + c * v[1]])


def _in_arena(p: np.ndarray) -> bool:
    return bool(ARENA[0] <= p[0] <= ARENA[1] and ARENA[0] <= p[1] <= ARENA[1])


def _swept_angle(points: Sequence[np.ndarray], centre: np.ndarray) -> float:
    angles = [math.atan2(p[1] - centre[1], p[0] - centre[0]) for p in points]
    return sum((b - a + math.pi) % (2 * math.pi) - math.pi for a, b in zip(angles, angles[1:]))


def approach_path(start: np.ndarray, goal: np.ndarray, pose: np.ndarray, side: int) -> list[np.ndarray]:
    """Waypoints from ``start`` to ``goal`` around the T at ``pose`` the way ``side`` says (+1: increasing angle).

    The path follows the convex hull of the T grown by :data:`CLEARANCE` in that direction, then is pulled tight
    (a waypoint is dropped when the segment past it stays clear of the T). An agent touching the T backs away
    from it first.

    Args:
        start (`np.ndarray` of shape `(2,)`): The agent's centre now.
        goal (`np.ndarray` of shape `(2,)`): Where the push starts, outside the T.
        pose (`np.ndarray` of shape `(3,)`): The T's ``(x, y, angle)``.
        side (`int`): +1 or -1 (:data:`SIDES`).

    Returns:
        `list[np.ndarray]`: ``start``, the waypoints, ``goal``.
    """
    body = _outline_polygon(pose)
    grown = body.buffer(CLEARANCE, join_style="mitre")
    inner = body.buffer(CLEARANCE - 2.0, join_style="mitre")
    shapely.prepare(inner)
    points = [np.asarray(start, dtype=np.float64)]
    if inner.contains(sg.Point(start)):
        nearest = np.array(shapely.ops.nearest_points(body.exterior, sg.Point(start))[0].coords[0])
        away = start - nearest
        away = away / max(np.linalg.norm(away), 1e-6)
        points.append(np.clip(nearest + away * (CLEARANCE + 2.0), *ARENA))
    hull = np.array(grown.convex_hull.exterior.coords[:-1])
    centre = np.array(body.centroid.coords[0])
    a0 = math.atan2(points[-1][1] - centre[1], points[-1][0] - centre[0])
    a1 = math.atan2(goal[1] - centre[1], goal[0] - centre[0])
    angles = np.arctan2(hull[:, 1] - centre[1], hull[:, 0] - centre[0])
    to_vertex = (side * (angles - a0)) % (2 * math.pi)
    to_goal = (side * (a1 - a0)) % (2 * math.pi)
    between = np.argsort(to_vertex)
    points += [np.clip(hull[i], *ARENA) for i in between if to_vertex[i] < to_goal]
    points.append(np.asarray(goal, dtype=np.float64))

    def clear(p: np.ndarray, q: np.ndarray) -> bool:
        return not inner.intersects(sg.LineString([p, q]))

    pulled, i = [points[0]], 0
    while i < len(points) - 1:
        j = len(points) - 1
        while j > i + 1 and not clear(points[i], points[j]):
            j -= 1
        pulled.append(points[j])
        i = j
    return pulled


def _along(path: Sequence[np.ndarray], speed: float) -> list[np.ndarray]:
    """Targets every ``speed`` pixels along a polyline, ending on its last point."""
    targets, carry = [], 0.0
    for p, q in zip(path, path[1:]):
        seg = float(np.linalg.norm(q - p))
        s = speed - carry
        while s < seg:
            targets.append(p + (q - p) * (s / seg))
            s += speed
        carry = seg - (s - speed)
    targets.append(np.asarray(path[-1], dtype=np.float64))
    return targets


class PushTExpert:
    """The planner. Call :meth:`act` with the env's state every control step; it returns the absolute target.

    Args:
        seed (`int` or `Sequence[int]`): The expert's own seed: the route it takes (:attr:`route`) and every push
            sample come from it, so the same seed on the same start gives the same episode.
        max_steps (`int`): Steps left in the episode when it starts (pushes are cut to fit).
    """

    def __init__(self, seed: int | Sequence[int], max_steps: int = 300) -> None:
        self.rng = np.random.default_rng(seed)
        self.sim = PushTSim()
        self.route: ExpertRoute | None = None
        self.routes_open: list[ExpertRoute] = []
        self.plan: Plan | None = None
        self._cursor = 0
        self._steps_left = max_steps
        self.plans = 0
        self.rollouts = 0

    # --- rollouts -------------------------------------------------------------------------------------------------

    def _sample(self, face: int | None, side: int | None, error: float) -> Push:
        rng = self.rng
        top = float(np.clip(2.0 * error, 6.0, 90.0))
        return Push(face=int(rng.integers(len(FACES))) if face is None else face, at=float(rng.uniform(0.1, 0.9)),
                    angle=float(rng.choice([0.0, 0.0, -0.35, 0.35]) + rng.normal(0.0, 0.08)),
                    distance=float(math.exp(rng.uniform(math.log(2.0), math.log(top)))),
                    side=int(rng.choice([-1, 1])) if side is None else side)

    def _targets(self, state: PushTState, push: Push) -> tuple[list[np.ndarray], list[np.ndarray], int] | None:
        """Approach targets, push targets and the approach's side; ``None`` when the push cannot start."""
        if push.resume and self.plan is not None:
            direction = self.plan.direction
            return [], _along([state.agent, state.agent + direction * push.distance], PUSH_SPEED), 0
        contact, normal = _face_frame(state.block, push.face, push.at)
        direction = _rotate(-normal, push.angle)
        start = contact + normal * (AGENT_RADIUS + GAP)
        if not _in_arena(start) or _outline_polygon(state.block).distance(sg.Point(start)) < AGENT_RADIUS + GAP - 0.5:
            return None
        path = approach_path(state.agent, start, state.block, push.side)
        sweep = _swept_angle(path, to_world(state.block, np.array([[0.0, 45.0]]))[0])
        end = start + direction * (GAP + push.distance)
        return _along(path, APPROACH_SPEED)[:-1] + [start], _along([start, end], PUSH_SPEED), int(np.sign(sweep))

    def rollout(self, state: PushTState, push: Push, budget: int) -> Plan | None:
        """Roll ``push`` out from ``state`` in the private sim, for at most ``budget`` steps.

        Args:
            state (`PushTState`): Where the env is now.
            push (`Push`): The push to try.
            budget (`int`): Control steps left in the episode.

        Returns:
            `Plan` or `None`: ``None`` when the push cannot start (its start point is off the arena or too near
            the T).
        """
        made = self._targets(state, push)
        if made is None:
            return None
        approach, pushing, side = made
        self.rollouts += 1
        sim = self.sim
        sim.set_state(state)
        actions: list[np.ndarray] = []
        poses: list[np.ndarray] = []
        success = False

        def step(target: np.ndarray) -> bool:
            nonlocal success
            actions.append(np.clip(target, 0.0, 512.0))
            sim.step(actions[-1])
            pose = sim.block_pose()
            poses.append(pose)
            if keypoint_error(pose) < SUCCESS_CHECK and coverage(pose) > SUCCESS_COVERAGE:
                success = True
            return success or len(actions) >= budget

        done = False
        for phase in (approach, pushing):
            for target in phase:
                if done := step(target):
                    break
            for _ in range(SETTLE_STEPS if phase else 0):
                if done or np.linalg.norm(sim.agent_position() - phase[-1]) < SETTLE_TOLERANCE:
                    break
                done = step(phase[-1])
            if done:
                break
        if not actions:
            return None
        final = poses[-1]
        cost = -1000.0 + len(actions) if success else keypoint_error(final) + STEP_COST * len(actions)
        direction = (pushing[-1] - pushing[0]) if len(pushing) > 1 else np.zeros(2)
        norm = float(np.linalg.norm(direction))
        return Plan(push, np.array(actions), np.array(poses), cost, side, success,
                    direction / norm if norm > 0 else np.zeros(2))

    # --- planning -------------------------------------------------------------------------------------------------

    def _first_plan(self, state: PushTState, error: float, budget: int) -> Plan | None:
        by_route: dict[ExpertRoute, Plan] = {}
        for face in range(len(FACES)):
            for side in (-1, 1):
                for _ in range(FIRST_SAMPLES_PER_ROUTE):
                    plan = self.rollout(state, self._sample(face, side, error), budget)
                    if plan is None or plan.side == 0:
                        continue
                    route = ExpertRoute(FACES[face], SIDES[plan.side])
                    if route not in by_route or plan.cost < by_route[route].cost:
                        by_route[route] = plan
        if not by_route:
            return None
        best = min(p.cost for p in by_route.values())
        gain = error - best
        good = [r for r, p in by_route.items() if gain > 0 and error - p.cost >= ROUTE_TOLERANCE * gain]
        self.routes_open = sorted(good, key=lambda r: (FACES.index(r.face), r.side))
        if not self.routes_open:
            self.routes_open = [min(by_route, key=lambda r: by_route[r].cost)]
        self.route = self.routes_open[int(self.rng.integers(len(self.routes_open)))]
        return self._refine(state, by_route[self.route], error, budget, keep_route=True)

    def _refine(self, state: PushTState, best: Plan, error: float, budget: int, keep_route: bool = False) -> Plan:
        rng = self.rng
        for _ in range(REFINE):
            p = best.push
            at = float(np.clip(p.at + rng.normal(0, 0.08), 0.05, 0.95))
            angle = p.angle + float(rng.normal(0, 0.1))
            trial = Push(p.face, at, angle, max(1.0, p.distance * float(math.exp(rng.normal(0, 0.3)))), p.side,
                         p.resume)
            plan = self.rollout(state, trial, budget)
            if plan is None or (keep_route and plan.side != best.side):
                continue
            if plan.cost < best.cost:
                best = plan
        return best

    def _next_plan(self, state: PushTState, budget: int) -> Plan | None:
        error = keypoint_error(state.block)
        if self.route is None:
            return self._first_plan(state, error, budget)
        candidates = [self._sample(None, None, error) for _ in range(SAMPLES)]
        if self.plan is not None and np.any(self.plan.direction):
            top = float(np.clip(2.0 * error, 6.0, 90.0))
            candidates += [Push(self.plan.push.face, 0.5, 0.0, d, 0, resume=True) for d in (2.0, 5.0, 10.0, 20.0, top)
                           if d <= top]
        plans = [p for p in (self.rollout(state, c, budget) for c in candidates) if p is not None]
        if not plans:
            return None
        return self._refine(state, min(plans, key=lambda p: p.cost), error, budget)

    def act(self, state: PushTState) -> np.ndarray:
        """The absolute target ``(x, y)`` for this control step, in env pixels (what ``env.step`` takes).

        Args:
            state (`PushTState`): The env's full state now (:func:`~.sim.read_state`).

        Returns:
            `np.ndarray` of shape `(2,)`, float32.
        """
        plan = self.plan
        stale = plan is None or self._cursor >= len(plan.actions)
        if not stale and self._cursor > 0:
            drift = float(np.mean(np.linalg.norm(to_world(state.block, OUTLINE) -
                                                 to_world(plan.poses[self._cursor - 1], OUTLINE), axis=1)))
            stale = drift > REPLAN_DRIFT
        if stale:
            self.plans += 1
            fresh = self._next_plan(state, max(1, self._steps_left))
            if fresh is None:  # nowhere to push from: hold still and try again next step
                self._steps_left -= 1
                return state.agent.astype(np.float32)
            self.plan, self._cursor = fresh, 0
        action = self.plan.actions[self._cursor]
        self._cursor += 1
        self._steps_left -= 1
        return np.asarray(action, dtype=np.float32)
