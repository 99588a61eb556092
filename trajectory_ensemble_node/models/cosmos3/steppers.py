"""Per-group stepper state: how a group's latents advance by one denoising step.

"Stepper" names the diffusers noise scheduler (UniPC) as this package uses it, so that "scheduler" keeps one
meaning: the engine's request scheduling (:mod:`trajectory_ensemble_node.engine.scheduler`). Each group owns its
stepper state (deep copies of the pipeline's noise scheduler), so groups at different steps, with different
step counts, can share one physical forward, and the pipeline's own is never mutated. The step math is elementwise
per sample, so one stepper state over the stacked ``[N, ...]`` candidates equals N separate ones.
"""

from __future__ import annotations

import copy
from typing import Protocol

import numpy as np
import torch
from diffusers import UniPCMultistepScheduler


class GroupStepper(Protocol):
    """Advances one group's stacked latents; one instance per group (and per retry)."""

    timesteps: torch.Tensor

    @property
    def num_steps(self) -> int: ...

    def step(
        self,
        index: int,
        velocity_vision: torch.Tensor,
        vision: torch.Tensor,
        velocity_action: torch.Tensor | None,
        action: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class PipelineStepper:
    """The pipeline's own step: one UniPC state for vision and a deep-copied one for actions.

    Reproduces ``Cosmos3OmniPipeline.__call__``: ``set_timesteps`` on the pipeline's noise scheduler (here on a
    private copy, the vision stepper state), then a deep copy for the action stream, each stepped once per denoising
    step.

    Args:
        noise_scheduler (`SchedulerMixin`): The pipeline's noise scheduler; only copied, never mutated.
        num_inference_steps (`int`): Denoising steps.
        device (`torch.device`): Device of the timesteps.
        use_native_flow_schedule (`bool`): Mirrors the pipeline config flag of the same name.
        has_action (`bool`): Whether the group denoises action tokens.
    """

    def __init__(
        self,
        noise_scheduler: UniPCMultistepScheduler,
        num_inference_steps: int,
        device: torch.device,
        *,
        use_native_flow_schedule: bool = False,
        has_action: bool = True,
    ) -> None:
        self.vision_state = copy.deepcopy(noise_scheduler)
        if use_native_flow_schedule:
            num_train = self.vision_state.config.num_train_timesteps
            sigmas = np.linspace(1.0 - 1.0 / num_train, 0.0, num_inference_steps + 1)[:-1]
            self.vision_state.set_timesteps(num_inference_steps, device=device, sigmas=sigmas)
        else:
            self.vision_state.set_timesteps(num_inference_steps, device=device)
        self.timesteps = self.vision_state.timesteps
        self.action_state = copy.deepcopy(self.vision_state) if has_action else None

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    @property
    def sigmas(self) -> torch.Tensor:
        return self.vision_state.sigmas

    def step(
        self,
        index: int,
        velocity_vision: torch.Tensor,
        vision: torch.Tensor,
        velocity_action: torch.Tensor | None,
        action: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Advance ``[N, C, T, H, W]`` vision and ``[N, A, D]`` action latents by step ``index``."""
        t = self.timesteps[index]
        vision = self.vision_state.step(velocity_vision, t, vision, return_dict=False)[0]
        if velocity_action is not None and action is not None and self.action_state is not None:
            action = self.action_state.step(velocity_action, t, action, return_dict=False)[0]
        return vision, action
