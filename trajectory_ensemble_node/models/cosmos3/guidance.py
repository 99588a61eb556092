"""Guided denoising of every candidate of a group toward the chunk being executed (an execution context).

Conventions (diffusers flow matching, as the UniPC ``flow_prediction`` step uses them): a latent at noise level
``sigma`` is ``x = (1 - sigma) * x0 + sigma * eps``, the model predicts ``v = eps - x0``, so the predicted clean
action is ``x0_hat = x - sigma * v``. Every correction below is a change of ``v``, made before the group's own
scheduler step, per candidate and elementwise, so each candidate keeps its own seed and noise.

- ``"prefix"`` (gradient-free): ``x0_hat <- x0_hat + W * (Y - x0_hat)``, i.e. ``v <- v - W * (Y - x0_hat) / sigma``.
  With ``W = 1`` on the frozen actions every step's clean prediction there IS the previous chunk, so the sampler's
  output is too (UniPC combines clean predictions linearly; the last step lands on the last one).
- ``"mask"``: the frozen actions are conditioned through the model's action mask (clean tokens without a timestep,
  velocity 0, as upstream conditions actions); the ramp after them is guided as in ``"prefix"``.
- ``"vjp"`` (RTC, Black et al. 2025, pseudo-inverse form): ``v <- v - w * J^T (W * (Y - x0_hat))`` with
  ``J = d x0_hat / d x`` through the transformer and ``w = min(c / r^2, cap)``, ``c = sigma / (1 - sigma)``,
  ``1 / r^2 = ((1 - sigma)^2 + sigma^2) / sigma^2`` (RTC's ``t = 1 - sigma``; their velocity is ``-v``).

Continuity's other homes are listed in :mod:`trajectory_ensemble_node.serving.continuity`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ...engine.context import ExecutionContext
from ...errors import ContextUnsupportedError
from .conditioning import GroupConditioning


@dataclass(frozen=True)
class GroupGuidance:
    """A group's guidance, on the adapter's device and in its padded action layout.

    Args:
        mode (`str`): ``"prefix"``, ``"mask"``, ``"vjp"`` or ``"none"``.
        weights (`torch.Tensor` of shape `[A, 1]`): Per-action weights (1 frozen, ramp, 0), float32.
        target (`torch.Tensor` of shape `[A, D_model]`): Previous actions at the same times, zero-padded past the raw
            width and past the overlap, float32.
        frozen (`int`): Frozen count ``d``.
        raw_action_dim (`int`): Raw width; channels past it are padding and never guided.
        max_weight (`float`): VJP guidance weight cap.
    """

    mode: str
    weights: torch.Tensor
    target: torch.Tensor
    frozen: int
    raw_action_dim: int
    max_weight: float

    @classmethod
    def build(cls, context: ExecutionContext, conditioning: GroupConditioning, device: torch.device) -> GroupGuidance:
        horizon, model_width = conditioning.x0_action.shape
        raw = conditioning.raw_action_dim
        context.check(horizon, raw)
        target = torch.zeros(horizon, model_width, dtype=torch.float32)
        target[:, :raw] = context.target(horizon)
        return cls(
            mode=context.guidance,
            weights=context.weights(horizon)[:, None].to(device),
            target=target.to(device),
            frozen=context.frozen,
            raw_action_dim=raw,
            max_weight=float(context.max_guidance_weight),
        )

    def clean_gap(self, action: torch.Tensor, velocity: torch.Tensor, sigma: float) -> torch.Tensor:
        """``W * (Y - x0_hat)`` on the raw channels, ``[N, A, D_model]`` (zero on padding)."""
        gap = self.weights * (self.target - (action - sigma * velocity))
        gap[..., self.raw_action_dim :] = 0
        return gap

    def prefix_velocity(self, action: torch.Tensor, velocity: torch.Tensor, sigma: float) -> torch.Tensor:
        """Gradient-free guidance of stacked candidates.

        Args:
            action (`torch.Tensor` of shape `[N, A, D_model]`): Current latents ``x`` (float32).
            velocity (`torch.Tensor` of shape `[N, A, D_model]`): The step's (CFG-combined, masked) velocity.
            sigma (`float`): The step's noise level, ``> 0``.

        Returns:
            `torch.Tensor` of shape `[N, A, D_model]`: The velocity whose clean prediction is pulled to the target.
        """
        return velocity - self.clean_gap(action, velocity, sigma) / sigma

    def vjp_weight(self, sigma: float) -> float:
        """RTC's guidance weight ``min(c / r^2, cap)`` at noise level ``sigma``."""
        if sigma >= 1.0:
            return self.max_weight
        c = sigma / (1.0 - sigma)
        inv_r2 = ((1.0 - sigma) ** 2 + sigma**2) / sigma**2
        return min(c * inv_r2, self.max_weight)


def condition_frozen_prefix(conditioning: GroupConditioning, guidance: GroupGuidance) -> GroupConditioning:
    """The group's conditioning with its frozen actions conditioned through the action mask (``"mask"`` mode).

    The frozen tokens carry the previous chunk's actions as clean tokens: they are left out of the noisy action
    indexes (no timestep, velocity masked to 0, as upstream conditions actions), and the initial latents take them
    instead of noise. The text prefixes are the same objects, so the prefix cache is shared as before.
    """
    frozen = guidance.frozen
    if frozen == 0:
        return conditioning
    horizon = conditioning.x0_action.shape[0]
    x0_action = conditioning.x0_action.clone()
    x0_action[:frozen] = guidance.target[:frozen].to(x0_action)
    action_mask = conditioning.action_mask.clone()
    action_mask[:frozen] = 1.0
    branches = []
    for branch in conditioning.branches:
        template = branch.template
        if template.action_noisy_frame_indexes is None:
            raise ContextUnsupportedError("mask guidance needs a group that denoises action tokens")
        keep = template.action_noisy_frame_indexes[template.action_noisy_frame_indexes >= frozen]
        branches.append(dataclasses.replace(branch, template=dataclasses.replace(
            template, action_noisy_frame_indexes=keep)))
    if len(branches[0].template.action_noisy_frame_indexes) == 0 or frozen >= horizon:
        raise ContextUnsupportedError(f"mask guidance would condition all {horizon} action tokens")
    return dataclasses.replace(conditioning, branches=tuple(branches), x0_action=x0_action, action_mask=action_mask)


def vjp_velocity(
    guidance: GroupGuidance, leaf: torch.Tensor, velocity: torch.Tensor, sigma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """RTC's corrected velocity of stacked candidates, from a velocity still attached to the model's graph.

    Args:
        guidance (`GroupGuidance`): The group's guidance.
        leaf (`torch.Tensor` of shape `[n, A, D_model]`): The latents fed to the transformer (``requires_grad``).
        velocity (`torch.Tensor` of shape `[n, A, D_model]`): The masked velocity computed from ``leaf`` (float32).
        sigma (`float`): The step's noise level.

    Returns:
        `tuple`: the corrected velocity (detached) and ``J^T e`` (detached), both ``[n, A, D_model]``.
    """
    clean = leaf.float() - sigma * velocity
    gap = guidance.clean_gap(leaf.detach().float(), velocity.detach(), sigma)
    (pullback,) = torch.autograd.grad(clean, leaf, grad_outputs=gap, retain_graph=True)
    pullback = pullback.float()
    pullback[..., guidance.raw_action_dim :] = 0
    return velocity.detach() - guidance.vjp_weight(sigma) * pullback, pullback


def check_context(
    context: ExecutionContext,
    action: object,
    *,
    rollout: object,
    guidance_scale: float,
    supported: tuple[str, ...],
) -> None:
    """Refuse, before any model work, a context this Cosmos 3 request cannot honour.

    Args:
        context (`ExecutionContext`): The chunk being executed.
        action (`CosmosActionCondition`): The request's action condition (policy mode, chunk size, raw width).
        rollout (`RolloutSpec`, *optional*): Rollout groups record their own noise path; guidance would change it.
        guidance_scale (`float`): ``"vjp"`` differentiates one branch, so it needs no classifier-free guidance.
        supported (`tuple[str, ...]`): The adapter's declared guidance modes.

    Raises:
        ContextUnsupportedError: wrong type, rollout, a mode other than policy, an undeclared guidance mode, or
            ``"vjp"`` with CFG.
        ExecutionContextError / DelayTooLongError: width or frozen count do not fit the chunk.
    """
    if not isinstance(context, ExecutionContext):
        raise ContextUnsupportedError(f"context must be an ExecutionContext, got {type(context).__name__}")
    if rollout is not None:
        raise ContextUnsupportedError("an execution context cannot guide a rollout group")
    mode = getattr(action, "mode", None)
    if mode != "policy":
        raise ContextUnsupportedError(f"an execution context continues policy actions, not mode {mode!r}")
    if context.guidance not in supported:
        raise ContextUnsupportedError(f"guidance {context.guidance!r} is not supported; supported: {supported}")
    if context.guidance == "vjp" and guidance_scale != 1.0:
        raise ContextUnsupportedError(
            f"vjp guidance differentiates a single branch; it needs guidance_scale 1.0, got {guidance_scale!r}"
        )
    context.check(int(action.chunk_size), int(action.raw_action_dim))
