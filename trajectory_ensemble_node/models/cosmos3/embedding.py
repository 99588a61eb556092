"""The observation embedding tap: what a novelty scorer reads, taken from features the serving pass already has.

The conditioning frame's VAE latent, average-pooled to a ``grid x grid`` map per channel: free (encoded once per
group anyway), one vector per observation whatever N or the capture mode, ``z_dim x grid x grid`` wide. Why this tap
(measured: ``bench/results/novelty_embeddings-toy.md``): docs/safety-and-uncertainty.md. Off unless a request asks for
it (``Cosmos3Request.embedding_grid``).
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import NoveltyScorerError
from ...novelty import NoveltyScorer
from .conditioning import GroupConditioning

EMBEDDING_NAME = "conditioning_latent"
"""The name a novelty scorer file records for this embedding (``novelty.EmbeddingSpec.name``)."""
DEFAULT_EMBEDDING_GRID = 2


def embedding_dim(z_dim: int, grid: int) -> int:
    """Length of the embedding for a VAE with ``z_dim`` latent channels."""
    return int(z_dim) * int(grid) * int(grid)


def observation_embedding(conditioning: GroupConditioning, grid: int = DEFAULT_EMBEDDING_GRID) -> torch.Tensor:
    """The conditioning frame's latent ``[C, h, w]``, average-pooled to ``[C, grid, grid]`` and flattened.

    Args:
        conditioning (`GroupConditioning`): The group's encoded conditioning (latent frame 0 is the observation).
        grid (`int`): Pooling grid (>= 1).

    Returns:
        `torch.Tensor` of shape `[C * grid * grid]`, float32 on CPU.
    """
    frame = conditioning.x0_vision[0, :, 0].detach().to(torch.float32)
    pooled = torch.nn.functional.adaptive_avg_pool2d(frame[None], int(grid))[0]
    return pooled.flatten().cpu()


def check_novelty_scorer(pipe: Any, scorer: NoveltyScorer) -> None:
    """Refuse a scorer fitted on another embedding, or on a model with another latent width.

    Raises:
        NoveltyScorerError: the scorer's embedding name or length does not fit this pipeline (both quoted).
    """
    spec = scorer.embedding
    expected = embedding_dim(int(pipe.vae.config.z_dim), spec.grid)
    if spec.name != EMBEDDING_NAME or spec.dim != expected:
        raise NoveltyScorerError(
            f"the novelty scorer reads {spec.name!r} of length {spec.dim} (grid {spec.grid}), but this model's "
            f"embedding is {EMBEDDING_NAME!r} of length {expected} (z_dim {int(pipe.vae.config.z_dim)} x "
            f"{spec.grid} x {spec.grid}); fit the scorer on this model (trajectory-ensemble calibrate)")
