"""``make demo``'s PushT panel: one PushT start played through the node over DDS with reducer ``mode`` and ``mean``.

The demo (``trajectory_ensemble_node/demo/demo.py``) imports this module by name when the lab, ``gym_pusht`` and the
bundled PushT weights are installed. :func:`run` starts one node serving the policy on sim time (a free ROS domain,
its log under ``<out>/pusht/``) and plays the same validation start twice with the product's simulated robot acting
in :class:`.ros_world.PushTWorld`, as ``bench --pusht --through node`` plays its reducers: goals of N = 8 candidates,
8 of the 16 rows executed, the env stopped until each chunk arrives (fixed delay 0), every goal fresh. Goal ``c``
has base seed ``300 s + c`` in both runs, so both draw the same candidates until their paths part; the reducer is
the only difference.

It writes ``<out>/pusht.png`` (a row per reducer: the env's render at about five chunk switches with the 8 candidate
chunks thin and the served chunk bold, in env coordinates, and the coverage of both episodes by step) and
``<out>/pusht.json`` (date, commit, seed, settings, and per episode its coverage, success, steps, every goal's
candidate count and the drawn goals' candidates and served chunks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trajectory_ensemble_node.provenance import git_commit, utc_now

from .sim import CONTROL_HZ, ENV_ID, MAX_STEPS, SUCCESS_COVERAGE, PushTError
from ..records import write_json

if TYPE_CHECKING:
    from trajectory_ensemble_node.demo.sim_model import EpisodeRecord, GoalRecord, SimSettings

    from .ros_world import PushTTrace

PANEL_SEED = 100_000
"""The validation start the panel plays (docs/pusht.md's seed ranges), chosen on the shipped policy's validation run
(bench/results/pusht_validation.json): the one start `mode`@8 solves and `mean`@8 does not (0.956 in 194 steps
against 0.559). Held-out starts are never shown."""
METHODS = ("mode", "mean")
COUNT = 8
EXECUTE = 8
FIXED_DELAY = 0
FRAMES = 5
"""Chunk switches drawn per episode, spread evenly over its goals (the first included)."""
RENDER_SIZE = 512
"""Pixels of each drawn frame: the env's own 512 x 512 drawing, not its 96 x 96 observation scaled up."""
REAL_TIME_FACTOR = 2.0
"""Sim seconds per wall second between goals. The clock stops on the step each goal is due and while its chunk
computes (``hold_for_goals``, fixed delay 0), so the episode does not depend on it, only the wall time does. Not
higher: the node drops a frame stamped 0.5 s of sim time after its own clock, which trails ``/clock`` by its update
period and by however long a loaded machine keeps it waiting (250 ms of wall time here)."""
OBSERVATION_AGE_S = 10.0
"""The node's ``max_observation_age_s``: staleness is not what the panel shows, and a loaded machine must not make a
demo refuse its frames."""
EXIT_BAD_MODEL, EXIT_NO_ANSWER, EXIT_NODE_FAILED = 2, 3, 4


@dataclass
class Played:
    """One reducer's episode: the sim's record and the env's trace (:class:`.ros_world.PushTTrace`)."""

    method: str
    record: EpisodeRecord
    trace: PushTTrace


def sim_settings(method: str, max_steps: int) -> SimSettings:
    """The :class:`~trajectory_ensemble_node.demo.sim_model.SimSettings` that play ``method`` as the bench's reducers
    through the node: N = :data:`COUNT`, :data:`EXECUTE` rows executed, fixed delay 0, every goal fresh, candidates
    returned, the clock held for each goal."""
    from trajectory_ensemble_node.demo.sim_model import SimSettings

    from .train import CHUNK

    return SimSettings(execute=EXECUTE, real_time_factor=REAL_TIME_FACTOR, fps=float(CONTROL_HZ),
                       image_rate=float(CONTROL_HZ), continue_previous=False, candidates=COUNT, reducer=method,
                       step_budget=max_steps, fixed_delay=FIXED_DELAY, horizon=CHUNK, return_candidates=True,
                       hold_for_goals=True)


def node_params(model: str, device: str, settings: SimSettings) -> dict[str, Any]:
    """The node's parameters: the bundled policy by name (``pusht``: its trained settings) or a ``train-pusht``
    checkpoint directory (:func:`.ros_world.node_params`), on sim time, at the node's default denoising steps.

    Raises:
        PushTError: ``model`` is neither ``pusht`` nor a PushT checkpoint.
    """
    if model == "pusht":
        from trajectory_ensemble_node.bundled import PUSHT_SETTINGS

        params: dict[str, Any] = {"model": "pusht", **PUSHT_SETTINGS, "use_sim_time": True}
    else:
        from .ros_world import node_params as checkpoint_params

        params = checkpoint_params(Path(model), settings)
    params.update({"device": device, "candidate_count": COUNT, "max_observation_age_s": OBSERVATION_AGE_S})
    return params


def play(params: dict[str, Any], seed: int, max_steps: int, log_dir: Path,
         log: Callable[[str], None]) -> list[Played]:
    """Each of :data:`METHODS` on start ``seed`` through one node started here (the caller's ``ROS_DOMAIN_ID`` is
    given back afterwards).

    Raises:
        NodeStartError: The node did not come up (its log says why).
        NodeUnreachableError, TimeoutError: It did not answer.
    """
    from trajectory_ensemble_node.demo.sim_report import simulate

    from .ros_world import PushTWorld, node_in_free_domain

    def stopped(code: int) -> None:
        if code != 0:
            log(f"PushT panel: the node exited with status {code}; see {log_dir / 'node.log'}")

    played: list[Played] = []
    with node_in_free_domain(params, log_dir, on_exit=stopped):
        for method in METHODS:
            world = PushTWorld()
            (record,) = simulate([seed], sim_settings(method, max_steps), world=world, log=lambda _: None)
            played.append(Played(method, record, world.traces[-1]))
            trace = played[-1].trace
            log(f"PushT {method}: max coverage {max(trace.coverage, default=0.0):.3f}, "
                f"{'success' if trace.success else 'no success'} in {len(trace.actions)} steps, "
                f"{len(record.goals)} goals, {record.wall_s:.0f} s")
    return played


def node_default(name: str) -> Any:
    """The node's default for parameter ``name`` (what it serves with when the panel does not set it)."""
    from trajectory_ensemble_node.serving.params import PARAMETERS

    return next(spec.default for spec in PARAMETERS if spec.name == name)


def drawn_goals(record: EpisodeRecord) -> list[int]:
    """About :data:`FRAMES` goal indices spread evenly over the goals that returned candidates, the first included."""
    answered = sorted(record.candidates)
    if not answered:
        return []
    picks = np.linspace(0, len(answered) - 1, min(FRAMES, len(answered))).round().astype(int)
    return [answered[i] for i in sorted(set(picks.tolist()))]


def goal_step(record: EpisodeRecord, goal: GoalRecord) -> int:
    """The control step whose frame ``goal`` was served from (its stamp, counted from the episode's start)."""
    if goal.stamp_s is None:
        raise PushTError(f"goal {goal.index} of start {record.scene_seed} has no answer ({goal.status})")
    return int(round((goal.stamp_s - record.start_s) * CONTROL_HZ))


def renders(trace: PushTTrace, steps: Sequence[int]) -> list[np.ndarray]:
    """The env's own frame, drawn :data:`RENDER_SIZE` square, after each of ``steps`` control steps, by replaying the
    trace's stepped actions in a fresh env: the same float32 targets give the same poses (``test_pusht_sim`` checks
    it). The observation drawing, not ``render()``, which also marks the last target with a red cross."""
    import gymnasium as gym
    import gym_pusht  # noqa: F401  (registers the env id)

    env = gym.make(ENV_ID, obs_type="pixels", observation_width=RENDER_SIZE, observation_height=RENDER_SIZE)
    frame, _ = env.reset(seed=trace.env_seed)
    frames, done = {0: frame}, 0
    for step in sorted(set(steps)):
        for action in trace.actions[done:step]:
            frame = env.step(np.asarray(action, dtype=np.float32))[0]
        done = max(done, step)
        frames[step] = frame
    env.close()
    return [np.asarray(frames[s]) for s in steps]


def episode_document(played: Played) -> dict[str, Any]:
    """One episode of ``pusht.json``: outcome, coverage by step, every goal's candidate count, and the drawn goals'
    candidates and served chunks (env pixels, rounded to 1e-3)."""
    record, trace = played.record, played.trace
    goals = {g.index: g for g in record.goals}
    frames = []
    for index in drawn_goals(record):
        candidates, served = record.candidates[index]
        frames.append({"goal": index, "seed": goals[index].seed, "step": goal_step(record, goals[index]),
                       "candidates": np.round(candidates.astype(np.float64), 3).tolist(),
                       "served": np.round(served.astype(np.float64), 3).tolist()})
    return {"method": played.method, "env_seed": trace.env_seed, "steps": len(trace.actions),
            "outcome": record.outcome, "max_coverage": max(trace.coverage, default=0.0),
            "final_coverage": trace.coverage[-1] if trace.coverage else 0.0, "success": trace.success,
            "goals": [{"index": g.index, "seed": g.seed, "status": g.status,
                       "candidate_count": len(record.candidates[g.index][0]) if g.index in record.candidates else 0}
                      for g in record.goals],
            "coverage": list(trace.coverage), "frames": frames, "wall_s": record.wall_s}


def plot(played: Sequence[Played], documents: Sequence[dict[str, Any]], path: Path, title: str) -> Path:
    """Write the panel: a row per reducer of frames with candidates and served chunk, and the coverage by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(len(d["frames"]) for d in documents)
    fig = plt.figure(figsize=(2.6 * cols + 4.0, 2.9 * len(played) + 0.6), layout="constrained")
    frames_side, coverage_side = fig.subfigures(1, 2, width_ratios=[2.6 * cols, 3.6])
    rows = np.atleast_1d(frames_side.subfigures(len(played), 1))
    colors = {"mode": "#ff7f0e", "mean": "#9c27b0"}  # apart from the env's blue agent, grey T and green target
    for row, one, doc in zip(rows, played, documents):
        color = colors.get(one.method, "black")
        outcome = f"success in {doc['steps']} steps" if doc["success"] else f"no success in {doc['steps']} steps"
        row.suptitle(f"{one.method}: max coverage {doc['max_coverage']:.2f}, {outcome}", fontsize=10, color=color,
                     fontweight="bold")
        axes = np.atleast_1d(row.subplots(1, cols))
        images = renders(one.trace, [f["step"] for f in doc["frames"]])
        for ax, frame, image in zip(axes, doc["frames"], images):
            # The frame is the env's 512 x 512 drawing (y down), so env pixels plot onto it as they are.
            ax.imshow(image, extent=(0, 512, 512, 0))
            for chunk in np.asarray(frame["candidates"]):
                ax.plot(chunk[:, 0], chunk[:, 1], "-", color="#444444", lw=0.7, alpha=0.75)
            served = np.asarray(frame["served"])
            ax.plot(served[:, 0], served[:, 1], "-", color=color, lw=2.6)
            ax.plot(served[:EXECUTE, 0], served[:EXECUTE, 1], "o", color=color, ms=2.4)
            ax.set_xlim(0, 512)
            ax.set_ylim(512, 0)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"step {frame['step']} (goal {frame['goal']})", fontsize=8)
        for ax in axes[len(doc["frames"]):]:
            ax.axis("off")
    ax = coverage_side.subplots()
    for one, doc in zip(played, documents):
        ax.plot(np.arange(1, len(doc["coverage"]) + 1), doc["coverage"], "-", color=colors.get(one.method, "black"),
                lw=1.4, label=f"{one.method} (max {doc['max_coverage']:.2f})")
    ax.axhline(SUCCESS_COVERAGE, color="#2ca02c", lw=0.8, ls="--", label=f"success (> {SUCCESS_COVERAGE})")
    ax.set_xlabel("control step (10 Hz)", fontsize=8)
    ax.set_ylabel("coverage of the target", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_box_aspect(1.0)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("coverage by step", fontsize=9)
    fig.suptitle(title, fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def run(out: Path, *, model: str = "pusht", device: str = "cpu", seed: int = PANEL_SEED, max_steps: int = MAX_STEPS,
        log: Callable[[str], None] = print) -> int:
    """Play :data:`METHODS` on start ``seed`` through the node and write ``<out>/pusht.png`` and ``<out>/pusht.json``.

    Args:
        out (`Path`): Output folder (the demo's ``out/demo``); the node's log goes to ``<out>/pusht/node.log``.
        model (`str`): ``pusht`` (the bundled policy) or a ``train-pusht`` checkpoint directory.
        device (`str`): The node's torch device.
        seed (`int`): A validation start (100 000 .. 199 999).
        max_steps (`int`): Step cap per episode, at most the env's 300 (a lower cap is said in the JSON and picture).
        log (`Callable[[str], None]`): Progress lines.

    Returns:
        `int`: 0; 2 a refused setting or model; 3 the node did not answer; 4 it did not start.
    """
    from trajectory_ensemble_node.catalog import model_notice
    from trajectory_ensemble_node.cli.launcher import NodeStartError
    from trajectory_ensemble_node.cli.ros_client import NodeUnreachableError
    from trajectory_ensemble_node.demo.sim_report import finite

    from . import HELDOUT_SEED_BASE, VALIDATION_SEED_BASE
    from .train import CHUNK

    try:
        if not VALIDATION_SEED_BASE <= seed < HELDOUT_SEED_BASE:
            raise PushTError(f"seed {seed} is not a validation start ({VALIDATION_SEED_BASE}..{HELDOUT_SEED_BASE - 1})")
        if not 1 <= max_steps <= MAX_STEPS:
            raise PushTError(f"max_steps must be in 1..{MAX_STEPS}, got {max_steps}")
        params = node_params(model, device, sim_settings(METHODS[0], max_steps))
    except PushTError as error:
        log(f"error: PushT panel: {error}")
        return EXIT_BAD_MODEL
    log(f"PushT panel: start {seed}, {' and '.join(METHODS)} at N = {COUNT}, {EXECUTE} of {CHUNK} rows executed, "
        f"fixed delay {FIXED_DELAY}, at most {max_steps} steps; node log {out / 'pusht' / 'node.log'}")
    try:
        played = play(params, seed, max_steps, out / "pusht", log)
    except NodeStartError as error:
        log(f"error: PushT panel: {error}")
        return EXIT_NODE_FAILED
    except (NodeUnreachableError, TimeoutError) as error:
        log(f"error: PushT panel: {error}")
        return EXIT_NO_ANSWER
    documents = [episode_document(p) for p in played]
    capped = max_steps < MAX_STEPS
    settings = {"methods": list(METHODS), "candidates": COUNT, "execute": EXECUTE, "horizon": CHUNK,
                "fixed_delay": FIXED_DELAY, "continue_previous": False, "step_budget": max_steps,
                "capped": capped, "env_limit": MAX_STEPS, "real_time_factor": REAL_TIME_FACTOR,
                "num_inference_steps": params.get("num_inference_steps", node_default("num_inference_steps")),
                "base_seeds": f"300 * {seed} + goal", "model": model, "model_notice": model_notice(model),
                "device": device}
    document = {"date": utc_now(), "commit": git_commit(), "env": "gym_pusht/PushT-v0 (gym-pusht 0.1.8)",
                "seed": seed, "settings": settings, "episodes": {d["method"]: d for d in documents}}
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "pusht.json", finite(document))
    cap = f", capped at {max_steps} of the env's {MAX_STEPS} steps" if capped else ""
    title = (f"PushT start {seed} through the node over DDS ({model_notice(model)}): {COUNT} candidates (grey), the "
             f"served chunk (bold; dots: the {EXECUTE} rows executed), fixed delay {FIXED_DELAY}{cap}")
    picture = plot(played, documents, out / "pusht.png", title)
    log(f"PushT panel: wrote {picture} and {out / 'pusht.json'}")
    return 0
