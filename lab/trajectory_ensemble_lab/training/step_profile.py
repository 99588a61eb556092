"""Where a ``train-pusht`` step's time goes, before and after the cached prefix (``python -m`` this module).

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
With ``--fit-steps N`` it instead trains both copies N steps on the same examples and noise and compares their loss
on every state (what freezing the text pathway costs the fit).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
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
from .pipeline import fresh_pipeline, install_caption_tokenizer
from .text_prefix import freeze_text_pathway, instruction_cache
from ..records import write_json

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
    ("backward", "backward: autograd engine between ops"),
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

    def __init__(self, pipe, dataset, fast: bool, batch: int, seed: int, steps: int = 10_000) -> None:
        self.pipe, self.dataset, self.batch = pipe, dataset, batch
        transformer = pipe.transformer
        transformer.train()
        install_fanout(transformer)
        self.cache = instruction_cache(transformer, dataset.branch) if fast and freeze_text_pathway(transformer) \
            else None
        self.one_run = fast
        self.params = [p for p in transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=3e-4, weight_decay=0.01)
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(self.optimizer, max_lr=3e-4, total_steps=steps)
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


    @torch.no_grad()
    def evaluate(self, batch: int) -> tuple[float, float]:
        """Action and vision MSE over every state once, at fixed sigmas and noise (the same for any trainer)."""
        generator = torch.Generator().manual_seed(123)
        total = np.zeros(2)
        for start in range(0, self.dataset.num_states, batch):
            examples = [self.dataset.options[s][0] for s in range(start, min(start + batch, self.dataset.num_states))]
            sigmas = sample_sigmas(len(examples), generator, 5.0)
            _, action, vision = training_loss(self.pipe, self.dataset, examples, sigmas, generator, 0.1,
                                              prefix_cache=self.cache)
            total += np.array([action, vision]) * len(examples)
        return tuple(float(v) for v in total / self.dataset.num_states)


def fit_comparison(sides: dict[str, tuple], batch: int, steps: int, every: int) -> list[dict[str, object]]:
    """What a change costs the fit: both trainers (``sides``: name -> ``(pipe, dataset, fast)``) from the same
    weights, on the same examples and noise, ``steps`` steps of a one-cycle schedule; their
    :meth:`Trainer.evaluate` every ``every`` steps."""
    trainers = {name: Trainer(copy.deepcopy(pipe), dataset, fast, batch, 0, steps)
                for name, (pipe, dataset, fast) in sides.items()}
    rows = []
    for step in range(1, steps + 1):
        for trainer in trainers.values():
            trainer.step()
        if step % every == 0 or step == steps:
            rows.append({"step": step, **{name: t.evaluate(batch) for name, t in trainers.items()}})
            print(json.dumps(rows[-1]), flush=True)
    return rows


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
    parser.add_argument("--fit-steps", type=int, default=0,
                        help="also train both from the same weights for this many steps and compare their fit")
    parser.add_argument("--fit-every", type=int, default=50, help="steps between fit comparisons")
    parser.add_argument("--prompt-merges", type=int, default=0, metavar="N",
                        help="compare the fast step with the fast step of the same weights whose tokenizer learned N "
                             "merges on the caption (train-pusht --prompt-merges), instead of plain with fast")
    parser.add_argument("--out", type=Path, default=Path("out/step_profile/profile.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    started, commit, load_before = utc_now(), git_commit(), os.getloadavg()[0]
    bag_paths = pusht_train.demo_bags(args.bags)
    pipe = fresh_pipeline(pusht_train.PUSHT_CONFIG, 0, pusht_train.normalization_images(bag_paths),
                          pusht_train.PUSHT_FORMAT, log=lambda message: None)
    dataset = pusht_train.build_pusht_dataset(pipe, bag_paths, log=lambda message: None)
    template = dataset.branch.template
    sides = {"plain": (pipe, dataset, False), "fast": (pipe, dataset, True)}
    if args.prompt_merges:
        merged = copy.deepcopy(pipe)
        install_caption_tokenizer(merged, pusht_train.PUSHT_FORMAT, pusht_train.normalization_images(bag_paths, 1)[0],
                                  args.prompt_merges, 2)
        short = pusht_train.build_pusht_dataset(merged, bag_paths, log=lambda message: None)
        sides = {"fast": (pipe, dataset, True), "short prefix": (merged, short, True)}
    first, second = sides
    if args.fit_steps:
        rows = fit_comparison(sides, args.batch, args.fit_steps, args.fit_every)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"date": started, "commit": commit, "batch": args.batch, "fit": rows},
                                       indent=1) + "\n")
        return 0
    trainers = {name: Trainer(copy.deepcopy(p), d, fast, args.batch, 0) for name, (p, d, fast) in sides.items()}
    for trainer in trainers.values():
        trainer.step()
    # Wall time, and this thread's CPU time: on a shared machine the process waits for a core, and the CPU time is
    # what the step itself costs.
    seconds: dict[str, list[float]] = {name: [] for name in trainers}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in trainers}
    for round_index in range(args.rounds):
        order = list(trainers) if round_index % 2 == 0 else list(reversed(trainers))
        for name in order:
            begin, begin_cpu = time.perf_counter(), time.thread_time()
            trainers[name].step()
            seconds[name].append(time.perf_counter() - begin)
            cpu_seconds[name].append(time.thread_time() - begin_cpu)
    ratios = [a / b for a, b in zip(seconds[first], seconds[second])]
    cpu_ratios = [a / b for a, b in zip(cpu_seconds[first], cpu_seconds[second])]
    # Profiled one step at a time, alternating too, so a change in the machine's load falls on both.
    profiles: dict[str, dict[str, float]] = {name: defaultdict(float) for name in trainers}
    for round_index in range(args.profiled_steps):
        for name in list(trainers) if round_index % 2 == 0 else list(reversed(trainers)):
            for key, value in profile_steps(trainers[name].step, 1, sides[name][1].branch.prefix.length).items():
                profiles[name][key] += value / args.profiled_steps
    result = {
        "date": started, "commit": commit, "threads": torch.get_num_threads(), "batch": args.batch,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)], "cpus": os.cpu_count(),
        "tokens": {"prefix": {name: d.branch.prefix.length for name, (_, d, _) in sides.items()},
                   "vision_per_example": template.num_vision_tokens,
                   "action_per_example": template.action_len},
        "trained_parameters": {name: sum(p.numel() for p in t.params) for name, t in trainers.items()},
        "step_seconds_median": {name: statistics.median(values) for name, values in seconds.items()},
        "step_seconds": seconds, "ratio_median": statistics.median(ratios), "ratios": ratios,
        "step_cpu_seconds_median": {name: statistics.median(values) for name, values in cpu_seconds.items()},
        "step_cpu_seconds": cpu_seconds, "cpu_ratio_median": statistics.median(cpu_ratios), "cpu_ratios": cpu_ratios,
        "profile_ms_per_step": {name: dict(values) for name, values in profiles.items()},
    }
    write_json(args.out, result)
    print(f"{result['date']} commit {commit}, batch {args.batch}, one thread, load average "
          f"{result['load_average'][0]} -> {result['load_average'][1]} on {os.cpu_count()} CPUs; tokens: prefix "
          f"{result['tokens']['prefix']}, {template.num_vision_tokens} vision + {template.action_len} action per "
          f"example; trained parameters: {result['trained_parameters']}")
    print(f"step (median of {args.rounds}): {first} {result['step_seconds_median'][first]:.3f} s, {second} "
          f"{result['step_seconds_median'][second]:.3f} s; per-round ratio {first}/{second}: median "
          f"{result['ratio_median']:.2f} (range {min(ratios):.2f}..{max(ratios):.2f})")
    print(f"thread CPU time per step (median): {first} {result['step_cpu_seconds_median'][first]:.3f} s, {second} "
          f"{result['step_cpu_seconds_median'][second]:.3f} s; per-round ratio: median "
          f"{result['cpu_ratio_median']:.2f} (range {min(cpu_ratios):.2f}..{max(cpu_ratios):.2f})")
    print(f"\n| ms per step (torch.profiler, self time of ops) | {first} | {second} |\n|---|---:|---:|")
    for key, label in ROWS:
        print(f"| {label} | {profiles[first].get(key, 0.0):.0f} | {profiles[second].get(key, 0.0):.0f} |")
    print(f"| total | {sum(profiles[first].values()):.0f} | {sum(profiles[second].values()):.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
