"""Markdown table and PNG plot of a toy quality-bench result (see :mod:`.quality` for the JSON it reads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from trajectory_ensemble_node.toy import task

# Fixed order and colours, so plots of different runs compare at a glance.
REDUCER_ORDER = ("single", "mean", "median", "trimmed_mean", "medoid", "mode")
COLORS = {
    "single": "#555555",
    "mean": "#d62728",
    "median": "#ff7f0e",
    "trimmed_mean": "#bcbd22",
    "medoid": "#1f77b4",
    "mode": "#2ca02c",
}


def _ordered(quality: dict[str, Any]) -> list[str]:
    return [name for name in REDUCER_ORDER if name in quality] + sorted(set(quality) - set(REDUCER_ORDER))


def _rate(entry: dict[str, Any], key: str) -> str:
    if key not in entry:
        return "-"
    low, high = entry[f"{key}_ci95"]
    return f"{100 * entry[key]:.0f}% [{100 * low:.0f}, {100 * high:.0f}]"


def markdown_table(result: dict[str, Any]) -> str:
    """README-ready tables: collision rate, final error and mode agreement per reducer (rows) and N (columns).

    Args:
        result (`dict`): The quality-bench JSON object.
    """
    quality = result["quality"]
    names = _ordered(quality)
    ns = list(next(iter(quality.values())).keys())
    settings = result.get("settings", {})
    header = "| reducer | " + " | ".join(f"N={n}" for n in ns) + " |\n|---|" + "---|" * len(ns) + "\n"
    run_line = ""
    if settings.get("date") or settings.get("commit"):
        run_line = f"Run {settings.get('date', '?')}, commit {settings.get('commit', '?')}. "
    agreement_scenes = settings.get("agreement_scenes", settings.get("scenes"))
    agreement_note = (f" Mode agreement on the first {agreement_scenes} scenes."
                      if agreement_scenes != settings.get("scenes") else "")
    parts = [
        (f"{run_line}Held-out scenes: {settings.get('scenes', '?')} (seeds {settings.get('scene_seeds', '?')}), "
        f"{settings.get('num_inference_steps', '?')} denoising steps, no CFG. 95% intervals in brackets: Wilson for "
        f"rates, bootstrap over scenes for the mean error.{agreement_note}\n"),
        "**Collision rate** (lower is better)\n\n" + header
        + "".join(f"| {name} | " + " | ".join(_rate(quality[name][n], "collision_rate") for n in ns) + " |\n"
                  for name in names),
        "**Final position error** (mean, normalized units; lower is better)\n\n" + header
        + "".join(
            f"| {name} | "
            + " | ".join(
                f"{quality[name][n]['final_error']:.3f} [{quality[name][n]['final_error_ci95'][0]:.3f}, "
                f"{quality[name][n]['final_error_ci95'][1]:.3f}]"
                for n in ns
            )
            + " |\n"
            for name in names
        ),
    ]
    if any("mode_agreement" in quality[name][n] for name in names for n in ns):
        parts.append(
            "**Mode agreement between consecutive chunks** (higher is better)\n\n" + header
            + "".join(f"| {name} | " + " | ".join(_rate(quality[name][n], "mode_agreement") for n in ns) + " |\n"
                      for name in names)
        )
    diagnostics = result.get("diagnostics", {})
    if diagnostics:
        above = diagnostics.get("fraction_above_per_scene", [])
        parts.append(
            f"Candidates at N={diagnostics.get('n_for_side_stats')}: "
            f"{diagnostics.get('scenes_with_both_sides')}/{len(above)} scenes have candidates on both sides; "
            f"per-scene share passing above: {min(above, default=0):.1f}-{max(above, default=0):.1f} "
            f"(mean {np.mean(above) if above else 0:.2f}); per-candidate collision rate "
            f"{100 * diagnostics.get('candidate_collision_rate', 0):.1f}%.\n"
        )
    return "\n".join(parts)


def write_markdown(result: dict[str, Any], path: Path) -> None:
    """Write :func:`markdown_table` to ``path``."""
    path.write_text(markdown_table(result))


def write_plot(
    result: dict[str, Any],
    path: Path,
    example: task.Scene | None = None,
    candidates: np.ndarray | None = None,
) -> None:
    """Three metric panels (value vs N with 95% intervals, one line per reducer) and, when given, one example scene
    with its candidates and the ``mean`` / ``mode`` reductions.

    Args:
        result (`dict`): The quality-bench JSON object.
        path (`Path`): PNG to write.
        example (`task.Scene`, *optional*): Scene to draw.
        candidates (`np.ndarray` of shape `[N, H, 2]`, *optional*): Its candidates.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trajectory_ensemble_node.reducers import get_reducer

    quality = result["quality"]
    names = _ordered(quality)
    ns = [int(n) for n in next(iter(quality.values()))]
    panels = [("collision_rate", "collision rate"), ("final_error", "final error"),
              ("mode_agreement", "mode agreement")]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.8))
    for axis, (key, title) in zip(axes, panels):
        for offset, name in enumerate(names):
            # Mode agreement is measured at a subset of N only.
            present = [n for n in ns if key in quality[name][str(n)]]
            if not present:
                continue
            entries = [quality[name][str(n)] for n in present]
            values = np.array([e[key] for e in entries])
            low = np.array([e[f"{key}_ci95"][0] for e in entries])
            high = np.array([e[f"{key}_ci95"][1] for e in entries])
            # Small horizontal offsets keep overlapping intervals readable.
            xs = np.array(present, dtype=float) + (offset - len(names) / 2) * 0.08
            # Wilson bounds at a rate of exactly 0 or 1 can cross it by a rounding error; matplotlib refuses that.
            yerr = np.clip([values - low, high - values], 0.0, None)
            axis.errorbar(xs, values, yerr=yerr, marker="o", capsize=3,
                          color=COLORS.get(name), label=name, linewidth=2 if name in ("mean", "mode") else 1)
        axis.set_xticks(ns)
        axis.set_xlabel("N candidates")
        axis.set_title(f"{title} (95% CI)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    settings = result.get("settings", {})
    fig.suptitle(f"toy obstacle task, {settings.get('scenes', '?')} held-out scenes, shipped weights "
                 f"(run {settings.get('date', '?')}, commit {settings.get('commit', '?')})")
    axis = axes[3]
    if example is not None and candidates is not None:
        axis.imshow(task.render(example), extent=(-1, 1, -1, 1))
        for candidate in candidates:
            line = task.polyline(example.robot, candidate)
            axis.plot(line[:, 0], line[:, 1], color="white", alpha=0.5, linewidth=1)
        import torch

        stacked = torch.as_tensor(np.asarray(candidates), dtype=torch.float32)
        for name in ("mean", "mode"):
            line = task.polyline(example.robot, get_reducer(name)(stacked).numpy())
            axis.plot(line[:, 0], line[:, 1], color=COLORS[name], linewidth=2.5, marker="o", markersize=3,
                      label=name)
        axis.legend(fontsize=8, loc="lower right")
        axis.set_title(f"scene {example.seed}: N={len(candidates)} candidates (white)")
        axis.set_xlim(-1, 1)
        axis.set_ylim(-1, 1)
    else:
        axis.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
