"""Flow-GRPO on rollout records: recompute recorded SDE log-probs with gradients, take clipped policy-gradient steps.

A rollout record (``models/cosmos3/rollout.py``, in memory or read back from its safetensors file) holds, per
candidate, the latents before and after every captured denoising step. The training forward here runs the
trainer's transformer over those recorded pre-step latents, packed by the serving path's own
:func:`~trajectory_ensemble_node.models.cosmos3.packing.pack_forward` under the fan-out attention layout (one block
per candidate and step, all sharing the group's text prefix), masks the velocity exactly as the adapter does
(:meth:`Cosmos3Adapter._mask`, then classifier-free guidance when the record has two branches), and evaluates the
recorded transition ``x -> x'`` under the Flow-GRPO "sde" Gaussian with the rollout's own
:func:`~trajectory_ensemble_node.models.cosmos3.rollout.sde_transition` and
:func:`~trajectory_ensemble_node.models.cosmos3.rollout.gaussian_log_prob`. With unchanged weights this reproduces
the recorded ``action_log_probs`` (ratio 1); after an update the difference is the policy-gradient signal.

Only the action tokens' log-probs enter the ratio: the reward is a function of the action alone, and the recorded
action log-prob is a mean over 16 elements while the vision one is a mean over thousands, so adding it would let
the (reward-free) video likelihood dominate the ratio. The vision latents still condition every action step,
exactly as recorded.

The engine stays inference-only: everything with gradients lives here.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from trajectory_ensemble_node.errors import InvalidSpecError
from trajectory_ensemble_node.models.cosmos3 import (
    SIGMA_ONE_ATOL,
    Cosmos3Adapter,
    GroupConditioning,
    PackItem,
    forward_items,
    gaussian_log_prob,
    install_fanout,
    sde_transition,
)
from trajectory_ensemble_node.toy import task


class GrpoError(InvalidSpecError):
    """A rollout record or setting the GRPO trainer cannot use (e.g. no SDE step, a record from another request)."""


SUCCESS_RADIUS = task.TARGET_RADIUS
"""A candidate succeeds when it does not collide and its last waypoint lies within the target disk."""


# --- reward and advantages -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RewardWeights:
    """``reward = success * success_w - collision * collision_w - final_error * error_w`` (normalized units)."""

    success: float = 1.0
    collision: float = 1.0
    error: float = 1.0


def score(scene: task.Scene, candidates: np.ndarray, weights: RewardWeights = RewardWeights()) -> dict[str, np.ndarray]:
    """The toy task's metrics and the reward of each candidate chunk.

    Args:
        scene (`task.Scene`): The scene the chunks were planned in.
        candidates (`np.ndarray` of shape `[N, H, 2]`): Candidate waypoints.
        weights (`RewardWeights`): Reward coefficients.

    Returns:
        `dict`: ``reward``, ``collision``, ``success``, ``final_error``, each of shape `[N]`.
    """
    collision = np.array([task.collides(scene, c) for c in candidates], dtype=bool)
    error = np.array([task.final_error(scene, c) for c in candidates], dtype=np.float64)
    success = ~collision & (error <= SUCCESS_RADIUS)
    reward = weights.success * success - weights.collision * collision - weights.error * error
    return {"reward": reward, "collision": collision, "success": success, "final_error": error}


def group_advantages(rewards: np.ndarray, std_floor: float) -> np.ndarray:
    """GRPO advantages: ``(r - mean) / max(std, std_floor)`` within each candidate group.

    Why a floor: a group where no candidate collides differs only in final error (std ~0.01); dividing by that std
    would give its tiny error differences the same weight as a collision in another group.

    Args:
        rewards (`np.ndarray` of shape `[G, N]`): One row per group.
        std_floor (`float`): Smallest divisor (> 0).

    Returns:
        `np.ndarray` of shape `[G, N]`.
    """
    if not std_floor > 0:
        raise GrpoError(f"std_floor must be > 0, got {std_floor!r}.")
    mean = rewards.mean(axis=1, keepdims=True)
    std = rewards.std(axis=1, keepdims=True)
    return (rewards - mean) / np.maximum(std, std_floor)


# --- the training forward --------------------------------------------------------------------------------------------


@dataclass
class GroupRecord:
    """One rollout group, ready for training.

    Args:
        conditioning (`GroupConditioning`): The group's conditioning, re-encoded by the trainer (its prefix tokens
            are checked against the record's ``cond_input_ids``).
        tensors (`Mapping[str, torch.Tensor]`): The rollout record (see ``RolloutStepper.result``).
        manifest (`Mapping[str, Any]`): Its manifest (``noise_level``, ``sde_steps``, ``weights_version``...).
        scene (`task.Scene`, *optional*): The scene, for scoring.
    """

    conditioning: GroupConditioning
    tensors: Mapping[str, torch.Tensor]
    manifest: Mapping[str, Any]
    scene: task.Scene | None = None

    def __post_init__(self) -> None:
        recorded = self.tensors["cond_input_ids"].tolist()
        if recorded != list(self.conditioning.cond_input_ids):
            raise GrpoError(f"record {self.manifest.get('request_id')!r} was made from other prompt tokens than "
                            "the trainer's conditioning; its log-probs cannot be recomputed.")
        recorded_x0 = self.tensors["condition_vision_latents"].float()
        ours = self.conditioning.x0_vision.detach().float().cpu()
        if recorded_x0.shape != ours.shape or not torch.allclose(recorded_x0, ours, atol=1e-4, rtol=0):
            raise GrpoError(f"record {self.manifest.get('request_id')!r} was made from another observation than the "
                            "trainer's (its conditioning latents differ).")
        steps = self.steps
        if not steps:
            raise GrpoError(f"record {self.manifest.get('request_id')!r} has no captured SDE step "
                            f"(sde_steps={list(self.manifest.get('sde_steps', []))!r}).")

    @property
    def steps(self) -> list[int]:
        """SDE steps whose pre- and post-step latents were both captured."""
        points = self.tensors["latent_points"].tolist()
        return [s for s in self.manifest["sde_steps"] if s in points and s + 1 in points]

    @property
    def candidates(self) -> np.ndarray:
        """Final action chunks ``[N, H, raw]`` as the node returned them."""
        raw = int(self.manifest["raw_action_dim"])
        return self.tensors["action_latents"][:, -1, :, :raw].double().numpy()


def recompute_log_probs(
    transformer: torch.nn.Module,
    record: GroupRecord,
    steps: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Log-probs of the recorded action transitions under ``transformer``'s weights (differentiable).

    Args:
        transformer (`torch.nn.Module`): A ``Cosmos3OmniTransformer`` (the fan-out processor is installed).
        record (`GroupRecord`): The rollout group.
        steps (`Sequence[int]`, *optional*): Which recorded SDE steps (default: all of them).

    Returns:
        `tuple`: ``log_probs`` `[N, S]`, the Gaussian means ``mu`` `[N, S, A, D]` and stds `[S]` of the action
        transitions (for a KL term).
    """
    tensors, manifest = record.tensors, record.manifest
    steps = list(record.steps if steps is None else steps)
    points = tensors["latent_points"].tolist()
    sigmas = tensors["sigmas"].float()
    below_one = sigmas[(sigmas < 1.0 - SIGMA_ONE_ATOL) & (sigmas > 0)]
    sigma_cap = float(below_one.max())
    conditioning = record.conditioning
    param = next(transformer.parameters())
    device, dtype = param.device, param.dtype
    items: list[PackItem] = []
    for step in steps:
        vision = tensors["vision_latents"][:, points.index(step)].to(device=device, dtype=dtype)
        action = tensors["action_latents"][:, points.index(step)].to(device=device, dtype=dtype)
        # The adapter passes ``timesteps[i].item()`` of the same float32 grid the record stores.
        timestep = tensors["timesteps"][step].item()
        for branch in conditioning.branches:
            items.append(PackItem(branch=branch, vision=vision, action=action, timestep=timestep))
    pred_v, pred_a = forward_items(transformer, items, device)
    branches = len(conditioning.branches)
    scale = float(manifest["guidance_scale"])
    noisy_action = (1.0 - conditioning.action_mask).bool().cpu()  # [A, 1]
    channels = torch.arange(tensors["action_latents"].shape[-1])
    mask = noisy_action & (channels < conditioning.raw_action_dim)  # [A, D]
    log_probs, means, stds = [], [], []
    for k, step in enumerate(steps):
        velocities = [Cosmos3Adapter._mask(conditioning, pred_v[k * branches + b], pred_a[k * branches + b])[1]
                      for b in range(branches)]
        v = velocities[0] if branches == 1 else velocities[1] + scale * (velocities[0] - velocities[1])
        x = tensors["action_latents"][:, points.index(step)].float().to(v.device)
        x_next = tensors["action_latents"][:, points.index(step + 1)].float().to(v.device)
        mean, std = sde_transition(x, v, float(sigmas[step]), float(sigmas[step + 1]),
                                   float(manifest["noise_level"]), sigma_cap)
        log_probs.append(gaussian_log_prob(x_next, mean, std, mask.to(v.device).expand_as(x)))
        means.append(mean)
        stds.append(std)
    return torch.stack(log_probs, dim=1), torch.stack(means, dim=1), torch.tensor(stds)


def recorded_log_probs(record: GroupRecord, steps: Sequence[int] | None = None) -> torch.Tensor:
    """The recorded action log-probs ``[N, S]`` of ``steps`` (default: all recorded SDE steps)."""
    steps = list(record.steps if steps is None else steps)
    return record.tensors["action_log_probs"][:, steps].float()


# --- the optimizer step -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSettings:
    """Clipped-ratio policy-gradient settings.

    Args:
        clip (`float`): PPO clip range ``epsilon`` on the per-step ratio.
        kl (`float`): Weight of the KL to the starting policy (0 = off; then no reference forward runs).
        max_grad_norm (`float`): Gradient-norm clip.
    """

    clip: float = 0.2
    kl: float = 0.0
    max_grad_norm: float = 1.0


class PolicyTrainer:
    """AdamW on a transformer with the clipped GRPO objective over recorded transitions.

    Args:
        transformer (`torch.nn.Module`): The trainer's own transformer (not the serving one).
        lr (`float`): AdamW learning rate.
        weight_decay (`float`): AdamW weight decay.
        settings (`StepSettings`): Clip, KL, gradient clipping.
    """

    def __init__(self, transformer: torch.nn.Module, *, lr: float, weight_decay: float = 0.0,
                 settings: StepSettings = StepSettings()) -> None:
        self.transformer = transformer
        self.settings = settings
        install_fanout(transformer)
        self.params = [p for p in transformer.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)
        # The frozen starting policy, only when a KL term needs its means.
        self.reference = None
        if settings.kl > 0:
            self.reference = copy.deepcopy(transformer).eval().requires_grad_(False)

    def ratio_deviation(self, records: Sequence[GroupRecord]) -> float:
        """``max |exp(recomputed - recorded) - 1|`` over every recorded SDE transition (no gradient)."""
        worst = 0.0
        with torch.no_grad():
            for record in records:
                log_probs, _, _ = recompute_log_probs(self.transformer, record)
                ratio = torch.exp(log_probs.double() - recorded_log_probs(record).double())
                worst = max(worst, float((ratio - 1).abs().max()))
        return worst

    def step(self, records: Sequence[GroupRecord], advantages: np.ndarray) -> dict[str, float]:
        """One optimizer step over ``records`` (one group at a time, gradients accumulated).

        Args:
            records (`Sequence[GroupRecord]`): G groups.
            advantages (`np.ndarray` of shape `[G, N]`): Per-candidate advantages.

        Returns:
            `dict`: ``loss``, ``ratio_max_abs_dev`` (before this step's update), ``clip_fraction``, ``kl``,
            ``grad_norm``.
        """
        self.transformer.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = sum(len(r.steps) * r.tensors["action_log_probs"].shape[0] for r in records)
        stats = {"loss": 0.0, "ratio_max_abs_dev": 0.0, "clip_fraction": 0.0, "kl": 0.0}
        eps = self.settings.clip
        for record, advantage in zip(records, advantages, strict=True):
            log_probs, mean, stds = recompute_log_probs(self.transformer, record)
            old = recorded_log_probs(record).to(log_probs.device)
            ratio = torch.exp(log_probs - old)
            adv = torch.as_tensor(advantage, dtype=ratio.dtype, device=ratio.device)[:, None].expand_as(ratio)
            unclipped = -adv * ratio
            clipped = -adv * ratio.clamp(1.0 - eps, 1.0 + eps)
            # Sum over this group's transitions / all transitions: the mean over the batch, group by group.
            loss = torch.maximum(unclipped, clipped).sum() / total
            if self.reference is not None:
                with torch.no_grad():
                    _, ref_mean, _ = recompute_log_probs(self.reference, record)
                # KL between two Gaussians of equal std s: |mu - mu_ref|^2 / (2 s^2), mean over noisy elements.
                s2 = (stds.to(mean.device) ** 2)[None, :, None, None]
                noisy = (1.0 - record.conditioning.action_mask).bool()
                channels = torch.arange(mean.shape[-1]) < record.conditioning.raw_action_dim
                element_mask = (noisy & channels).to(mean.dtype)
                kl = (((mean - ref_mean) ** 2) / (2 * s2) * element_mask).sum((-1, -2)) / element_mask.sum()
                loss = loss + self.settings.kl * kl.sum() / total
                stats["kl"] += float(kl.sum()) / total
            loss.backward()
            stats["loss"] += float(loss.detach())
            stats["ratio_max_abs_dev"] = max(stats["ratio_max_abs_dev"], float((ratio.detach() - 1).abs().max()))
            stats["clip_fraction"] += float(((ratio.detach() - 1).abs() > eps).sum()) / total
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm))
        self.optimizer.step()
        self.transformer.eval()
        return stats

    def save(self, path: Path) -> Path:
        """Write the transformer's parameters (float32, diffusers names) as safetensors, for ``update_weights``."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {name: p.detach().float().cpu().contiguous() for name, p in self.transformer.named_parameters()}
        tmp = path.with_suffix(".tmp")
        save_file(tensors, str(tmp), metadata={"format": "trajectory_ensemble.grpo_weights"})
        tmp.replace(path)
        return path
