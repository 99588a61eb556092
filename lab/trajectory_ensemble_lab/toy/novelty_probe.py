"""Which observation embedding a novelty scorer should read (issue 33): measured on the shipped toy policy.

``python -m trajectory_ensemble_lab.toy.novelty_probe [--json PATH]`` compares, for the serving pass of one group
(N = 8 candidates, first denoising step), embeddings of the conditioning frame that the pass already computes:

- ``latent_gG``: the conditioning frame's VAE latent ``[C, h, w]``, average-pooled to ``G x G`` (what
  ``models/cosmos3/embedding.py`` serves);
- ``hidden_L_tokens`` / ``hidden_L_mean``: the transformer's hidden states over the conditioning frame's tokens at
  the first step (``L = in``: the decoder stack's input; ``L = 0, 1, ...``: after that layer), averaged over the
  candidates, flattened per token or averaged over the tokens.

Each is scored by k-NN (k = 1) and, where it is small enough, RND (:mod:`trajectory_ensemble_node.novelty`), fitted on
half of the calibration scenes and thresholded (split conformal, alpha) on the other half, over several random splits:
false alarms on held-out in-distribution scenes, detection and AUROC on each shifted family. Results go to
``bench/results/novelty_embeddings-toy.json`` and ``.md`` with date and commit.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.engine.adapter import Slice
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, observation_embedding
from trajectory_ensemble_node.novelty import EmbeddingSpec, fit_scorer
from trajectory_ensemble_node.provenance import git_commit, utc_now
from trajectory_ensemble_node.seeding import make_generators
from trajectory_ensemble_node.stats import auroc, conformal_threshold
from trajectory_ensemble_node.toy import load_toy_pipeline, request_kwargs, task
from trajectory_ensemble_lab.toy.shifted import FAMILIES, render_shifted, shifted_scenes
from ..records import write_json

DEFAULT_JSON = Path("bench/results/novelty_embeddings-toy.json")
SEED_OFFSET = 777_000
"""Scene seeds of this probe: calibration ``HELDOUT_SEED_BASE + 100_000 + SEED_OFFSET + i``, shifted
``SHIFTED_SEED_BASE + 777 + i``; away from calibrate's defaults."""
RND_MAX_DIM = 256


class _Taps:
    """Forward hooks on the decoder layers: the generation stream entering the stack and after each layer."""

    def __init__(self, transformer: Any) -> None:
        self.captured: dict[str, torch.Tensor] = {}
        self.handles = [transformer.layers[0].register_forward_pre_hook(self._pre)]
        for index, layer in enumerate(transformer.layers):
            self.handles.append(layer.register_forward_hook(self._post(str(index))))

    def _pre(self, module: Any, args: tuple) -> None:
        self.captured["in"] = args[1].detach().clone()

    def _post(self, name: str):
        def hook(module: Any, args: tuple, out: tuple) -> None:
            self.captured[name] = out[1].detach().clone()
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _embeddings(model: Cosmos3ActionModel, taps: _Taps, image: np.ndarray, seed: int, count: int) -> dict[str, np.ndarray]:
    request = model.make_request(**request_kwargs(image), spec=CandidateTrajectorySpec(count=count, reducer="mode"),
                                 base_seed=seed)
    state = model.adapter.prepare(request.payload, make_generators(request.seeds, device="cpu"))
    with torch.no_grad():
        model.adapter.forward([Slice(state, 0, state.count)])
    model.adapter.release(state)
    conditioning = state.conditioning
    out = {f"latent_g{g}": observation_embedding(conditioning, g).numpy() for g in (1, 2, 3, 4)}
    template = conditioning.branches[0].template
    _, h, w = template.vision_token_shape
    for name, stream in taps.captured.items():
        tokens = stream.reshape(state.count, template.length, -1)[:, : h * w].mean(dim=0)  # frame-0 tokens
        out[f"hidden_{name}_tokens"] = tokens.flatten().numpy()
        out[f"hidden_{name}_mean"] = tokens.mean(dim=0).numpy()
    return out


def _evaluate(sets: dict[str, np.ndarray], kind: str, alpha: float, splits: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    calibration = sets["calibration"]
    n = len(calibration)
    spec = EmbeddingSpec("probe", 1, calibration.shape[1])
    rows: dict[str, list[float]] = {}
    for split in range(splits):
        order = rng.permutation(n)
        fit, rest = order[: n // 2], order[n // 2:]
        scorer = fit_scorer(kind, torch.tensor(calibration[fit]), spec, seed=split,
                            **({"steps": 1000} if kind == "rnd" else {}))
        threshold = conformal_threshold([float(v) for v in scorer.scores(torch.tensor(calibration[rest]))], alpha)
        held = [float(v) for v in scorer.scores(torch.tensor(sets["heldout"]))]
        rows.setdefault("false_alarm_rate", []).append(float(np.mean([v > threshold for v in held])))
        for family in FAMILIES:
            shifted = [float(v) for v in scorer.scores(torch.tensor(sets[family]))]
            rows.setdefault(f"detection_{family}", []).append(float(np.mean([v > threshold for v in shifted])))
            rows.setdefault(f"auroc_{family}", []).append(auroc(held, shifted))
    return {key: float(np.mean(values)) for key, values in rows.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calibration", type=int, default=150)
    parser.add_argument("--heldout", type=int, default=100)
    parser.add_argument("--shifted", type=int, default=60, help="scenes per shifted family")
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    commit, started = git_commit(), time.perf_counter()
    torch.set_num_threads(1)
    model = Cosmos3ActionModel(load_toy_pipeline())
    taps = _Taps(model.adapter.transformer)
    seed0 = task.HELDOUT_SEED_BASE + 100_000 + SEED_OFFSET
    images = {
        "calibration": [task.render(task.make_scene(seed0 + i)) for i in range(args.calibration)],
        "heldout": [task.render(task.make_scene(seed0 + args.calibration + i)) for i in range(args.heldout)],
        **{family: [render_shifted(s) for s in shifted_scenes(args.shifted, seed=777, family=family)]
           for family in FAMILIES},
    }
    raw = {name: [_embeddings(model, taps, image, 10_000 * k + i, args.count) for i, image in enumerate(group)]
           for k, (name, group) in enumerate(images.items())}
    taps.remove()
    results: dict[str, Any] = {}
    for key in raw["calibration"][0]:
        sets = {name: np.stack([row[key] for row in rows]).astype(np.float64) for name, rows in raw.items()}
        dim = sets["calibration"].shape[1]
        entry: dict[str, Any] = {"dim": dim, "knn": _evaluate(sets, "knn", args.alpha, args.splits, 0)}
        if dim <= RND_MAX_DIM:
            entry["rnd"] = _evaluate(sets, "rnd", args.alpha, max(1, args.splits // 2), 0)
        results[key] = entry
        print(f"{key}: {entry}", flush=True)
    document = {"settings": {"date": utc_now(), "commit": commit, **vars(args), "json": str(args.json),
                             "seconds": round(time.perf_counter() - started, 1)}, "embeddings": results}
    write_json(args.json, document)
    args.json.with_suffix(".md").write_text(markdown(document))
    print(f"wrote {args.json} and {args.json.with_suffix('.md')}")
    return 0


def markdown(document: dict[str, Any]) -> str:
    s = document["settings"]
    lines = [f"# Which embedding for observation novelty ({s['date']}, commit {s['commit']})", "",
             f"Shipped toy policy, N = {s['count']}, first denoising step; {s['calibration']} calibration scenes "
             f"(half fit the scorer, half set its threshold at alpha = {s['alpha']}; mean over {s['splits']} random "
             f"splits, RND over fewer), {s['heldout']} held-out and {s['shifted']} scenes per shifted family.", "",
             "| embedding | dim | scorer | false alarms | detection two_obstacles | AUROC two_obstacles | "
             "AUROC recolored | AUROC large |", "|---|---|---|---|---|---|---|---|"]
    for key, entry in document["embeddings"].items():
        for kind in ("knn", "rnd"):
            if kind in entry:
                f = entry[kind]
                lines.append(f"| `{key}` | {entry['dim']} | {kind} | {100 * f['false_alarm_rate']:.0f}% | "
                             f"{100 * f['detection_two_obstacles']:.0f}% | {f['auroc_two_obstacles']:.3f} | "
                             f"{f['auroc_recolored']:.3f} | {f['auroc_large']:.3f} |")
    lines += ["", f"Run: `python -m trajectory_ensemble_lab.toy.novelty_probe --json {s['json']}` "
              f"({s['seconds']:.0f} s, 1 thread).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
