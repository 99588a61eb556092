"""The bundled toy policy: a small real Cosmos 3 model trained on a bimodal obstacle task (:mod:`.task`).

The weights under ``assets/toy_policy`` come from the lab's ``train-toy`` (docs/toy-policy.md). Use:
``Cosmos3ActionModel(load_toy_pipeline()).generate(**request_kwargs(render(scene)), spec=..., base_seed=...)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .task import (
    DOMAIN_NAME,
    FPS,
    GUIDANCE_SCALE,
    HELDOUT_SEED_BASE,
    HORIZON,
    INSTRUCTION,
    NUM_INFERENCE_STEPS,
    RESOLUTION_TIER,
    Scene,
    collides,
    final_error,
    heldout_scenes,
    make_scene,
    mode_agreement,
    render,
    replan_scene,
    side,
)

if TYPE_CHECKING:
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline, CosmosActionCondition

TOY_NOTICE = "toy policy for the bundled obstacle task"

ACTION_SETTINGS: dict[str, Any] = {
    "domain_name": DOMAIN_NAME,
    "chunk_size": HORIZON,
    "resolution_tier": RESOLUTION_TIER,
    "num_inference_steps": NUM_INFERENCE_STEPS,
    "guidance_scale": GUIDANCE_SCALE,
    "fps": FPS,
}
"""How the toy policy must be called: ``pusht`` (raw width 2), chunk 8, tier 256, 10 steps, no CFG, 8 fps."""

__all__ = [
    "ACTION_SETTINGS",
    "HELDOUT_SEED_BASE",
    "INSTRUCTION",
    "TOY_NOTICE",
    "Scene",
    "action_condition",
    "collides",
    "final_error",
    "heldout_scenes",
    "load_toy_pipeline",
    "make_scene",
    "mode_agreement",
    "render",
    "replan_scene",
    "request_kwargs",
    "side",
    "toy_pipeline_dir",
]


def toy_pipeline_dir() -> Path:
    """Directory of the shipped toy pipeline (diffusers ``save_pretrained`` layout, safetensors)."""
    return Path(__file__).resolve().parent.parent / "assets" / "toy_policy"


def load_toy_pipeline(
    device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, path: str | Path | None = None
) -> Cosmos3OmniPipeline:
    """Load the shipped toy policy as a ``Cosmos3OmniPipeline``.

    The weights are stored in fp16 to stay small; ``dtype`` (default float32, right for CPU) is what they are cast
    to on load. The safety checker is off: its guardrail model cannot be downloaded here, and the toy never makes
    video for people to see.

    Args:
        device (`str` or `torch.device`): Where to place the modules.
        dtype (`torch.dtype`): Weight dtype after loading.
        path (`str` or `Path`, *optional*): Another pipeline directory (e.g. a fresh ``train-toy`` output).
    """
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

    directory = Path(path) if path is not None else toy_pipeline_dir()
    if not (directory / "model_index.json").exists():
        raise FileNotFoundError(
            f"no toy pipeline at {directory}; run `trajectory-ensemble train-toy --out {directory}`"
        )
    pipe = Cosmos3OmniPipeline.from_pretrained(directory, enable_safety_checker=False, dtype=dtype)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def action_condition(image: np.ndarray) -> CosmosActionCondition:
    """The policy-mode ``CosmosActionCondition`` (``pusht``, chunk 8, tier 256) for one image ``[256, 256, 3]``
    uint8."""
    from ..models.cosmos3 import policy_condition

    return policy_condition(image, chunk_size=HORIZON, domain_name=DOMAIN_NAME, resolution_tier=RESOLUTION_TIER)


def request_kwargs(image: np.ndarray) -> dict[str, Any]:
    """Keyword arguments for ``Cosmos3ActionModel.generate`` / ``submit`` on one observation, minus spec and seed.

    Args:
        image (`np.ndarray` of shape `[256, 256, 3]`): A rendered scene (:func:`render`).
    """
    return {
        "prompt": INSTRUCTION,
        "action": action_condition(image),
        "num_inference_steps": NUM_INFERENCE_STEPS,
        "guidance_scale": GUIDANCE_SCALE,
        "fps": FPS,
    }
