"""Shared helpers for the Cosmos 3 tests: tiny real pipelines, observations, and cached upstream references."""

from __future__ import annotations

import functools

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition

from trajectory_ensemble_node.contract import CandidateTrajectorySpec
from trajectory_ensemble_node.models.cosmos3 import build_pipeline

PROMPT = "put the red block in the bowl"
STEPS = 3
CHUNK = 8
FPS = 15.0


def image(seed: int = 1, height: int = 240, width: int = 320) -> np.ndarray:
    """A random uint8 RGB observation (not square, so the tier's aspect-ratio bin and padding are exercised)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator).numpy()


def policy(domain: str = "droid_lerobot", chunk: int = CHUNK, seed: int = 1) -> CosmosActionCondition:
    return CosmosActionCondition(
        mode="policy", chunk_size=chunk, domain_name=domain, resolution_tier=256, image=image(seed)
    )


def candidate_spec(count: int) -> CandidateTrajectorySpec:
    """``count`` candidates, all returned, reduced by ``mean`` (the plain path, reducer ``none``, for one)."""
    return CandidateTrajectorySpec(count=count, reducer="mean" if count > 1 else "none", return_candidates=True)


@functools.lru_cache(maxsize=None)
def reference_pipe():
    """An untouched upstream pipeline (no processor of ours installed), with the same weights as ``fresh_pipe``."""
    return build_pipeline("tiny", seed=0)


def fresh_pipe():
    return build_pipeline("tiny", seed=0)


_REFERENCES: dict[tuple, torch.Tensor] = {}


def upstream_action(
    seed: int,
    *,
    guidance_scale: float,
    action: CosmosActionCondition | None = None,
    prompt: str = PROMPT,
    steps: int = STEPS,
    key: tuple = (),
    pipe=None,
) -> torch.Tensor:
    """``Cosmos3OmniPipeline.__call__(..., generator=Generator().manual_seed(seed)).action[0]``, memoized by key."""
    cache_key = (seed, guidance_scale, prompt, steps, key, id(pipe))
    if cache_key not in _REFERENCES:
        pipe = pipe or reference_pipe()
        out = pipe(
            prompt=prompt,
            action=action if action is not None else policy(),
            num_inference_steps=steps,
            guidance_scale=guidance_scale,
            fps=FPS,
            generator=torch.Generator().manual_seed(seed),
            output_type="latent",
            enable_safety_check=False,
        )
        _REFERENCES[cache_key] = out.action[0]
    return _REFERENCES[cache_key]


def within_rule(candidate: torch.Tensor, reference: torch.Tensor) -> bool:
    """The declared equivalence rule: max |diff| <= 1e-3 * max(1, max |reference|)."""
    tolerance = 1e-3 * max(1.0, reference.abs().max().item())
    return (candidate - reference).abs().max().item() <= tolerance
