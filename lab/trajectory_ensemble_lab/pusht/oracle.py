"""The PushT state oracle (lab only, never shipped): a flow-matching MLP on the full state, the image policy's ceiling.

It reads what the image policy has to see (agent ``x, y``; the T's ``x, y`` and its angle as ``sin, cos``), and is
trained and executed like the shipped policy: chunks of :data:`CHUNK` actions (``PUSHT_SETTINGS``), the first
:data:`~.evaluate.EXECUTE` executed, actions normalized by the same ``minmax`` over ``[0, 512]`` to ``[-1, 1]``
(:func:`normalize_actions`), so the product's reducers see candidates in the units they see when serving.

The objective is the lab's flow matching (:mod:`trajectory_ensemble_lab.training.fit`'s conventions):
``x_sigma = (1 - sigma) x0 + sigma eps``, the network predicts ``v = eps - x0``, sigmas from
:func:`~trajectory_ensemble_lab.training.fit.sample_sigmas`; sampling integrates ``dx/dsigma = v`` from
``sigma = 1`` to 0 with :data:`DEFAULT_STEPS` Euler steps. Training keeps an EMA of the weights and writes a
resumable checkpoint (weights, EMA, optimizer and schedule, step) under its work folder.

Data (:func:`build_examples`): the state-only episodes of ``pusht-demos --states-only`` (:mod:`.state_demos`),
clean successes and DART episodes (noisy targets sent, the expert's clean targets as labels). Example ``t`` of an
episode is the state after ``t`` steps (with ``obs_steps - 1`` earlier states, the first repeated) and the labels
``t .. t + 15``, the tail padded by repeating the last, as Diffusion Policy does.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from trajectory_ensemble_node.bundled import PUSHT_SETTINGS

from ..training import TrainingError
from ..training.fit import sample_sigmas
from . import VALIDATION_SEED_BASE
from .demos import Episode
from ..records import write_json

CHUNK = int(PUSHT_SETTINGS["chunk_size"])
"""Actions per chunk, the shipped policy's 16."""
ACTION_SCALE = 512.0
"""The env's action range ``[0, 512]`` per axis, normalized by ``minmax`` to ``[-1, 1]`` as the served policy is."""
DEFAULT_STEPS = 10
"""Euler steps from noise to a chunk."""
STATE_WIDTH = 6
"""Features per observed state: agent ``x, y`` and T ``x, y`` in ``[-1, 1]``, the T's ``sin, cos``."""
WEIGHTS = "oracle.safetensors"
CONFIG = "oracle.json"
RESUME = "resume.pt"


def normalize_actions(actions: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """Env pixels ``[0, 512]`` -> ``[-1, 1]`` (the ``minmax`` of ``action_stats.json``)."""
    return actions / (ACTION_SCALE / 2) - 1.0


def denormalize_actions(actions: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
    """``[-1, 1]`` -> env pixels."""
    return (actions + 1.0) * (ACTION_SCALE / 2)


def state_features(states: np.ndarray) -> np.ndarray:
    """Per state ``(agent x, agent y, T x, T y, T angle)`` ``[..., 5]`` -> features ``[..., 6]`` (float32)."""
    states = np.asarray(states, dtype=np.float64)
    xy = states[..., :4] / (ACTION_SCALE / 2) - 1.0
    angle = states[..., 4:5]
    return np.concatenate([xy, np.sin(angle), np.cos(angle)], axis=-1).astype(np.float32)


def history_features(states: np.ndarray, t: int, obs_steps: int) -> np.ndarray:
    """The observation at step ``t`` of an episode's states ``[K + 1, 5]``: the ``obs_steps`` states ending at
    ``t`` (the first repeated before the episode starts), flattened to ``[obs_steps * 6]``."""
    rows = [states[max(0, t - k)] for k in range(obs_steps - 1, -1, -1)]
    return state_features(np.stack(rows)).reshape(-1)


@dataclass(frozen=True)
class OracleConfig:
    """The oracle's shape.

    Args:
        obs_steps (`int`): States observed (1: the current one; 2: also the one before, as Diffusion Policy).
        width (`int`): Hidden width of the residual MLP.
        blocks (`int`): Residual blocks.
        chunk (`int`): Actions per chunk.
        time_features (`int`): Sinusoidal features of ``sigma``.
    """

    obs_steps: int = 1
    width: int = 512
    blocks: int = 4
    chunk: int = CHUNK
    time_features: int = 64

    @property
    def obs_width(self) -> int:
        """Features of one observation."""
        return self.obs_steps * STATE_WIDTH


class OracleNet(nn.Module):
    """Velocity network ``(observation, noisy chunk, sigma) -> v``: a pre-norm residual MLP.

    Args:
        config (`OracleConfig`): Its shape.
    """

    def __init__(self, config: OracleConfig) -> None:
        super().__init__()
        self.config = config
        w = config.width
        self.inp = nn.Linear(config.obs_width + config.chunk * 2 + config.time_features, w)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(w), nn.Linear(w, w), nn.SiLU(), nn.Linear(w, w))
                                    for _ in range(config.blocks))
        self.out = nn.Sequential(nn.LayerNorm(w), nn.Linear(w, config.chunk * 2))
        freqs = torch.exp(torch.linspace(0.0, math.log(1000.0), config.time_features // 2))
        self.register_buffer("freqs", freqs, persistent=False)

    def forward(self, obs: torch.Tensor, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Velocity of ``x`` at ``sigma``.

        Args:
            obs (`torch.Tensor` of shape `[B, obs_width]`): Observations.
            x (`torch.Tensor` of shape `[B, chunk, 2]`): Noisy chunks (normalized units).
            sigma (`torch.Tensor` of shape `[B]`): Noise levels in ``[0, 1]``.

        Returns:
            `torch.Tensor` of shape `[B, chunk, 2]`.
        """
        angles = sigma[:, None] * self.freqs[None, :]
        h = self.inp(torch.cat([obs, x.flatten(1), torch.sin(angles), torch.cos(angles)], dim=1))
        for block in self.blocks:
            h = h + block(h)
        return self.out(h).view(-1, self.config.chunk, 2)


@torch.no_grad()
def sample(net: OracleNet, obs: torch.Tensor, count: int, generator: torch.Generator,
           steps: int = DEFAULT_STEPS) -> torch.Tensor:
    """``count`` candidate chunks for one observation, integrated from noise with ``steps`` Euler steps.

    Args:
        net (`OracleNet`): The velocity network.
        obs (`torch.Tensor` of shape `[obs_width]`): One observation.
        count (`int`): Candidates N.
        generator (`torch.Generator`): The noise (the same seed gives the same candidates).
        steps (`int`): Euler steps.

    Returns:
        `torch.Tensor` of shape `[count, chunk, 2]`, normalized units.
    """
    x = torch.randn(count, net.config.chunk, 2, generator=generator)
    obs = obs.expand(count, -1)
    sigmas = torch.linspace(1.0, 0.0, steps + 1)
    for s, s_next in zip(sigmas[:-1], sigmas[1:]):
        x = x + (s_next - s) * net(obs, x, s.expand(count))
    return x


@dataclass
class Examples:
    """Training examples.

    Args:
        obs (`torch.Tensor` of shape `[E, obs_width]`): Observations.
        chunks (`torch.Tensor` of shape `[E, chunk, 2]`): Label chunks, normalized units.
        episodes (`int`): Episodes they come from; ``dart_episodes`` of them with DART noise.
        dart_episodes (`int`): See ``episodes``.
        dart_examples (`int`): Examples from DART episodes.
        seeds (`list[list[int]]`): ``[env seed, expert seed]`` of each episode used.
    """

    obs: torch.Tensor
    chunks: torch.Tensor
    episodes: int
    dart_episodes: int
    dart_examples: int
    seeds: list[list[int]]


def training_episodes(episodes: Sequence[Episode]) -> list[Episode]:
    """What the oracle trains on: clean successes, every DART episode (its labels are the expert's clean
    targets whether or not the noise let it finish), and every DAgger takeover (the expert's clean targets from a
    state the policy visited, cut after a horizon).

    Raises:
        TrainingError: an episode's start is not a demonstration start (validation and held-out never train).
    """
    bad = [ep.env_seed for ep in episodes if ep.env_seed >= VALIDATION_SEED_BASE]
    if bad:
        raise TrainingError(f"the oracle trains on demonstration starts 0..{VALIDATION_SEED_BASE - 1} only, got "
                            f"start {bad[0]}")
    return [ep for ep in episodes if ep.success or ep.dart_sigma > 0 or ep.takeover_step is not None]


def build_examples(episodes: Sequence[Episode], config: OracleConfig) -> Examples:
    """One example per control step of every episode :func:`training_episodes` keeps.

    Args:
        episodes (`Sequence[Episode]`): State-only episodes (with ``states`` and ``labels``).
        config (`OracleConfig`): The chunk and the observation history.

    Raises:
        TrainingError: no episode to train on, or one without states or labels.
    """
    used = training_episodes(episodes)
    if not used:
        raise TrainingError(f"no episode to train on among {len(episodes)} (no success, no DART episode)")
    obs, chunks = [], []
    dart_examples = 0
    for ep in used:
        if ep.states is None or ep.labels is None or len(ep.labels) == 0:
            raise TrainingError(f"episode {ep.env_seed}/{ep.expert_seed} has no states or labels")
        labels = normalize_actions(ep.labels.astype(np.float32))
        padded = np.concatenate([labels, np.repeat(labels[-1:], config.chunk - 1, axis=0)])
        for t in range(len(labels)):
            obs.append(history_features(ep.states, t, config.obs_steps))
            chunks.append(padded[t:t + config.chunk])
        dart_examples += len(labels) if ep.dart_sigma > 0 else 0
    return Examples(torch.from_numpy(np.stack(obs)), torch.from_numpy(np.stack(chunks).astype(np.float32)),
                    len(used), sum(ep.dart_sigma > 0 for ep in used), dart_examples,
                    [[ep.env_seed, ep.expert_seed] for ep in used])


@dataclass(frozen=True)
class TrainSettings:
    """The optimizer and schedule.

    Args:
        steps (`int`): Optimizer steps.
        batch (`int`): Examples per step.
        lr (`float`): Peak learning rate (AdamW); linear warm-up over :attr:`warmup`, cosine to zero.
        weight_decay (`float`): AdamW's.
        ema (`float`): EMA decay of the saved weights.
        sigma_shift (`float`): :func:`sample_sigmas`'s shift (1: plain logit-normal).
        seed (`int`): Init, batches and noise.
        warmup (`int`): Warm-up steps.
        checkpoint_every (`int`): Steps between resumable checkpoints (0: only at the end).
    """

    steps: int = 40_000
    batch: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-4
    ema: float = 0.999
    sigma_shift: float = 1.0
    seed: int = 0
    warmup: int = 500
    checkpoint_every: int = 2_000


def _lr_factor(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup:
        return (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def flow_loss(net: OracleNet, obs: torch.Tensor, x0: torch.Tensor, sigma: torch.Tensor,
              generator: torch.Generator) -> torch.Tensor:
    """MSE of the predicted velocity against ``eps - x0`` at ``x_sigma = (1 - sigma) x0 + sigma eps``.

    Args:
        net (`OracleNet`): The network.
        obs (`torch.Tensor` of shape `[B, obs_width]`), x0 (`torch.Tensor` of shape `[B, chunk, 2]`): A batch.
        sigma (`torch.Tensor` of shape `[B]`): Noise levels.
        generator (`torch.Generator`): The noise.
    """
    eps = torch.randn(x0.shape, generator=generator)
    s = sigma[:, None, None]
    return nn.functional.mse_loss(net(obs, (1 - s) * x0 + s * eps, sigma), eps - x0)


def train(examples: Examples, config: OracleConfig, settings: TrainSettings, work_dir: Path,
          log: Callable[[str], None] = print, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train the oracle, resuming from ``work_dir/resume.pt`` when a run with the same shape left one.

    A resumed run may get more examples than it started with (the record's ``data_history`` lists them by step).

    The EMA weights are written as ``work_dir/oracle.safetensors`` with ``oracle.json`` (shape, settings, data
    size, step) at every checkpoint and at the end, so an evaluation can read a run still in progress.

    Args:
        examples (`Examples`): The data.
        config (`OracleConfig`): The network's shape.
        settings (`TrainSettings`): Optimizer and schedule.
        work_dir (`Path`): Checkpoints and weights.
        log (`Callable[[str], None]`): Progress lines.
        meta (`dict`, *optional*): Recorded in ``oracle.json`` as ``data`` (where the episodes came from).

    Returns:
        `dict`: What ``oracle.json`` holds.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(settings.seed)
    net = OracleNet(config)
    optimizer = torch.optim.AdamW(net.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    ema = [p.detach().clone() for p in net.parameters()]
    generator = torch.Generator().manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    start, seconds = 0, 0.0
    history: list[dict[str, int]] = []
    resume = work_dir / RESUME
    if resume.exists():
        state = torch.load(resume, weights_only=True)
        # The step count may change (a run cut short or extended on a loaded machine: the cosine follows the new
        # end from where it is); anything else would be another run.
        if state["config"] != asdict(config) or {**state["settings"], "steps": settings.steps} != asdict(settings):
            raise TrainingError(f"{resume} is a run with another shape or schedule ({state['config']}, "
                                f"{state['settings']}); use another --work-dir")
        if state["settings"]["steps"] != settings.steps:
            log(f"the run's end moves from step {state['settings']['steps']} to {settings.steps}")
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        for e, saved in zip(ema, state["ema"]):
            e.copy_(saved)
        generator.set_state(state["generator"])
        rng = np.random.default_rng(settings.seed + state["step"])
        start, seconds = int(state["step"]), float(state["seconds"])
        if (work_dir / CONFIG).exists():
            history = json.loads((work_dir / CONFIG).read_text(encoding="utf-8")).get("data_history", [])
        log(f"resumed from {resume} at step {start}")
    params = list(net.parameters())
    count = len(examples.chunks)
    # A run resumed on a grown data set (generation still running when it started) says so in its record.
    history.append({"from_step": start, "examples": count, "episodes": examples.episodes, "steps": settings.steps})
    log(f"oracle: {sum(p.numel() for p in params)} parameters, {count} examples from {examples.episodes} episodes "
        f"({examples.dart_episodes} DART), batch {settings.batch}, steps {start}..{settings.steps}")
    record: dict[str, Any] = {}

    def save(step: int) -> None:
        nonlocal record
        names = [n for n, _ in net.named_parameters()]
        save_file({n: e.contiguous() for n, e in zip(names, ema)}, str(work_dir / WEIGHTS))
        record = {"config": asdict(config), "settings": asdict(settings), "step": step,
                  "train_seconds": round(seconds, 1), "parameters": sum(p.numel() for p in params),
                  "examples": count, "episodes": examples.episodes, "dart_episodes": examples.dart_episodes,
                  "dart_examples": examples.dart_examples, "passes": round(step * settings.batch / count, 2),
                  "loss": loss_window[-1] if loss_window else None, "data": meta or {}, "data_history": history,
                  "seeds": examples.seeds}
        write_json(work_dir / CONFIG, record)
        torch.save({"config": asdict(config), "settings": asdict(settings), "model": net.state_dict(),
                    "optimizer": optimizer.state_dict(), "ema": ema, "generator": generator.get_state(),
                    "step": step, "seconds": seconds}, work_dir / (RESUME + ".tmp"))
        (work_dir / (RESUME + ".tmp")).replace(resume)

    loss_window: list[float] = []
    running: list[float] = []
    began = time.perf_counter()
    for step in range(start, settings.steps):
        for group in optimizer.param_groups:
            group["lr"] = settings.lr * _lr_factor(step, settings)
        index = torch.from_numpy(rng.integers(0, count, size=settings.batch))
        sigma = sample_sigmas(settings.batch, generator, settings.sigma_shift)
        loss = flow_loss(net, examples.obs[index], examples.chunks[index], sigma, generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        decay = min(settings.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema, [p.detach() for p in params], 1 - decay)
        running.append(loss.item())
        done = step + 1
        if done % 500 == 0 or done == settings.steps:
            seconds_now = seconds + time.perf_counter() - began
            loss_window.append(round(float(np.mean(running)), 5))
            running = []
            log(f"step {done}/{settings.steps} loss {loss_window[-1]:.4f} lr {optimizer.param_groups[0]['lr']:.2e} "
                f"{seconds_now:.0f} s")
        if (settings.checkpoint_every and done % settings.checkpoint_every == 0) or done == settings.steps:
            seconds += time.perf_counter() - began
            began = time.perf_counter()
            save(done)
    if not record:  # nothing left to train: the resumed run had finished
        record = json.loads((work_dir / CONFIG).read_text(encoding="utf-8"))
    return record


def load_oracle(work_dir: Path) -> tuple[OracleNet, dict[str, Any]]:
    """The EMA weights in ``work_dir/oracle.safetensors`` and their record ``oracle.json``.

    Raises:
        TrainingError: no oracle there.
    """
    weights, config = Path(work_dir) / WEIGHTS, Path(work_dir) / CONFIG
    if not weights.exists() or not config.exists():
        raise TrainingError(f"no oracle in {str(work_dir)!r} (expected {WEIGHTS} and {CONFIG})")
    record = json.loads(config.read_text(encoding="utf-8"))
    net = OracleNet(OracleConfig(**record["config"]))
    net.load_state_dict(load_file(str(weights)))
    net.eval()
    return net, record
