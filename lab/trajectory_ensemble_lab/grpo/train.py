"""``trajectory-ensemble train-grpo``: Flow-GRPO fine-tuning of the toy policy from its own candidate groups.

Each iteration:

1. **Sample**: ``--scenes`` training scenes (seeds in the task's training range), one rollout group of
   ``--group-size`` candidates each (per-candidate seeds, Flow-GRPO SDE steps with log-probs recorded);
2. **Score**: reward per candidate from the task's metrics (:func:`..toy.grpo.score`);
3. **Normalize**: group-normalized advantages (:func:`..toy.grpo.group_advantages`);
4. **Recompute**: the recorded transitions' log-probs with gradients (:func:`..toy.grpo.recompute_log_probs`);
   the first recompute of every iteration, before the update, must reproduce the record (ratio 1);
5. **Step**: clipped-ratio policy gradient (optional KL to the starting policy), AdamW;
6. **Publish**: the new transformer weights as safetensors, pushed to the policy that draws the next groups:
   ``update_weights`` in process (``--in-process``, the default), or the node's ``~/update_weights`` (``--ros``,
   :mod:`.grpo_ros`), whose later rollouts must carry the new ``weights_version``.

Before the first and after the last iteration, the served policy (serving sampler, no SDE noise) is evaluated on
held-out scenes that training never sees: per-candidate collision and success rates with Wilson 95% intervals.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, RolloutSpec, encode_conditioning, read_record
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.toy import ACTION_SETTINGS, load_toy_pipeline, request_kwargs, task
from ..toy.grpo import (
    GroupRecord,
    GrpoError,
    PolicyTrainer,
    RewardWeights,
    StepSettings,
    group_advantages,
    score,
)
from trajectory_ensemble_node.stats import wilson
from ..records import write_json

TRAIN_SCENE_RANGE = 100_000
"""Training scenes are drawn from seeds ``TRAIN_SEED_BASE + [0, TRAIN_SCENE_RANGE)``, far below the held-out base."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the ``train-grpo`` options on ``parser``."""
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--in-process", dest="ros", action="store_false", help="drive the model directly (default)")
    mode.add_argument("--ros", dest="ros", action="store_true", help="drive a live node subprocess")
    parser.set_defaults(ros=False)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--scenes", type=int, default=8, help="training scenes (rollout groups) per iteration")
    parser.add_argument("--group-size", type=int, default=8, help="candidates per rollout group (N)")
    parser.add_argument("--steps", type=int, default=task.NUM_INFERENCE_STEPS, help="denoising steps")
    parser.add_argument("--noise-level", type=float, default=0.7, help="Flow-GRPO eta of the rollouts")
    parser.add_argument("--sde-steps", type=str, default="",
                        help="steps that take the SDE transition, e.g. '0-5' or '0,1,2' (default: all, as the node's "
                             "rollout goals; in process only); the others are deterministic and not trained")
    parser.add_argument("--lr", type=float, default=3e-5, help="AdamW learning rate")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--clip", type=float, default=0.2, help="PPO clip range of the per-step ratio")
    parser.add_argument("--kl", type=float, default=0.0, help="weight of the KL to the starting policy (0 = off)")
    parser.add_argument("--std-floor", type=float, default=0.1, help="smallest group std dividing advantages")
    parser.add_argument("--reward-collision", type=float, default=1.0)
    parser.add_argument("--reward-success", type=float, default=1.0)
    parser.add_argument("--reward-error", type=float, default=1.0)
    parser.add_argument("--heldout-scenes", type=int, default=64, help="held-out scenes evaluated before and after")
    parser.add_argument("--heldout-offset", type=int, default=0, help="first held-out scene (HELDOUT_SEED_BASE + k)")
    parser.add_argument("--heldout-group", type=int, default=8, help="candidates per held-out scene")
    parser.add_argument("--pipeline", type=Path, default=None, help="starting pipeline dir (default: shipped toy)")
    parser.add_argument("--work-dir", type=Path, default=Path("out/grpo"), help="weights, rollouts, log")
    parser.add_argument("--json", type=Path, default=Path("out/grpo/grpo.json"), help="results JSON")
    parser.add_argument("--plot", type=Path, default=None, help="PNG (default: beside the JSON)")
    parser.add_argument("--seed", type=int, default=0, help="scene sampling and candidate seeds")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")



def conditioning_for(pipe: Any, scene: task.Scene) -> Any:
    """The group conditioning the serving path encodes for ``scene`` (the trainer needs its prefix and masks)."""
    kwargs = request_kwargs(task.render(scene))
    return encode_conditioning(pipe, prompt=kwargs["prompt"], negative_prompt=None, action=kwargs["action"],
                               fps=kwargs["fps"], guidance_scale=kwargs["guidance_scale"], device=torch.device("cpu"))


class InProcessPolicy:
    """The serving side in this process: a ``Cosmos3ActionModel`` with its own pipeline copy.

    Args:
        pipeline (`Path`, *optional*): Starting weights (default: the shipped toy).
        steps (`int`): Denoising steps.
        noise_level (`float`): Rollout ``eta``.
        rollout_dir (`Path`): Where rollout files are written (each group's record is read back from its file, as
            a trainer fed by a node would).
        sde_steps (`tuple[int, ...]`, *optional*): SDE steps of the rollouts (``None``: all).
    """

    def __init__(self, pipeline: Path | None, steps: int, noise_level: float, rollout_dir: Path,
                 sde_steps: tuple[int, ...] | None = None) -> None:
        self.model = Cosmos3ActionModel(load_toy_pipeline(path=pipeline), max_batch_candidates=64)
        self.steps = steps
        self.noise_level = noise_level
        self.sde_steps = sde_steps
        self.rollout_dir = rollout_dir

    @property
    def weights_version(self) -> int:
        return self.model.weights_version

    def rollout(self, scenes: Sequence[task.Scene], base_seeds: Sequence[int], count: int
                ) -> list[tuple[dict[str, torch.Tensor], dict[str, Any]]]:
        """One rollout group per scene, submitted together (the engine co-batches them)."""
        handles = []
        for scene, seed in zip(scenes, base_seeds, strict=True):
            kwargs = request_kwargs(task.render(scene))
            kwargs["num_inference_steps"] = self.steps
            spec = CandidateTrajectorySpec(count=count, reducer="mean", return_candidates=True)
            handles.append(self.model.submit(**kwargs, spec=spec, base_seed=int(seed),
                                             rollout=RolloutSpec(noise_level=self.noise_level,
                                                                 sde_steps=self.sde_steps,
                                                                 output_dir=self.rollout_dir)))
        self.model.run_until_idle()
        records = []
        for handle in handles:
            path = handle.result().rollout.path
            records.append(read_record(path))
            # About 8 MB per group of 8 (every step's latents): read once, then dropped so a run stays small.
            path.unlink()
            path.with_suffix(".json").unlink()
        return records

    def push(self, path: Path) -> int:
        return self.model.update_weights(path).weights_version

    def candidates(self, scenes: Sequence[task.Scene], base_seeds: Sequence[int], count: int) -> list[np.ndarray]:
        """Serving-path candidates ``[N, H, 2]`` per scene (no rollout noise): what the node serves."""
        handles = []
        for scene, seed in zip(scenes, base_seeds, strict=True):
            kwargs = request_kwargs(task.render(scene))
            kwargs["num_inference_steps"] = self.steps
            spec = CandidateTrajectorySpec(count=count, reducer="mean", return_candidates=True)
            handles.append(self.model.submit(**kwargs, spec=spec, base_seed=int(seed)))
        self.model.run_until_idle()
        return [handle.result().candidates.double().numpy() for handle in handles]

    def close(self) -> None:
        """Nothing to stop in process."""


def parse_steps(text: str) -> tuple[int, ...] | None:
    """``'0-5'`` or ``'0,2,3'`` to a step tuple; ``''`` to ``None`` (all steps)."""
    if not text.strip():
        return None
    steps: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            steps.extend(range(int(low), int(high or low) + 1))
    except ValueError as error:
        raise GrpoError(f"--sde-steps must look like '0-5' or '0,2,3', got {text!r}.") from error
    return tuple(sorted(set(steps)))


def heldout_metrics(policy: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Per-candidate collision and success rates (Wilson 95%) on the held-out scenes, serving sampler."""
    scenes = task.heldout_scenes(args.heldout_scenes, seed=args.heldout_offset)
    seeds = [10_000 + i for i in range(len(scenes))]
    collided = succeeded = total = 0
    errors: list[float] = []
    for first in range(0, len(scenes), 8):
        batch = scenes[first:first + 8]
        for scene, candidates in zip(batch, policy.candidates(batch, seeds[first:first + 8], args.heldout_group)):
            metrics = score(scene, candidates)
            collided += int(metrics["collision"].sum())
            succeeded += int(metrics["success"].sum())
            errors.extend(metrics["final_error"].tolist())
            total += len(candidates)
    return {
        "candidate_collision_rate": collided / total,
        "candidate_collision_rate_ci95": list(wilson(collided, total)),
        "success_rate": succeeded / total,
        "success_rate_ci95": list(wilson(succeeded, total)),
        "final_error_mean": float(np.mean(errors)),
        "collisions": collided,
        "successes": succeeded,
        "candidates": total,
    }


def train(args: argparse.Namespace, policy: Any, log=print) -> dict[str, Any]:
    """Run the GRPO loop against ``policy`` (in-process or ROS); returns the ``grpo`` result object."""
    trainer_pipe = load_toy_pipeline(path=args.pipeline)
    trainer = PolicyTrainer(trainer_pipe.transformer, lr=args.lr, weight_decay=args.weight_decay,
                            settings=StepSettings(clip=args.clip, kl=args.kl))
    weights = RewardWeights(success=args.reward_success, collision=args.reward_collision, error=args.reward_error)
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    log("held-out evaluation (before)...")
    before = heldout_metrics(policy, args)
    log(f"  before: collision {before['candidate_collision_rate']:.3f} success {before['success_rate']:.3f}")
    iterations: list[dict[str, Any]] = []
    initial_dev = None
    versions: list[int] = []
    for it in range(args.iterations):
        t0 = time.perf_counter()
        seeds = rng.choice(TRAIN_SCENE_RANGE, size=args.scenes, replace=False)
        scenes = [task.make_scene(task.TRAIN_SEED_BASE + int(s)) for s in seeds]
        base_seeds = [int(x) for x in rng.integers(0, 2**31 - 1, size=args.scenes)]
        raw = policy.rollout(scenes, base_seeds, args.group_size)
        group_versions = {int(m["weights_version"]) for _, m in raw}
        if len(group_versions) != 1:
            raise RuntimeError(f"iteration {it}: rollout groups carry several weights versions {group_versions}")
        records = [GroupRecord(conditioning=conditioning_for(trainer_pipe, scene), tensors=t, manifest=m, scene=scene)
                   for scene, (t, m) in zip(scenes, raw)]
        metrics = [score(scene, record.candidates, weights) for scene, record in zip(scenes, records)]
        rewards = np.stack([m["reward"] for m in metrics])
        advantages = group_advantages(rewards, args.std_floor)
        if it == 0:
            # Acceptance 1: before any update, the trainer's recompute reproduces every recorded log-prob.
            initial_dev = trainer.ratio_deviation(records)
            log(f"iteration 0: max |ratio - 1| before any update = {initial_dev:.2e}")
        stats = trainer.step(records, advantages)
        path = trainer.save(args.work_dir / "weights" / f"grpo_{it + 1:04d}.safetensors")
        version = policy.push(path)
        versions.append(version)
        entry = {
            "iteration": it,
            "weights_version_sampled": group_versions.pop(),
            "weights_version_pushed": version,
            "reward_mean": float(rewards.mean()),
            "rollout_collision_rate": float(np.mean([m["collision"].mean() for m in metrics])),
            "rollout_success_rate": float(np.mean([m["success"].mean() for m in metrics])),
            "groups_with_signal": int((rewards.std(axis=1) > 0).sum()),
            **{k: float(v) for k, v in stats.items()},
            "seconds": round(time.perf_counter() - t0, 1),
        }
        iterations.append(entry)
        log(f"iteration {it}: reward {entry['reward_mean']:+.3f} collision {entry['rollout_collision_rate']:.3f} "
            f"ratio dev {entry['ratio_max_abs_dev']:.1e} clip {entry['clip_fraction']:.3f} "
            f"grad {entry['grad_norm']:.2f} -> v{version} ({entry['seconds']:.0f} s)")
    log("held-out evaluation (after)...")
    after = heldout_metrics(policy, args)
    log(f"  after: collision {after['candidate_collision_rate']:.3f} success {after['success_rate']:.3f}")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if not k.startswith("_")}
    settings.update({
        "heldout_scene_seeds": [task.HELDOUT_SEED_BASE + args.heldout_offset,
                                task.HELDOUT_SEED_BASE + args.heldout_offset + args.heldout_scenes - 1],
        "train_scene_seeds": [task.TRAIN_SEED_BASE, task.TRAIN_SEED_BASE + TRAIN_SCENE_RANGE - 1],
        "action_settings": dict(ACTION_SETTINGS, num_inference_steps=args.steps),
        "log_prob": "action tokens only; mean over noisy action elements (rollout.py definition)",
        "heldout_sampler": "serving path (UniPC, no SDE noise), per-candidate seeds 10000 + scene index",
    })
    return {
        "initial_ratio_max_abs_dev": initial_dev,
        "reward_by_iteration": [e["reward_mean"] for e in iterations],
        "heldout": {"before": before, "after": after},
        "iterations": iterations,
        "weights_versions": versions,
        "final_weights": str(args.work_dir / "weights" / f"grpo_{args.iterations:04d}.safetensors"),
        "reward": "success*{} - collision*{} - final_error*{}; success = no collision and final error <= {}".format(
            args.reward_success, args.reward_collision, args.reward_error, task.TARGET_RADIUS),
        "settings": settings,
        "wall_seconds": round(time.perf_counter() - started, 1),
    }


def write_plot(result: dict[str, Any], path: Path) -> None:
    """Reward and rollout collision rate by iteration; held-out rates before/after with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grpo = result["grpo"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    its = [e["iteration"] for e in grpo["iterations"]]
    axes[0].plot(its, grpo["reward_by_iteration"], "o-", label="mean reward (training rollouts)")
    twin = axes[0].twinx()
    twin.plot(its, [e["rollout_collision_rate"] for e in grpo["iterations"]], "s--", color="tab:red",
              label="rollout collision rate")
    axes[0].set_xlabel("iteration")
    axes[0].set_ylabel("mean reward")
    twin.set_ylabel("collision rate (SDE rollouts)", color="tab:red")
    axes[0].set_title("training")
    for k, key in enumerate(("candidate_collision_rate", "success_rate")):
        for j, when in enumerate(("before", "after")):
            entry = grpo["heldout"][when]
            low, high = entry[f"{key}_ci95"]
            x = k * 3 + j
            axes[1].bar(x, entry[key], color=("tab:gray", "tab:blue")[j], label=when if k == 0 else None)
            axes[1].errorbar(x, entry[key], yerr=[[entry[key] - low], [high - entry[key]]], color="black", capsize=4)
    axes[1].set_xticks([0.5, 3.5], ["candidate collision", "success"])
    axes[1].set_title(f"held-out ({grpo['heldout']['before']['candidates']} candidates, 95% Wilson)")
    axes[1].legend()
    fig.suptitle(f"Flow-GRPO on the toy policy ({result['date']}, {result['commit']})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    """Train, write JSON and plot; returns 0 (1 when the iteration-0 ratio check fails)."""
    torch.set_num_threads(args.threads)
    commit = git_commit()  # the code that ran, not whatever HEAD is when the run ends
    args.work_dir.mkdir(parents=True, exist_ok=True)
    sde_steps = parse_steps(args.sde_steps)
    if args.ros:
        from .ros import RosPolicy

        if sde_steps is not None:
            raise GrpoError(f"--sde-steps {args.sde_steps!r} needs --in-process: the node's rollout goals take the "
                            "SDE transition on every step.")

        policy = RosPolicy(args)
    else:
        policy = InProcessPolicy(args.pipeline, args.steps, args.noise_level, args.work_dir / "rollouts", sde_steps)
    try:
        grpo = train(args, policy, log=lambda m: print(m, flush=True))
        if args.ros:
            grpo["ros_checks"] = policy.report()
    finally:
        policy.close()
    result = {"grpo": grpo, "date": utc_now(),
              "commit": commit, "torch": torch.__version__}
    write_json(args.json, result)
    write_plot(result, args.plot or args.json.with_suffix(".png"))
    print(f"wrote {args.json}", flush=True)
    return 0 if grpo["initial_ratio_max_abs_dev"] is not None and grpo["initial_ratio_max_abs_dev"] <= 1e-5 else 1
