"""Cosmos 3 (diffusers ``Cosmos3OmniPipeline``) adapter: N candidates in one batched denoising path."""

from .adapter import Cosmos3Adapter, Cosmos3Request
from .model import Cosmos3ActionModel, WeightUpdateReport
from .rollout import RolloutError, RolloutResult, RolloutSpec
from .tiny import build_pipeline

__all__ = [
    "Cosmos3ActionModel",
    "Cosmos3Adapter",
    "Cosmos3Request",
    "RolloutError",
    "RolloutResult",
    "RolloutSpec",
    "WeightUpdateReport",
    "build_pipeline",
]
