"""Markdown table and PNG of a closed-loop bench result (see :mod:`.closed_loop` for the JSON it reads)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.toy import task

METRICS = (
    ("success_rate", "success", "rate"),
    ("collision_rate", "collision", "rate"),
    ("mode_flips_per_episode", "flips/episode", "float3"),
    ("seam_jump_mean", "seam mean", "float4"),
    ("seam_jump_max", "seam max", "float4"),
    ("jerk", "jerk", "float0"),
    ("steps_to_target", "steps to target", "float1"),
)


def _cell(entry: dict[str, Any], key: str, kind: str) -> str:
    value, interval = entry.get(key), entry.get(f"{key}_ci95")
    if value is None:
        return "-"
    if kind == "rate":
        return f"{100 * value:.0f}% [{100 * interval[0]:.0f}, {100 * interval[1]:.0f}]"
    digits = int(kind[-1])
    return f"{value:.{digits}f} [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"


def markdown_table(result: dict[str, Any]) -> str:
    """One table per delay: methods as rows, metrics (value [95% interval]) as columns."""
    closed = result["closed_loop"]
    settings = result.get("settings", {})
    parts = [
        f"Closed loop on the toy task: {settings.get('scenes', '?')} held-out scenes "
        f"(seeds {settings.get('scene_seeds', '?')}), chunk {settings.get('chunk', '?')}, "
        f"s = {settings.get('s', '?')} actions executed per chunk, dt = {settings.get('dt', 0):.3f} s, budget "
        f"{settings.get('step_budget', '?')} steps, {settings.get('num_inference_steps', '?')} denoising steps, "
        f"'{settings.get('context_guidance', 'prefix')}' guidance for the gradient-free methods. "
        f"Run {settings.get('date', '?')} at commit {settings.get('commit', '?')}"
        f"{', pipeline ' + settings['pipeline'] if 'pipeline' in settings else ''}. 95% intervals in brackets.\n"
    ]
    for note in settings.get("notes", []):
        parts.append(f"Note: {note}\n")
    delays = list(next(iter(closed.values())).keys())
    for delay in delays:
        header = "| method | " + " | ".join(label for _, label, _ in METRICS) + " |\n|---|" + "---|" * len(METRICS)
        rows = [f"| {name} | " + " | ".join(_cell(closed[name][delay], key, kind) for key, _, kind in METRICS) + " |"
                for name in closed]
        parts.append(f"**Delay d = {delay}**\n\n{header}\n" + "\n".join(rows) + "\n")
    if "median_group_ms" in settings:
        parts.append("Median group latency (ms, CPU): " + ", ".join(
            f"{k}: {v:.0f}" for k, v in sorted(settings["median_group_ms"].items())) + "\n")
    return "\n".join(parts)


def write_markdown(result: dict[str, Any], path: Path) -> None:
    path.write_text(markdown_table(result))


def write_plot(result: dict[str, Any], episodes: dict[str, dict[int, list]], scenes: Sequence[task.Scene],
               path: Path) -> None:
    """Bars of success, flips and seam per method and delay, plus one scene's paths (naive vs guided_mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    closed = result["closed_loop"]
    names = list(closed)
    delays = list(next(iter(closed.values())).keys())
    fig, axes = plt.subplots(1, 4, figsize=(22, 5))
    width = 0.8 / len(delays)
    for ax, (key, label) in zip(axes[:3], (("success_rate", "success rate"), ("mode_flips_per_episode",
                                                                              "mode flips / episode"),
                                           ("seam_jump_mean", "mean seam jump"))):
        for j, delay in enumerate(delays):
            values = np.array([closed[n][delay][key] for n in names])
            ci = np.array([closed[n][delay][f"{key}_ci95"] for n in names]).T
            x = np.arange(len(names)) + j * width
            ax.bar(x, values, width, label=f"d = {delay}")
            ax.errorbar(x, values, yerr=np.abs(ci - values), fmt="none", ecolor="k", capsize=2)
        ax.set_xticks(np.arange(len(names)) + width * (len(delays) - 1) / 2, names, rotation=45, ha="right")
        ax.set_title(label)
        ax.legend()
    ax = axes[3]
    delay = int(delays[-1])
    if scenes:
        # The first scene where naive async flips sides, else scene 0: the case continuity is for.
        naive = episodes.get("naive_async", {}).get(delay, [])
        pick = next((i for i, e in enumerate(naive) if e.flips > 0), 0)
        scene = scenes[pick]
        ax.add_patch(plt.Circle(scene.obstacle, scene.radius, color="#dc3232", alpha=0.6))
        ax.add_patch(plt.Circle(scene.target, task.TARGET_RADIUS, color="#28c85a", alpha=0.6))
        for name, color in (("naive_async", "#ff7f0e"), ("guided_mode", "#1f77b4"), ("sync", "#555555")):
            if name in episodes and delay in episodes[name]:
                episode = episodes[name][delay][pick]
                p = np.asarray(episode.positions)
                ax.plot(p[:, 0], p[:, 1], "-o", ms=2, color=color, label=f"{name} ({episode.flips} flips)")
                switch = p[np.asarray(episode.switches, dtype=int)] if episode.switches else np.zeros((0, 2))
                ax.plot(switch[:, 0], switch[:, 1], "x", color=color, ms=8)
        ax.set_xlim(-1, 1)
        ax.set_ylim(-1, 1)
        ax.set_aspect("equal")
        ax.set_title(f"scene {scene.seed}, d = {delay} (x: chunk switches)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
