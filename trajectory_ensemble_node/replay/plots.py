"""Plots of replayed goals (matplotlib only; no rclpy): candidates against the reduced trajectory, and against the
recorded actions.

:func:`plot_channels`, :func:`plot_toy_scenes`, :func:`plot_reference` (``reference.png``) and
:func:`plot_error_by_step` (``error_by_step.png``); docs/replay.md says what each shows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a robot or in CI
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

MAX_CHANNEL_ROWS = 10
"""More channels than this (e.g. 20 for two arms) are cut to the first 10 so the rows stay readable."""
TOY_REDUCERS = ("mean", "medoid", "mode")
_REDUCER_STYLE = {"mean": ("#ff9f1c", "o"), "medoid": ("#2ec4b6", "s"), "mode": ("#f15bb5", "D")}
_CANDIDATE_COLOR = "#9bb8ff"
_COLLIDING_COLOR = "#ff6b6b"
_CHANNEL_NAMES = {
    10: ("x", "y", "z", "r1", "r2", "r3", "r4", "r5", "r6", "gripper"),
    9: ("x", "y", "z", "r1", "r2", "r3", "r4", "r5", "r6"),
    2: ("x", "y"),
}


@dataclass
class GoalPlot:
    """What the plots need of one answered goal.

    Args:
        label (`str`): Short name, e.g. ``"goal 2"``.
        stamp_s (`float`): Observation stamp, seconds since the bag's first message.
        dt (`float`): Seconds between trajectory rows.
        reduced (`np.ndarray` of shape `[H, D]`): The trajectory the node returned.
        reducer (`str`): The reducer the node used.
        candidates (`np.ndarray` of shape `[N, H, D]`, *optional*): The candidates, when returned.
        normalized (`bool`): Actions are in the model's normalized space.
        image (`np.ndarray` of shape `[h, w, 3]`, *optional*): The observation the goal was served from.
        scene (`Any`, *optional*): The toy :class:`~trajectory_ensemble_node.toy.task.Scene` of that observation.
    """

    label: str
    stamp_s: float
    dt: float
    reduced: np.ndarray
    reducer: str
    candidates: np.ndarray | None = None
    normalized: bool = True
    image: np.ndarray | None = None
    scene: Any = None


def channel_names(action_dim: int) -> list[str]:
    """Names for the action channels: pose/gripper layouts by width, else ``a0 .. aD-1``."""
    return list(_CHANNEL_NAMES.get(action_dim, [f"a{c}" for c in range(action_dim)]))


def candidate_spread(candidates: np.ndarray) -> float:
    """RMS over rows and channels of the candidates' standard deviation (action units): 0 = all identical."""
    return float(np.sqrt(np.mean(np.var(np.asarray(candidates, dtype=np.float64), axis=0))))


def plot_channels(goals: Sequence[GoalPlot], path: str | Path, title: str = "") -> Path:
    """Write the per-channel timeline figure.

    Args:
        goals (`Sequence[GoalPlot]`): Answered goals, in order (at least one).
        path (`str` or `Path`): PNG to write (parent folders are created).
        title (`str`): Figure title.

    Returns:
        `Path`: ``path``.
    """
    if not goals:
        raise ValueError("plot_channels needs at least one goal")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dim = goals[0].reduced.shape[1]
    rows = min(dim, MAX_CHANNEL_ROWS)
    names = channel_names(dim)
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(rows, 1, figsize=(11, 1.7 * rows + 1.4), sharex=True, squeeze=False)
    unit = " (normalized)" if goals[0].normalized else ""
    for c in range(rows):
        ax = axes[c, 0]
        for g, goal in enumerate(goals):
            color = colors(g % 10)
            # Row k applies (k + 1) * dt after the observation, as the node's ~/joint_trajectory times it.
            t = goal.stamp_s + (np.arange(goal.reduced.shape[0]) + 1) * goal.dt
            if goal.candidates is not None:
                for candidate in goal.candidates:
                    ax.plot(t, candidate[:, c], color=color, alpha=0.3, linewidth=0.8)
            ax.plot(t, goal.reduced[:, c], color=color, linewidth=2.2, marker="o", markersize=2.5)
            ax.axvline(goal.stamp_s, color=color, linestyle=":", linewidth=0.8)
        ax.set_ylabel(f"{names[c]}{unit}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
    axes[-1, 0].set_xlabel("bag time (s): row k of a chunk at its observation stamp (dotted) + (k+1) dt")
    handles = [plt.Line2D([], [], color="0.3", linewidth=2.2, marker="o", markersize=3, label="reduced trajectory"),
               plt.Line2D([], [], color="0.3", alpha=0.4, linewidth=0.8, label="candidates")]
    handles += [plt.Line2D([], [], color=colors(g % 10), linewidth=4,
                           label=f"{goal.label}: {goal.reducer}"
                           + (f", N={len(goal.candidates)}" if goal.candidates is not None else ""))
                for g, goal in enumerate(goals)]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 5), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0 - 0.35 / fig.get_figheight()))
    more = f"; first {rows} of {dim} channels" if rows < dim else ""
    fig.suptitle(title or f"candidates vs reduced trajectory per action channel{more}", fontsize=11, y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 1.0 - 0.75 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def reduce_offline(candidates: np.ndarray, reducers: Sequence[str] = TOY_REDUCERS) -> dict[str, np.ndarray]:
    """Apply registered reducers to returned candidates ``[N, H, D]`` (what the node would have sent)."""
    import torch

    from ..reducers import get_reducer

    tensor = torch.from_numpy(np.asarray(candidates, dtype=np.float64))
    return {name: get_reducer(name)(tensor).numpy() for name in reducers}


def plot_toy_scenes(goals: Sequence[GoalPlot], path: str | Path, reducers: Sequence[str] = TOY_REDUCERS,
                    title: str = "") -> Path:
    """Write the toy-task figure: per goal, the scene, its candidate paths and each reducer's path.

    Goals without candidates or without a scene are skipped.

    Args:
        goals (`Sequence[GoalPlot]`): Answered goals with ``candidates`` and ``scene`` set.
        path (`str` or `Path`): PNG to write.
        reducers (`Sequence[str]`): Reducers to apply offline to each goal's candidates.
        title (`str`): Figure title.

    Returns:
        `Path`: ``path``.
    """
    from ..toy.task import collides, polyline, side

    usable = [g for g in goals if g.candidates is not None and g.scene is not None]
    if not usable:
        raise ValueError("plot_toy_scenes needs goals with candidates and a toy scene")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = min(3, len(usable))
    rows = math.ceil(len(usable) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.9 * rows + 0.6), squeeze=False)
    for ax in axes.flat[len(usable):]:
        ax.axis("off")
    collisions = dict.fromkeys(reducers, 0)
    for ax, goal in zip(axes.flat, usable):
        scene = goal.scene
        if goal.image is not None:
            # The image spans [-1, 1] on both axes with y up (toy.task's convention).
            ax.imshow(goal.image, extent=(-1, 1, -1, 1), origin="upper", interpolation="nearest")
        sides = [side(scene, c) for c in goal.candidates]
        for c, candidate in enumerate(goal.candidates):
            line = polyline(scene.robot, candidate)
            bad = collides(scene, candidate)
            ax.plot(line[:, 0], line[:, 1], color=_COLLIDING_COLOR if bad else _CANDIDATE_COLOR, alpha=0.8,
                    linewidth=1.0, linestyle="--" if bad else "-")
        for name, reduced in reduce_offline(goal.candidates, reducers).items():
            color, marker = _REDUCER_STYLE.get(name, ("#ffd166", "^"))
            bad = collides(scene, reduced)
            collisions[name] += int(bad)
            line = polyline(scene.robot, reduced)
            ax.plot(line[:, 0], line[:, 1], color=color, linewidth=2.4, marker=marker, markersize=4,
                    label=f"{name}{' (node)' if name == goal.reducer else ''}: "
                          f"{'COLLIDES' if bad else 'clear'}")
        # side() is +1 left of the start->target axis: "above" for a robot travelling right, as in every toy scene.
        above = sum(s > 0 for s in sides)
        ax.set_title(f"{goal.label} (scene {scene.seed}, t={goal.stamp_s:.2f} s): {len(sides)} candidates, "
                     f"{above} above / {len(sides) - above} below", fontsize=9)
        ax.plot([], [], color=_CANDIDATE_COLOR, linewidth=1.0, label="candidate")
        ax.plot([], [], color=_COLLIDING_COLOR, linewidth=1.0, linestyle="--", label="candidate (collides)")
        ax.set_xlim(-1, 1)
        ax.set_ylim(-1, 1)
        ax.set_aspect("equal")
        ax.set_xlabel("x (normalized scene units)", fontsize=8)
        ax.set_ylabel("y (normalized scene units)", fontsize=8)
        ax.tick_params(labelsize=7)
        legend = ax.legend(loc="lower left", fontsize=7, facecolor="#303036", edgecolor="none", framealpha=0.85)
        for text in legend.get_texts():
            text.set_color("white")
    counts = ", ".join(f"{name} {n}/{len(usable)}" for name, n in collisions.items())
    fig.suptitle((title or "toy obstacle task: candidates and reducers")
                 + f"\nblue robot, green target, red obstacle; paths start at the robot. collisions: {counts}",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@dataclass
class ReferenceGoalPlot:
    """One served chunk at its own times, for :func:`plot_reference`.

    Args:
        label (`str`): Short name, e.g. ``"goal 2"``.
        stamp_s (`float`): Observation stamp (the inference point), seconds on the figure's time axis.
        times_s (`np.ndarray` of shape `[H]`): Where each row stands, same axis.
        served (`np.ndarray` of shape `[H, C]`): The served rows of the compared channels.
        compared (`np.ndarray` of shape `[H]`, bool): Rows inside the recording (the others are drawn hollow).
        candidates (`np.ndarray` of shape `[N, H, C]`, *optional*): The candidates, when returned.
    """

    label: str
    stamp_s: float
    times_s: np.ndarray
    served: np.ndarray
    compared: np.ndarray
    candidates: np.ndarray | None = None


def plot_reference(recorded: Sequence[tuple[np.ndarray, np.ndarray]], goals: Sequence[ReferenceGoalPlot],
                   names: Sequence[str], path: str | Path, title: str = "", axis_label: str = "") -> Path:
    """Write ``reference.png``: per channel the recorded actions as a line, each served chunk at its own times.

    Chunks overlap where goals come faster than a chunk lasts; the candidates are thin lines in the goal's colour
    and each inference point (the observation stamp) is a dotted line with a marker on the recording.

    Args:
        recorded (`Sequence[tuple[np.ndarray, np.ndarray]]`): Per compared channel, ``(times_s, values)``.
        goals (`Sequence[ReferenceGoalPlot]`): The compared goals, in order.
        names (`Sequence[str]`): Channel names, one per entry of ``recorded``.
        path (`str` or `Path`): PNG to write.
        title (`str`): Figure title.
        axis_label (`str`): What the time axis counts from.

    Returns:
        `Path`: ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = min(len(names), MAX_CHANNEL_ROWS)
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(rows, 1, figsize=(11, 1.9 * rows + 1.5), sharex=True, squeeze=False)
    for c in range(rows):
        ax = axes[c, 0]
        times, values = recorded[c]
        ax.plot(times, values, color="0.15", linewidth=1.4, zorder=3)
        for g, goal in enumerate(goals):
            color = colors(g % 10)
            if goal.candidates is not None:
                for candidate in goal.candidates:
                    ax.plot(goal.times_s, candidate[:, c], color=color, alpha=0.3, linewidth=0.7)
            ax.plot(goal.times_s, goal.served[:, c], color=color, linewidth=2.0, zorder=4)
            ax.scatter(goal.times_s[goal.compared], goal.served[goal.compared, c], color=color, s=9, zorder=5)
            ax.scatter(goal.times_s[~goal.compared], goal.served[~goal.compared, c], facecolors="none",
                       edgecolors=color, s=12, zorder=5)
            ax.axvline(goal.stamp_s, color=color, linestyle=":", linewidth=0.9)
            # At the foot of the axes: the recording at the stamp may belong to the episode before.
            ax.plot([goal.stamp_s], [0.0], marker="^", color=color, markersize=7, zorder=6, clip_on=False,
                    transform=ax.get_xaxis_transform())
        ax.set_ylabel(names[c], fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.25)
    axes[-1, 0].set_xlabel(axis_label or "time (s): row k of a chunk at its observation stamp (dotted) + (k+1) dt")
    handles = [plt.Line2D([], [], color="0.15", linewidth=1.4, label="recorded (interpolated between samples)"),
               plt.Line2D([], [], color="0.4", linewidth=2.0, marker="o", markersize=3, label="served chunk"),
               plt.Line2D([], [], color="0.4", alpha=0.4, linewidth=0.7, label="candidates"),
               plt.Line2D([], [], color="0.4", linestyle=":", marker="^", label="inference point (observation)"),
               plt.Line2D([], [], color="0.4", marker="o", markerfacecolor="none", linestyle="none",
                          label="row outside the recording (not compared)")]
    fig.legend(handles=handles, loc="upper center", ncol=5, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0 - 0.35 / fig.get_figheight()))
    more = f" (first {rows} of {len(names)} channels)" if rows < len(names) else ""
    fig.suptitle((title or "served chunks against the recorded actions") + more, fontsize=11, y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 1.0 - 0.6 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_error_by_step(step_s: Sequence[float], overall: Sequence[float | None],
                       per_channel: dict[str, list[float | None]], path: str | Path,
                       best: Sequence[float | None] | None = None, title: str = "") -> Path:
    """Write ``error_by_step.png``: the RMSE at each horizon step, over all channels (bold) and per channel.

    Args:
        step_s (`Sequence[float]`): Seconds ahead of the observation of each step, ``(k + 1) dt``.
        overall (`Sequence[float | None]`): RMSE per step over every channel (``None``: no row compared there).
        per_channel (`dict[str, list[float | None]]`): The same per channel.
        path (`str` or `Path`): PNG to write.
        best (`Sequence[float | None]`, *optional*): The best candidate's RMSE per step, when candidates came back.
        title (`str`): Figure title.

    Returns:
        `Path`: ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def values(series: Sequence[float | None]) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in series], dtype=np.float64)

    fig, ax = plt.subplots(figsize=(8, 4.2))
    x = np.asarray(step_s, dtype=np.float64)
    colors = plt.get_cmap("tab10")
    for c, (name, series) in enumerate(list(per_channel.items())[:MAX_CHANNEL_ROWS]):
        ax.plot(x, values(series), color=colors(c % 10), linewidth=1.0, alpha=0.8, marker=".", label=name)
    ax.plot(x, values(overall), color="0.1", linewidth=2.4, marker="o", label="served, all channels")
    if best is not None:
        ax.plot(x, values(best), color="0.1", linewidth=1.6, linestyle="--", marker="s", markersize=4,
                label="best candidate, all channels")
    ax.set_xlabel("horizon step: seconds after the observation, (k + 1) dt")
    ax.set_ylabel("RMSE against the recording")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "how fast a chunk drifts from the recorded actions", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
