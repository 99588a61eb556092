"""RL rollouts from candidate groups: per-request Euler grid, Flow-GRPO "sde" steps with log-probs, capture.

A rollout group gets its own ``FlowMatchEulerDiscreteScheduler`` (the pipeline's is never touched) and, on selected
steps, the Flow-GRPO "sde" transition with its log-prob (:func:`sde_transition`; the formula: docs/grpo.md). Conditioned
tokens and padding channels get no noise and no log-prob; where the transition cannot be exactly Gaussian the request
is refused (:class:`RolloutError`), never answered with a wrong number.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.utils.torch_utils import randn_tensor
from safetensors.torch import load_file, save_file

from ...errors import InvalidSpecError, RolloutError
from .conditioning import GroupConditioning
from .steppers import PipelineStepper

ROLLOUT_FORMAT_VERSION = 1
SIGMA_ONE_ATOL = 1e-4
"""Grid sigmas within this of 1 count as σ = 1 in ``std_t``. Schedulers often start at ``1 - 1e-6`` (timestep
999.999, e.g. the toy's UniPC grid); taken literally, ``sqrt(σ / (1 - σ))`` is then ~1000 and the first SDE step
throws the latents to ~1e4, so every later step and the returned chunk are garbage."""
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class RolloutSpec:
    """Rollout mode for one request (off unless passed to ``generate(rollout=...)``).

    Args:
        noise_level (`float`): Flow-GRPO ``η`` (>= 0). ``0`` makes every step the deterministic ODE step.
        sde_steps (`tuple[int, ...]`, *optional*): Steps that take the SDE transition; ``None`` means all.
        flow_shift (`float`, *optional*): Explicit shift of the rollout grid; ``None`` inherits the pipeline's grid.
        output_dir (`str` or `Path`, *optional*): Where ``<request_id>.safetensors`` and ``<request_id>.json`` are
            written; ``None`` keeps the record in memory only.
        capture_steps (`tuple[int, ...]`, *optional*): Steps whose pre-step latents are stored (with the latents
            right after them, so each captured transition is self-contained); ``None`` means every step.
    """

    noise_level: float = 0.7
    sde_steps: tuple[int, ...] | None = None
    flow_shift: float | None = None
    output_dir: str | Path | None = None
    capture_steps: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.noise_level, (int, float)) or not math.isfinite(self.noise_level) or (
            self.noise_level < 0
        ):
            raise InvalidSpecError(f"noise_level must be a finite float >= 0, got {self.noise_level!r}.")
        if self.flow_shift is not None and not (math.isfinite(self.flow_shift) and self.flow_shift > 0):
            raise InvalidSpecError(f"flow_shift must be a finite float > 0, got {self.flow_shift!r}.")
        for name in ("sde_steps", "capture_steps"):
            steps = getattr(self, name)
            if steps is None:
                continue
            steps = tuple(steps)
            if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in steps):
                raise InvalidSpecError(f"{name} must be non-negative ints, got {steps!r}.")
            object.__setattr__(self, name, tuple(sorted(set(steps))))

    def check_steps(self, num_inference_steps: int) -> None:
        for name in ("sde_steps", "capture_steps"):
            steps = getattr(self, name)
            if steps and max(steps) >= num_inference_steps:
                raise InvalidSpecError(
                    f"{name} {steps!r} reach beyond num_inference_steps={num_inference_steps}."
                )


@dataclass
class RolloutResult:
    """What a rollout group returns next to its candidates (``EnsembleResult.rollout``).

    Args:
        action_log_probs (`torch.Tensor` of shape `[N, num_inference_steps]`): Per candidate, per step, the mean
            log-density of the noisy action tokens' transition (0 on ODE steps).
        vision_log_probs (`torch.Tensor` of shape `[N, num_inference_steps]`, *optional*): Same for the noisy vision
            tokens; ``None`` when no vision token is noisy (e.g. inverse dynamics).
        sde_mask (`torch.BoolTensor` of shape `[num_inference_steps]`): Which steps were SDE steps.
        sigmas (`torch.Tensor` of shape `[num_inference_steps + 1]`), timesteps (`torch.Tensor`): The request's grid.
        path (`Path`, *optional*): The safetensors file (``None`` without ``output_dir``).
        manifest_path (`Path`, *optional*): The JSON manifest beside it.
        weights_version (`int`): Policy version that produced the samples.
        tensors (`dict[str, torch.Tensor]`): Everything that was (or would be) written, for in-memory trainers.
        manifest (`dict`): The manifest content.
    """

    action_log_probs: torch.Tensor
    vision_log_probs: torch.Tensor | None
    sde_mask: torch.Tensor
    sigmas: torch.Tensor
    timesteps: torch.Tensor
    path: Path | None
    manifest_path: Path | None
    weights_version: int
    tensors: dict[str, torch.Tensor] = field(repr=False, default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)


def build_rollout_scheduler(
    noise_scheduler: Any,
    num_inference_steps: int,
    device: torch.device,
    *,
    flow_shift: float | None,
    use_native_flow_schedule: bool = False,
) -> FlowMatchEulerDiscreteScheduler:
    """A fresh per-request Euler scheduler on the rollout grid.

    With no ``flow_shift`` it inherits the pipeline's grid (:class:`~.steppers.PipelineStepper`'s ``sigmas[:-1]``,
    terminal 0 appended by Euler); with a shift ``s`` it rebuilds ``sigma = s*u / (1 + (s-1)*u)`` over
    ``u = linspace(1, 1/num_train_timesteps, steps)`` and sets the Euler shift to 1.0, so ``set_timesteps(sigmas=...)``
    keeps the grid as given.
    """
    num_train = int(noise_scheduler.config.num_train_timesteps)
    if flow_shift is None:
        grid = PipelineStepper(noise_scheduler, num_inference_steps, device,
                               use_native_flow_schedule=use_native_flow_schedule, has_action=False)
        sigmas = grid.sigmas[:-1].float().cpu()
    else:
        u = torch.linspace(1.0, 1.0 / num_train, num_inference_steps, dtype=torch.float64)
        sigmas = (flow_shift * u / (1 + (flow_shift - 1) * u)).float()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=num_train, shift=1.0)
    scheduler.set_shift(1.0)
    scheduler.set_timesteps(sigmas=sigmas.tolist(), device=device)
    return scheduler


class RolloutStepper:
    """Per-group stepper in rollout mode: Euler grid, SDE or ODE per step, and the trajectory record.

    Args:
        spec (`RolloutSpec`): The request's rollout settings.
        scheduler (`FlowMatchEulerDiscreteScheduler`): The request's own scheduler (grid only; never shared).
        conditioning (`GroupConditioning`): Masks of the conditioned tokens and the raw action width.
        generators (`Sequence[torch.Generator]`): The candidates' generators, already past their initial noise.
    """

    def __init__(
        self,
        spec: RolloutSpec,
        scheduler: FlowMatchEulerDiscreteScheduler,
        conditioning: GroupConditioning,
        generators: Sequence[torch.Generator],
    ) -> None:
        self.spec = spec
        self.scheduler = scheduler
        self.timesteps = scheduler.timesteps
        self.sigmas = scheduler.sigmas.float().cpu()
        self.conditioning = conditioning
        self.generators = list(generators)
        steps = self.num_steps
        spec.check_steps(steps)
        sde = set(range(steps)) if spec.sde_steps is None else set(spec.sde_steps)
        if spec.noise_level == 0:
            sde = set()  # s = 0 has no density: every step is the deterministic ODE step
        self.sde_mask = torch.tensor([i in sde for i in range(steps)], dtype=torch.bool)
        self.capture = set(range(steps)) if spec.capture_steps is None else set(spec.capture_steps)
        self.latent_points = sorted(self.capture | {i + 1 for i in self.capture} | {steps})
        below_one = self.sigmas[(self.sigmas < 1.0 - SIGMA_ONE_ATOL) & (self.sigmas > 0)]
        if self.sde_mask.any() and below_one.numel() == 0:
            raise RolloutError("the rollout grid has no sigma strictly between 0 and 1; no SDE step is defined.")
        self._sigma_cap = float(below_one.max()) if below_one.numel() else 0.0
        for i in sde:
            if float(self.sigmas[i + 1]) >= float(self.sigmas[i]):
                raise RolloutError(f"step {i} does not decrease sigma ({float(self.sigmas[i])} -> "
                                   f"{float(self.sigmas[i + 1])}); its SDE transition has no density.")
        count = len(self.generators)
        self.action_log_probs = torch.zeros(count, steps, dtype=torch.float32)
        self.vision_log_probs = torch.zeros(count, steps, dtype=torch.float32)
        self.latents: dict[str, dict[int, torch.Tensor]] = {"vision": {}, "action": {}}
        self.velocities: dict[str, dict[int, torch.Tensor]] = {"vision": {}, "action": {}}
        device_v = conditioning.vision_mask.device
        self.noisy_vision = (1.0 - conditioning.vision_mask).bool().to(device_v)  # [T, 1, 1]
        action_noisy = (1.0 - conditioning.action_mask).bool()  # [A, 1]
        channels = torch.arange(conditioning.x0_action.shape[-1], device=action_noisy.device)
        self.noisy_action = action_noisy & (channels < conditioning.raw_action_dim)  # [A, D]
        self.has_noisy_vision = bool(self.noisy_vision.any())

    @property
    def num_steps(self) -> int:
        return len(self.timesteps)

    def step(
        self,
        index: int,
        velocity_vision: torch.Tensor,
        vision: torch.Tensor,
        velocity_action: torch.Tensor | None,
        action: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        sigma, sigma_next = self.sigmas[index], self.sigmas[index + 1]
        self._record(index, vision, action, velocity_vision, velocity_action)
        if not bool(self.sde_mask[index]):
            vision = vision + (sigma_next - sigma).to(vision.device) * velocity_vision
            if velocity_action is not None and action is not None:
                action = action + (sigma_next - sigma).to(action.device) * velocity_action
        else:
            noise_v, noise_a = self._draw(vision, action)
            vision, lp_v = self._sde(vision, velocity_vision, noise_v, sigma, sigma_next, self.noisy_vision)
            self.vision_log_probs[:, index] = lp_v
            if velocity_action is not None and action is not None:
                action, lp_a = self._sde(action, velocity_action, noise_a, sigma, sigma_next, self.noisy_action)
                self.action_log_probs[:, index] = lp_a
        if index + 1 == self.num_steps:
            self._record(index + 1, vision, action, None, None)
        return vision, action

    def _draw(self, vision: torch.Tensor, action: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        noise_v, noise_a = [], []
        for generator in self.generators:
            noise_v.append(randn_tensor(tuple(vision.shape[1:]), generator=generator, device=vision.device,
                                        dtype=torch.float32))
            if action is not None:
                noise_a.append(randn_tensor(tuple(action.shape[1:]), generator=generator, device=action.device,
                                            dtype=torch.float32))
        return torch.stack(noise_v), (torch.stack(noise_a) if action is not None else None)

    def _sde(
        self,
        x: torch.Tensor,
        v: torch.Tensor,
        noise: torch.Tensor,
        sigma: torch.Tensor,
        sigma_next: torch.Tensor,
        noisy: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        mean, std = sde_transition(x, v, float(sigma), float(sigma_next), self.spec.noise_level, self._sigma_cap)
        sampled = mean + std * noise
        # Conditioned tokens and padding channels: no noise, no drift (v is 0 there, so this is x itself).
        ode = x + (sigma_next - sigma).to(x.device) * v
        mask = noisy.expand_as(x)
        x_next = torch.where(mask, sampled, ode)
        return x_next, gaussian_log_prob(x_next, mean, std, mask)

    def _record(
        self,
        point: int,
        vision: torch.Tensor,
        action: torch.Tensor | None,
        velocity_vision: torch.Tensor | None,
        velocity_action: torch.Tensor | None,
    ) -> None:
        if point in self.latent_points:
            self.latents["vision"][point] = vision.detach().float().cpu().clone()
            if action is not None:
                self.latents["action"][point] = action.detach().float().cpu().clone()
        if point in self.capture and velocity_vision is not None:
            self.velocities["vision"][point] = velocity_vision.detach().float().cpu().clone()
            if velocity_action is not None:
                self.velocities["action"][point] = velocity_action.detach().float().cpu().clone()

    def result(self, *, request_id: str, seeds: Sequence[int], candidate_ids: Sequence[int],
               weights_version: int, guidance_scale: float, domain_name: str) -> RolloutResult:
        """Assemble (and, with ``output_dir``, write) the rollout record."""
        if not torch.isfinite(self.action_log_probs).all() or not torch.isfinite(self.vision_log_probs).all():
            raise RolloutError(f"rollout {request_id!r} produced non-finite log-probabilities; nothing was written.")
        conditioning = self.conditioning
        captured = sorted(self.capture)
        tensors: dict[str, torch.Tensor] = {
            "latent_points": torch.tensor(self.latent_points, dtype=torch.int64),
            "captured_steps": torch.tensor(captured, dtype=torch.int64),
            "vision_latents": torch.stack([self.latents["vision"][p] for p in self.latent_points], dim=1),
            "action_latents": torch.stack([self.latents["action"][p] for p in self.latent_points], dim=1),
            "vision_velocity": torch.stack([self.velocities["vision"][s] for s in captured], dim=1),
            "action_velocity": torch.stack([self.velocities["action"][s] for s in captured], dim=1),
            "action_log_probs": self.action_log_probs.clone(),
            "sde_mask": self.sde_mask.to(torch.uint8),
            "sigmas": self.sigmas.clone(),
            "timesteps": self.timesteps.detach().float().cpu().clone(),
            "cond_input_ids": torch.tensor(conditioning.cond_input_ids, dtype=torch.int64),
            "uncond_input_ids": torch.tensor(conditioning.uncond_input_ids, dtype=torch.int64),
            "condition_vision_latents": conditioning.x0_vision.detach().float().cpu().clone(),
            "vision_condition_mask": conditioning.vision_mask.detach().float().cpu().clone(),
            "condition_action_latents": conditioning.x0_action.detach().float().cpu().clone(),
            "action_condition_mask": conditioning.action_mask.detach().float().cpu().clone(),
        }
        vision_log_probs = self.vision_log_probs.clone() if self.has_noisy_vision else None
        if vision_log_probs is not None:
            tensors["vision_log_probs"] = vision_log_probs
        manifest = {
            "format_version": ROLLOUT_FORMAT_VERSION,
            "request_id": request_id,
            "weights_version": int(weights_version),
            "candidate_ids": [int(i) for i in candidate_ids],
            "seeds": [int(s) for s in seeds],
            "noise_level": float(self.spec.noise_level),
            "flow_shift": self.spec.flow_shift,
            "sde_steps": [i for i, on in enumerate(self.sde_mask.tolist()) if on],
            "captured_steps": captured,
            "latent_points": list(self.latent_points),
            "num_inference_steps": self.num_steps,
            "guidance_scale": float(guidance_scale),
            "domain_name": domain_name,
            "raw_action_dim": int(conditioning.raw_action_dim),
            "vision_log_probs": vision_log_probs is not None,
            "log_prob_definition": "mean over noisy elements of -(x'-mu)^2/(2 s^2) - log s - log sqrt(2 pi)",
            "velocity": "classifier-free-guided, conditioned positions masked to 0",
        }
        path = manifest_path = None
        if self.spec.output_dir is not None:
            path, manifest_path = _write(Path(self.spec.output_dir), request_id, tensors, manifest)
        return RolloutResult(
            action_log_probs=self.action_log_probs.clone(),
            vision_log_probs=vision_log_probs,
            sde_mask=self.sde_mask.clone(),
            sigmas=self.sigmas.clone(),
            timesteps=tensors["timesteps"],
            path=path,
            manifest_path=manifest_path,
            weights_version=int(weights_version),
            tensors=tensors,
            manifest=manifest,
        )


def sde_transition(
    x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float, noise_level: float, sigma_cap: float
) -> tuple[torch.Tensor, float]:
    """Mean and std of the Flow-GRPO "sde" transition from ``x`` at ``sigma`` to ``sigma_next``.

    Args:
        x (`torch.Tensor`): Latents at ``sigma`` (float32).
        v (`torch.Tensor`): Velocity (same shape).
        sigma (`float`), sigma_next (`float`): Current and next grid sigma (``sigma_next < sigma``).
        noise_level (`float`): ``η``.
        sigma_cap (`float`): The largest grid sigma below ``1 - SIGMA_ONE_ATOL``, used in ``std_t`` when ``sigma`` is
            within ``SIGMA_ONE_ATOL`` of 1.

    Returns:
        `tuple`: ``(μ, s)``.
    """
    dt = sigma_next - sigma
    sigma_std = sigma if sigma < 1.0 - SIGMA_ONE_ATOL else sigma_cap
    std_t = noise_level * math.sqrt(sigma_std / (1.0 - sigma_std))
    mean = x * (1.0 + std_t**2 * dt / (2.0 * sigma)) + v * (1.0 + std_t**2 * (1.0 - sigma) / (2.0 * sigma)) * dt
    return mean, std_t * math.sqrt(-dt)


def gaussian_log_prob(x_next: torch.Tensor, mean: torch.Tensor, std: float, mask: torch.Tensor) -> torch.Tensor:
    """Per-sample mean over ``mask`` of the isotropic Gaussian log-density (``[N, ...] -> [N]``)."""
    elementwise = -((x_next - mean) ** 2) / (2.0 * std**2) - math.log(std) - _LOG_SQRT_2PI
    mask = mask.to(elementwise.dtype)
    return (elementwise * mask).flatten(1).sum(1) / mask.flatten(1).sum(1).clamp_min(1.0)


def _write(directory: Path, request_id: str, tensors: dict[str, torch.Tensor], manifest: dict[str, Any]):
    directory.mkdir(parents=True, exist_ok=True)
    safe_id = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in request_id)
    path = directory / f"{safe_id}.safetensors"
    manifest_path = directory / f"{safe_id}.json"
    # Write then rename, so a trainer polling the directory never reads a half-written file.
    tmp = path.with_suffix(".safetensors.tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp),
              metadata={"format": "trajectory_ensemble.rollout", "request_id": request_id})
    os.replace(tmp, path)
    manifest = dict(manifest, tensors_file=path.name)
    tmp_manifest = manifest_path.with_suffix(".json.tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp_manifest, manifest_path)
    return path, manifest_path


def read_record(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A rollout record written for a group with ``RolloutSpec.output_dir``: its tensors and the JSON manifest.

    Args:
        path (`str` or `Path`): The ``<request_id>.safetensors`` file (``RolloutResult.path``).

    Returns:
        `tuple[dict[str, torch.Tensor], dict]`: The tensors by name, and the manifest.
    """
    path = Path(path)
    return load_file(str(path)), json.loads(path.with_suffix(".json").read_text())
