"""The toy task's training states and their expert labels: what ``train-toy`` encodes (:mod:`.data`).

A training seed gives its initial scene, sometimes a mid-episode state, and on request closed-loop states along an
expert detour and recovery states near the target; each comes with the expert's chunks for it. The scenes, the expert
and the metrics are the product's (:mod:`trajectory_ensemble_node.toy.task`); only training needs these states.
"""

from __future__ import annotations

import math

import numpy as np

from trajectory_ensemble_node.toy import task


def _mid_episode(seed: int, mid_probability: float) -> tuple[task.Scene, int, int, np.ndarray] | None:
    # The initial scene, the detour side, the waypoints followed and the (jittered) position of one mid-episode state.
    scene = task.make_scene(task.TRAIN_SEED_BASE + seed)
    rng = np.random.default_rng([int(seed), 0x31D])
    if rng.uniform() < mid_probability:
        side_sign = int(rng.choice([1, -1]))
        detour = task.expert_path(scene, side_sign)
        k = int(rng.integers(2, task.REPLAN_AFTER + 2))
        return scene, side_sign, k, detour[k - 1] + rng.normal(0.0, 0.01, size=2)
    return None


def training_states(seed: int, mid_probability: float = 0.35) -> list[task.Scene]:
    """The states one training seed contributes: its initial scene, plus (with ``mid_probability``) one mid-episode
    state reached by following a random expert detour for 2..``task.REPLAN_AFTER + 1`` waypoints, with 0.01 jitter."""
    scene = task.make_scene(task.TRAIN_SEED_BASE + seed)
    mid = _mid_episode(seed, mid_probability)
    return [scene] if mid is None else [scene, scene.with_robot(mid[3])]


CLOSED_LOOP_JITTER = 0.02
"""Position noise of closed-loop training states (normalized units; 2.5 px): a policy's own chunks, not the
expert's, decide where the robot is when the next chunk is planned."""
CLOSED_LOOP_PROGRESS = (0.5, task.HORIZON + 2.0)
"""Range of control steps along the expert path of closed-loop training states (uniform; beyond ``task.HORIZON``: at
the target)."""


RECOVERY_DISTANCE = (0.03, 0.35)
"""Range of distances from the target of recovery training states (uniform; normalized units)."""


def approach(scene: task.Scene, speed: float, horizon: int = task.HORIZON) -> np.ndarray:
    """The time-consistent straight approach ``[horizon, 2]`` from ``scene.robot`` to ``scene.target``: ``speed``
    per control step along the line, then staying at the target.

    Executing ``s`` of its actions and planning again from where the robot is gives the rest of the same approach,
    so consecutive chunks agree, as :func:`task.expert_continuation` does along a detour.
    """
    span = scene.target - scene.robot
    length = float(np.linalg.norm(span))
    travelled = np.minimum(speed * np.arange(1, horizon + 1), length)
    if length == 0.0:
        return np.repeat(scene.target[None], horizon, axis=0).astype(np.float64)
    return scene.robot + travelled[:, None] * (span / length)


def recovery_state(scene: task.Scene, rng: np.random.Generator,
                   attempts: int = 16) -> tuple[task.Scene, np.ndarray] | None:
    """A state near ``scene``'s target off any expert path, labelled with :func:`approach` at the expert's mean speed.

    The robot is placed at a distance uniform in :data:`RECOVERY_DISTANCE`, in a uniform direction, inside the image
    and with the straight approach keeping :data:`task.EXPERT_CLEARANCE` from the obstacle; ``None`` when ``attempts``
    draws found no such place.
    """
    speed = float(np.linalg.norm(scene.target - scene.robot)) / task.HORIZON
    for _ in range(attempts):
        distance = rng.uniform(*RECOVERY_DISTANCE)
        angle = rng.uniform(0.0, 2.0 * math.pi)
        position = scene.target + distance * np.array([math.cos(angle), math.sin(angle)])
        if np.abs(position).max() > 1.0 - task.ROBOT_RADIUS:
            continue
        moved = scene.with_robot(position)
        label = approach(moved, speed)
        if task.clearance(moved, label) >= task.EXPERT_CLEARANCE:
            return moved, label
    return None


def training_examples(seed: int, mid_probability: float = 0.35, closed_loop_states: int = 0,
                      recovery_states: int = 0) -> list[tuple[task.Scene, list[np.ndarray]]]:
    """The training states of one seed with their expert chunks (one per expert option of the state).

    With ``closed_loop_states = 0`` these are :func:`training_states`, each mid-episode state labelled with the
    expert re-planned from where the robot stands (:func:`task.expert_path` of the moved scene); this is the dataset
    the shipped toy policy was first trained on.

    With ``closed_loop_states = K > 0`` the seed also contributes ``K`` states along one of the initial scene's
    expert detours (side drawn from :func:`task.expert_sides`, progress uniform in :data:`CLOSED_LOOP_PROGRESS` control
    steps, :data:`CLOSED_LOOP_JITTER` position noise), and every state after the start, the mid-episode one
    included, is labelled with the continuation of the detour it is on (:func:`task.expert_continuation`).

    Why: executing ``s`` of ``H`` actions per chunk takes the robot past where the mid-episode states stop (at most
    ``task.REPLAN_AFTER + 1`` waypoints in): past the obstacle and up to the target. A policy that has never seen those
    images has no reason to keep going (the first toy policy's chunks jumped backward there in every method). And
    a re-planned label there would teach chunks that disagree with the one being executed (see
    :func:`task.expert_continuation`); the continuation teaches the policy to keep to the path it is on, at the speed
    it started with, and to stay once it has arrived, which is what makes consecutive chunks meet at a seam.
    The image shows the robot, obstacle and target, not where the episode started, so the speed along the path
    is only implied (the initial spans vary by about +-15 %); the label is what the expert would do from there.

    With ``recovery_states = R > 0`` the seed also contributes up to ``R`` :func:`recovery_state` s: the robot
    near the target but off the expert paths, labelled with the straight approach. Why: a policy's own chunks
    leave the robot 0.1-0.2 from the target in places no expert path passes, and a policy trained only on the
    paths hovers there (the closed-loop fine-tune's stalled episodes all end so).
    """
    scene = task.make_scene(task.TRAIN_SEED_BASE + seed)
    if closed_loop_states <= 0:
        examples = [(state, [task.expert_path(state, side_sign) for side_sign in task.expert_sides(state)])
                    for state in training_states(seed, mid_probability)]
    else:
        examples = [(scene, [task.expert_path(scene, side_sign) for side_sign in task.expert_sides(scene)])]
        mid = _mid_episode(seed, mid_probability)
        if mid is not None:
            _, side_sign, k, position = mid
            examples.append((scene.with_robot(position), [task.expert_continuation(scene, side_sign, float(k))]))
        rng = np.random.default_rng([int(seed), 0xC105ED])
        sides = task.expert_sides(scene)
        for _ in range(closed_loop_states):
            side_sign = int(sides[int(rng.integers(len(sides)))])
            progress = float(rng.uniform(*CLOSED_LOOP_PROGRESS))
            position = task.expert_curve(scene, side_sign, np.array([progress / task.HORIZON]))[0]
            position = position + rng.normal(0.0, CLOSED_LOOP_JITTER, size=2)
            examples.append((scene.with_robot(position), [task.expert_continuation(scene, side_sign, progress)]))
    return examples + recovery_examples(seed, recovery_states)


def recovery_examples(seed: int, count: int) -> list[tuple[task.Scene, list[np.ndarray]]]:
    """Up to ``count`` :func:`recovery_state` s of one training seed, each with its one chunk (its own stream)."""
    scene = task.make_scene(task.TRAIN_SEED_BASE + seed)
    rng = np.random.default_rng([int(seed), 0x5EC0])
    states = [recovery_state(scene, rng) for _ in range(count)]
    return [(state, [label]) for state, label in (s for s in states if s is not None)]
