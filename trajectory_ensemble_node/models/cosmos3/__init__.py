"""Cosmos 3 (diffusers ``Cosmos3OmniPipeline``) adapter: N candidates in one batched denoising path.

What other packages (the node, tools, benchmarks) may use is exported here; the submodules are this package's
internals.
"""

from .adapter import CFG_MODES, Cosmos3Adapter, Cosmos3Request
from .capture import STEP_CAPTURE_MODES, StepCaptureError
from .embodiments import RESOLUTION_TIERS, VIEW_POINTS, embodiment_widths
from .loading import PICKLE_SUFFIXES, load_pipeline, resolve_device, resolve_dtype
from .model import Cosmos3ActionModel, WeightUpdateReport
from .rollout import RolloutError, RolloutResult, RolloutSpec
from .tiny import UNTRAINED_NOTICE, build_pipeline

__all__ = [
    "CFG_MODES",
    "PICKLE_SUFFIXES",
    "RESOLUTION_TIERS",
    "STEP_CAPTURE_MODES",
    "UNTRAINED_NOTICE",
    "VIEW_POINTS",
    "Cosmos3ActionModel",
    "Cosmos3Adapter",
    "Cosmos3Request",
    "RolloutError",
    "RolloutResult",
    "RolloutSpec",
    "StepCaptureError",
    "WeightUpdateReport",
    "build_pipeline",
    "embodiment_widths",
    "load_pipeline",
    "resolve_device",
    "resolve_dtype",
]
