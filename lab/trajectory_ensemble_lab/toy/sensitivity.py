"""How much a toy policy's clean action prediction reads the action latent it is denoising.

Guidance reaches past the frozen prefix only through the model: the frozen actions and the ramp are pulled into the
latent, and the next step's clean prediction ``x0_hat = x - sigma * v`` must move with them. This measures
``d x0_hat[target] / d x[source]`` by finite differences on the real transformer (one raw channel, the packed
training forward of :mod:`.train`), per noise level, averaged over training examples and both raw channels. A
denoiser that reads its own latent fully gives ``1 / (1 - sigma)`` on the diagonal; one that predicts from the image
alone gives 0. As ``sigma -> 0`` every flow model tends to 1 on the diagonal, since ``x0_hat -> x``.

A second probe, :func:`prefix_speed_gain`, asks the same of the frozen prefix through the serving path: give a
group the expert's chunk walked at two speeds as its frozen prefix and see how far the first free action moves with
it. Gain 1: the policy continues the prefix's speed; gain 0: it plans from the image alone.

A third, :func:`first_switch_spread`, looks at the candidates where the closed-loop seam is measured: at the first
chunk switch of the closed-loop bench (``d = 2``), how far the N candidates' first free action lies from the old plan,
split into the distance of their mean (a bias every candidate shares, which selection among them cannot remove) and
their spread around it (what selection can use), guided and not.

``python -m trajectory_ensemble_lab.toy.sensitivity --pipeline DIR [--pipeline DIR ...] --json PATH``
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine.context import ExecutionContext
from trajectory_ensemble_node.models.cosmos3 import PackItem, forward_items
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.toy import request_kwargs, task
from .augment import retime_chunk
from .closed_loop import DT, EXECUTE, scene_seed
from .data import ToyDataset, build_dataset
from ..records import write_json

DEFAULT_SIGMAS = (0.9, 0.7, 0.5, 0.3, 0.15, 0.05)
DEFAULT_JSON = Path("bench/results/latent_sensitivity-toy.json")


def _clean_prediction(pipe: Any, dataset: ToyDataset, vision: torch.Tensor, action: torch.Tensor,
                      sigma: float) -> torch.Tensor:
    item = PackItem(branch=dataset.branch, vision=vision, action=action, timestep=sigma * 1000.0)
    with torch.no_grad():
        _, preds = forward_items(pipe.transformer, [item], torch.device("cpu"))
    raw = dataset.actions.shape[-1]
    velocity = preds[0][0, :, :raw].float()
    return action[0, :, :raw].float() - sigma * velocity


def latent_sensitivity(pipe: Any, dataset: ToyDataset, *, target: int = 2, sources: Sequence[int] = (0, 1, 2),
                       sigmas: Sequence[float] = DEFAULT_SIGMAS, examples: Sequence[int] | None = None,
                       delta: float = 0.05, seed: int = 0) -> dict[str, dict[str, float]]:
    """Mean ``d x0_hat[target] / d x[source]`` per source action and noise level.

    Args:
        pipe (`Cosmos3OmniPipeline`): The policy (float32).
        dataset (`ToyDataset`): Encoded examples; their clean clips and chunks set the noisy inputs.
        target (`int`): Action whose clean prediction is read.
        sources (`Sequence[int]`): Actions whose latent is moved.
        sigmas (`Sequence[float]`): Noise levels in ``(0, 1)``.
        examples (`Sequence[int]`, *optional*): Example indexes (default: all).
        delta (`float`): Finite-difference step in normalized units, ``> 0``.
        seed (`int`): Noise seed.

    Returns:
        `dict`: ``{str(source): {str(sigma): mean derivative}}``.
    """
    horizon, raw = dataset.actions.shape[1:]
    if not (0 <= target < horizon and all(0 <= s < horizon for s in sources)):
        raise ValueError(f"target {target!r} and sources {list(sources)!r} must be actions in [0, {horizon})")
    if delta <= 0 or any(not 0.0 < s < 1.0 for s in sigmas):
        raise ValueError(f"delta must be > 0 and sigmas in (0, 1), got {delta!r} and {list(sigmas)!r}")
    generator = torch.Generator().manual_seed(seed)
    width = pipe.transformer.config.action_dim
    chosen = list(range(len(dataset.actions))) if examples is None else list(examples)
    out: dict[str, dict[str, float]] = {str(s): {} for s in sources}
    for sigma in sigmas:
        values: dict[int, list[float]] = {s: [] for s in sources}
        for example in chosen:
            clip = dataset.clips[example : example + 1]
            vision = clip.clone()
            vision[:, :, 1:] = (1 - sigma) * clip[:, :, 1:] + sigma * torch.randn(clip[:, :, 1:].shape,
                                                                                 generator=generator)
            action = torch.zeros(1, horizon, width)
            eps = torch.randn(horizon, raw, generator=generator)
            action[0, :, :raw] = (1 - sigma) * dataset.actions[example] + sigma * eps
            base = _clean_prediction(pipe, dataset, vision, action, sigma)
            for source in sources:
                for channel in range(raw):
                    moved = action.clone()
                    moved[0, source, channel] += delta
                    shifted = _clean_prediction(pipe, dataset, vision, moved, sigma)
                    values[source].append(float((shifted - base)[target, channel]) / delta)
        for source in sources:
            out[str(source)][str(sigma)] = float(np.mean(values[source]))
    return out


def prefix_speed_gain(model: Any, scenes: Sequence[task.Scene], *, guidance: str = "mask", frozen: int = 2,
                      target: int = 2, factors: tuple[float, float] = (0.7, 1.3), count: int = 8,
                      steps: int = task.NUM_INFERENCE_STEPS, seed: int = 1) -> list[float]:
    """Per scene, how much of a frozen prefix's speed the policy carries into action ``target``.

    The prefix is the first ``frozen`` actions of the scene's expert chunk retimed by each of ``factors``
    (:func:`~.augment.retime_chunk`), given as an execution context whose overlap ends with it (no ramp, so only the
    model carries the speed on). Gain = change of the candidates' mean distance from the robot at ``target`` over
    the change of the retimed expert's: 1 when the policy continues the prefix, 0 when it ignores it.

    Args:
        model (`Cosmos3ActionModel`): The served toy policy.
        scenes (`Sequence[task.Scene]`): Scenes (their first expert side is used).
        guidance (`str`): Context guidance mode (``"mask"`` for a policy trained with clean prefixes).
        frozen (`int`): Prefix length ``d``.
        target (`int`): Action read (``frozen`` is the first free one).
        factors (`tuple[float, float]`): The two speeds, different.
        count (`int`): Candidates per group.
        steps (`int`): Denoising steps.
        seed (`int`): Base seed of every group (the same for both speeds).

    Returns:
        `list[float]`: One gain per scene.
    """
    slow, fast = factors
    if slow == fast:
        raise ValueError(f"factors must differ, got {factors!r}")
    dt = 1.0 / task.FPS
    gains = []
    for scene in scenes:
        expert = torch.tensor(task.expert_path(scene, task.expert_sides(scene)[0]), dtype=torch.float32)
        robot = torch.tensor(scene.robot, dtype=torch.float32)
        moved, wanted = {}, {}
        kwargs = request_kwargs(task.render(scene))
        kwargs["num_inference_steps"] = steps
        for factor in factors:
            chunk = retime_chunk(expert, robot, factor)
            # A previous chunk whose last `frozen` actions are the prefix: overlap == frozen, so weights end there.
            previous = torch.zeros(task.HORIZON, chunk.shape[1])
            previous[task.HORIZON - frozen :] = chunk[:frozen]
            context = ExecutionContext(previous, 0.0, dt, frozen, (task.HORIZON - frozen) * dt, guidance=guidance)
            result = model.generate(**kwargs, spec=CandidateTrajectorySpec(count=count, reducer="mean",
                                                                           return_candidates=True),
                                    base_seed=seed, context=context)
            moved[factor] = float(torch.linalg.vector_norm(result.candidates[:, target].float() - robot, dim=-1)
                                  .mean())
            wanted[factor] = float(torch.linalg.vector_norm(chunk[target] - robot))
        gains.append((moved[fast] - moved[slow]) / (wanted[fast] - wanted[slow]))
    return gains


def first_switch_spread(model: Any, scenes: Sequence[task.Scene], *, delay: int = 2, count: int = 8,
                        steps: int = task.NUM_INFERENCE_STEPS, base_seed: int = 0) -> dict[str, Any]:
    """At each scene's first chunk switch, the candidates' first free action against the old plan at that time.

    As the closed-loop bench's ``guided_mode`` (:mod:`.closed_loop`, same seeds): the first chunk is the ``mode`` of
    ``count`` candidates; after ``s`` actions the next group is drawn from the image at the robot's position with the
    first chunk as its context (``delay`` frozen actions), once with ``"prefix"`` guidance and once with ``"none"``.

    Args:
        model (`Cosmos3ActionModel`): The served toy policy.
        scenes (`Sequence[task.Scene]`): Held-out scenes.
        delay (`int`): Frozen actions ``d``; action ``d`` is where the seam is measured.
        count (`int`): Candidates per group.
        steps (`int`): Denoising steps.
        base_seed (`int`): The bench's base seed.

    Returns:
        `dict`: per guidance mode, the means over scenes of ``bias`` (distance of the candidates' mean from the old
        plan), ``spread`` (RMS distance of the candidates from their mean), ``mean_distance`` and ``min_distance`` (of
        the candidates from the old plan), and ``per_scene`` rows.
    """
    rows: dict[str, list[dict[str, float]]] = {"prefix": [], "none": []}
    for scene in scenes:
        seed = scene_seed(base_seed, scene)

        def group(position: Any, spec: CandidateTrajectorySpec, group_seed: int,
                  context: ExecutionContext | None) -> Any:
            kwargs = request_kwargs(task.render(scene.with_robot(position)))
            kwargs["num_inference_steps"] = steps
            return model.generate(**kwargs, spec=spec, base_seed=group_seed, context=context)

        first = group(scene.robot, CandidateTrajectorySpec(count=count, reducer="mode"), seed, None).action.float()
        old = first[EXECUTE + delay]
        for guidance, out in rows.items():
            context = ExecutionContext(first, 0.0, DT, delay, EXECUTE * DT, guidance=guidance)
            spec = CandidateTrajectorySpec(count=count, reducer="mode_continuity", return_candidates=True)
            free = group(first[EXECUTE - 1].numpy(), spec, seed + 1, context).candidates[:, delay].float()
            distance = torch.linalg.vector_norm(free - old, dim=-1)
            mean = free.mean(dim=0)
            out.append({"scene": scene.seed, "bias": float(torch.linalg.vector_norm(mean - old)),
                        "spread": float(((free - mean) ** 2).sum(-1).mean().sqrt()),
                        "mean_distance": float(distance.mean()), "min_distance": float(distance.min())})
    keys = ("bias", "spread", "mean_distance", "min_distance")
    return {guidance: {**{k: float(np.mean([r[k] for r in out])) for k in keys}, "per_scene": out}
            for guidance, out in rows.items()}


def main(argv: Sequence[str] | None = None) -> int:
    from trajectory_ensemble_node.toy import load_toy_pipeline

    parser = argparse.ArgumentParser(prog="python -m trajectory_ensemble_lab.toy.sensitivity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", type=Path, action="append", default=None,
                        help="toy pipeline directory, repeatable (default: the shipped toy policy)")
    parser.add_argument("--seeds", type=int, default=8, help="training scene seeds whose examples are probed")
    parser.add_argument("--target", type=int, default=2, help="action whose clean prediction is read (d = 2's first "
                                                              "free action)")
    parser.add_argument("--prefix-scenes", type=int, default=0,
                        help="also run prefix_speed_gain on this many held-out scenes ('mask' guidance); 0 = skip")
    parser.add_argument("--switch-scenes", type=int, default=0,
                        help="also run first_switch_spread on this many held-out scenes; 0 = skip")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sources = sorted({0, args.target - 1, args.target} - {-1})
    result: dict[str, Any] = {
        "settings": {"date": utc_now(),
                     "commit": git_commit(), "seeds": args.seeds, "target": args.target, "sources": sources,
                     "sigmas": list(DEFAULT_SIGMAS), "delta": 0.05,
                     "definition": f"mean d x0_hat[{args.target}] / d x[source] over examples and both channels; "
                                   "reading the latent fully: 1 / (1 - sigma) on the diagonal",
                     "prefix_scenes": args.prefix_scenes, "switch_scenes": args.switch_scenes,
                     "switch_definition": "first_switch_spread: at each scene's first chunk switch (d = 2, s = 4, "
                                          "N = 8, bench seeds), the candidates' action 2 against the old plan: "
                                          "distance of their mean (bias), RMS around it (spread), mean and smallest "
                                          "distance; guided ('prefix') and not ('none')",
                     "prefix_definition": "prefix_speed_gain: change of the candidates' mean distance from the robot "
                                          f"at action {args.target} over the change of the expert's, with its first "
                                          "2 actions walked at 0.7x and 1.3x given as the frozen prefix ('mask')"},
        "pipelines": {},
    }
    for path in args.pipeline or [None]:
        pipe = load_toy_pipeline(path=path)
        dataset = build_dataset(pipe, args.seeds, log=lambda message: None)
        name = str(path or "shipped toy_policy")
        result["pipelines"][name] = latent_sensitivity(pipe, dataset, target=args.target, sources=sources)
        if args.prefix_scenes > 0:
            from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel

            gains = prefix_speed_gain(Cosmos3ActionModel(pipe, max_batch_candidates=64),
                                      task.heldout_scenes(args.prefix_scenes), target=args.target)
            result.setdefault("prefix_speed_gain", {})[name] = {"mean": float(np.mean(gains)), "per_scene": gains}
        if args.switch_scenes > 0:
            from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel

            result.setdefault("first_switch_spread", {})[name] = first_switch_spread(
                Cosmos3ActionModel(pipe, max_batch_candidates=64), task.heldout_scenes(args.switch_scenes))
    write_json(args.json, result)
    for name, table in result["pipelines"].items():
        print(name)
        for source, row in table.items():
            print(f"  d x0_hat[{args.target}] / d x[{source}]: "
                  + ", ".join(f"sigma {s}: {v:.3f}" for s, v in row.items()))
        if name in result.get("prefix_speed_gain", {}):
            print(f"  prefix speed gain at action {args.target}: {result['prefix_speed_gain'][name]['mean']:.2f}")
        for guidance, row in result.get("first_switch_spread", {}).get(name, {}).items():
            print(f"  first switch, guidance {guidance}: " + ", ".join(f"{k} {row[k]:.4f}" for k in (
                "bias", "spread", "mean_distance", "min_distance")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
