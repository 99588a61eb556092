"""Where a ``train-pusht`` step's time goes, before and after: ``python -m trajectory_ensemble_lab.training.step_profile``.

One process builds the PushT policy (:data:`~trajectory_ensemble_lab.pusht.train.PUSHT_CONFIG`, fresh), encodes the
bags (default: the committed test bag; the cost of a step does not depend on the data set's size) and trains two
copies of it side by side, alternating steps on one thread:

- **plain**: the trainer as it was: every parameter trained, one packed item per example, the instruction's text
  prefix run through every layer at every step (forward and backward);
- **fast**: ``train-pusht``'s default: the text pathway frozen, the prefix's keys/values cached once
  (:mod:`.text_prefix`), the batch packed as one run of blocks.

It reports each step's median wall time, the median of the per-round ratios (the machine is shared and noisy, so
the ratio is measured in one run, round by round, the order alternating), and ``torch.profiler``'s self CPU time of
a few steps of each, by phase and kind of op. An op whose input has the prefix's length is the text pathway's.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from trajectory_ensemble_node.models.cosmos3 import install_fanout
from trajectory_ensemble_node.provenance import git_commit, utc_now
from ..pusht import train as pusht_train
from ..pusht.recording import TEST_BAG
from .fit import apply_update, sample_sigmas, training_loss
from .pipeline import fresh_pipeline
from .text_prefix import freeze_text_pathway, instruction_cache

PHASES = ("transformer", "backward", "optimizer", "ema")
"""Named ranges a step's ops fall in (``fit.apply_update``'s, and the transformer's forward here); the rest of
``training_loss`` (drawing noise, building the items, the loss) is the batch."""
KINDS = ("text pathway", "linear", "attention", "other ops")
ROWS = (
    ("batch", "batch: examples, noise, items, loss"),
    ("transformer/text pathway", "forward: text pathway (prefix)"),
    ("transformer/linear", "forward: projections and MLPs (generation)"),
    ("transformer/attention", "forward: attention (generation)"),
    ("transformer/other ops", "forward: norms, rotary, SiLU, packing"),
    ("transformer/python", "forward: Python between ops"),
    ("backward/text pathway", "backward: text pathway (prefix)"),
    ("backward/linear", "backward: projections and MLPs (generation)"),
    ("backward/attention", "backward: attention (generation)"),
    ("backward/other ops", "backward: other ops"),
    ("optimizer", "optimizer: clip, AdamW, schedule"),
    ("ema", "EMA"),
)


def _name_forward(module: torch.nn.Module, name: str) -> None:
    """Run ``module``'s forward inside a profiler range called ``name``, so its ops are told from the batch's."""
    open_ranges: list[record_function] = []

    def enter(module, args) -> None:
        open_ranges.append(record_function(name))
        open_ranges[-1].__enter__()

    def leave(module, args, output) -> None:
        open_ranges.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(enter)
    module.register_forward_hook(leave)


class Trainer:
    """One copy of the pipeline and its optimizer, stepping as ``fit`` does."""

    def __init__(self, pipe, dataset, fast: bool, batch: int, seed: int) -> None:
        self.pipe, self.dataset, self.batch = pipe, dataset, batch
        transformer = pipe.transformer
        transformer.train()
        install_fanout(transformer)
        self.cache = instruction_cache(transformer, dataset.branch) if fast and freeze_text_pathway(transformer) \
            else None
        self.one_run = fast
        self.params = [p for p in transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=3e-4, weight_decay=0.01)
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=3e-4, total_steps=10_000)
        self.ema = [p.detach().clone() for p in self.params]
        self.generator = torch.Generator().manual_seed(seed)
        self.rng = np.random.default_rng(seed)
        _name_forward(transformer, "transformer")

    def step(self) -> None:
        examples = [int(i) for i in self.rng.integers(0, self.dataset.num_states, size=self.batch)]
        sigmas = sample_sigmas(self.batch, self.generator, 5.0)
        loss, _, _ = training_loss(self.pipe, self.dataset, examples, sigmas, self.generator, 0.1,
                                   prefix_cache=self.cache, one_run=self.one_run)
        apply_update(loss, self.params, self.optimizer, self.schedule, self.ema, 0.999)


def _phase(event) -> str:
    parent = event
    while parent is not None:
        if parent.name in PHASES:
            return parent.name
        parent = parent.cpu_parent
    return "batch"


def _kind(event, prefix_len: int) -> str:
    if any(prefix_len in shape for shape in (event.input_shapes or []) if isinstance(shape, (list, tuple))):
        return "text pathway"
    if "scaled_dot_product" in event.name:
        return "attention"
    if event.name in ("aten::mm", "aten::addmm", "aten::bmm"):
        return "linear"
    return "other ops"


def profile_steps(step: Callable[[], None], steps: int, prefix_len: int) -> dict[str, float]:
    """Self CPU milliseconds per step of ``steps`` calls of ``step``, by ``phase/kind`` (see :data:`ROWS`)."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            step()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        phase = _phase(event)
        if event.name in PHASES:
            # A range's own self time is Python between its ops.
            key = f"{phase}/python" if phase == "transformer" else phase
        elif phase in ("transformer", "backward"):
            key = f"{phase}/{_kind(event, prefix_len)}"
        else:
            key = phase
        totals[key] += event.self_cpu_time_total / 1000.0 / steps
    return dict(totals)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bags", type=Path, default=TEST_BAG, help="demonstration bag(s) to draw examples from")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds, one step of each trainer per round")
    parser.add_argument("--profiled-steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("out/step_profile/profile.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started, commit = utc_now(), git_commit()
    bag_paths = pusht_train.demo_bags(args.bags)
    pipe = fresh_pipeline(pusht_train.PUSHT_CONFIG, 0, pusht_train.normalization_images(bag_paths),
                          pusht_train.PUSHT_FORMAT, log=lambda message: None)
    dataset = pusht_train.build_pusht_dataset(pipe, bag_paths, log=lambda message: None)
    template = dataset.branch.template
    prefix_len = dataset.branch.prefix.length
    trainers = {"plain": Trainer(copy.deepcopy(pipe), dataset, False, args.batch, 0),
                "fast": Trainer(copy.deepcopy(pipe), dataset, True, args.batch, 0)}
    for trainer in trainers.values():
        trainer.step()
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    for round_index in range(args.rounds):
        order = list(trainers) if round_index % 2 == 0 else list(reversed(trainers))
        for name in order:
            begin = time.perf_counter()
            trainers[name].step()
            seconds[name].append(time.perf_counter() - begin)
    ratios = [plain / fast for plain, fast in zip(seconds["plain"], seconds["fast"])]
    profiles = {name: profile_steps(trainer.step, args.profiled_steps, prefix_len)
                for name, trainer in trainers.items()}
    result = {
        "date": started, "commit": commit, "threads": torch.get_num_threads(), "batch": args.batch,
        "tokens": {"prefix": prefix_len, "vision_per_example": template.num_vision_tokens,
                   "action_per_example": template.action_len},
        "trained_parameters": {name: sum(p.numel() for p in t.params) for name, t in trainers.items()},
        "step_seconds_median": {name: statistics.median(values) for name, values in seconds.items()},
        "step_seconds": seconds, "ratio_median": statistics.median(ratios), "ratios": ratios,
        "profile_ms_per_step": profiles,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['date']} commit {commit}, batch {args.batch}, one thread; tokens: prefix {prefix_len}, "
          f"{template.num_vision_tokens} vision + {template.action_len} action per example")
    print(f"step (median of {args.rounds}): plain {result['step_seconds_median']['plain']:.3f} s, fast "
          f"{result['step_seconds_median']['fast']:.3f} s; per-round ratio plain/fast: median "
          f"{result['ratio_median']:.2f} (range {min(ratios):.2f}..{max(ratios):.2f})")
    print("\n| self CPU ms per step (torch.profiler) | plain | fast |\n|---|---:|---:|")
    for key, label in ROWS:
        print(f"| {label} | {profiles['plain'].get(key, 0.0):.0f} | {profiles['fast'].get(key, 0.0):.0f} |")
    print(f"| total | {sum(profiles['plain'].values()):.0f} | {sum(profiles['fast'].values()):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
