"""The toy pipeline ``train-toy`` trains: its shape, how it is called, and a fresh build or a saved one to start from.

A fresh pipeline is :func:`~trajectory_ensemble_lab.training.pipeline.fresh_pipeline` of :data:`TOY_CONFIG`, its
latents normalized on the observations of 64 training scenes; making it trainable and saving it are the shared
trainer's (:mod:`trajectory_ensemble_lab.training.pipeline`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import TinyCosmos3Config
from trajectory_ensemble_node.toy import load_toy_pipeline, task, toy_pipeline_dir
from ..training import pipeline as training_pipeline
from ..training.dataset import ExampleFormat
from ..training.pipeline import fresh_pipeline, init_action_heads, round_vae_to_half, save_pipeline

__all__ = ["DEFAULT_OUT", "TOY_CONFIG", "TOY_FORMAT", "init_action_heads", "load_for_training", "normalize_latents",
           "round_vae_to_half", "save_pipeline"]

TOY_CONFIG = TinyCosmos3Config(
    hidden_size=192,
    num_layers=3,
    num_heads=6,
    num_kv_heads=2,
    intermediate_size=320,
    rope_axes_dim=(8, 4, 4),
    action_dim=8,
    vae_base_dim=8,
    vae_z_dim=16,
    vae_dim_mult=(1, 2, 2, 2),
    vae_num_res_blocks=1,
    # The serving schedule's shift. The side of the obstacle is decided at mid sigma, where shift 5 leaves only two
    # or three of the 10 UniPC steps (base weights: 70% of candidates collided, 31% at shift 1). Below 1 the grid
    # spends more steps on the low sigmas that settle the detour; on 256 validation scenes the shipped weights at
    # shift 0.7 collided in 6.8% of candidates against 7.9% at 1.0 and 7.5% at 0.5 (toy/README "Serving schedule").
    # Training still emphasizes high sigma (``--sigma-shift``).
    flow_shift=0.7,
)
"""Shape of the shipped toy policy: about 1.9M transformer parameters, about 4.5 MB in fp16 with VAE and tokenizer."""

DEFAULT_OUT = toy_pipeline_dir()
"""Where ``train-toy`` writes by default: the shipped asset directory of the product."""


TOY_FORMAT = ExampleFormat(instruction=task.INSTRUCTION, domain_name=task.DOMAIN_NAME, chunk_size=task.HORIZON,
                           resolution_tier=task.RESOLUTION_TIER, fps=task.FPS, guidance_scale=task.GUIDANCE_SCALE)
"""How the toy policy is called (``toy.action_condition``, ``toy.request_kwargs``), so how its examples are encoded."""


def normalize_latents(pipe: Cosmos3OmniPipeline, num_scenes: int = 64) -> tuple[list[float], list[float]]:
    """The VAE's per-channel latent normalization from the observations of training scenes ``0 .. num_scenes - 1``
    (:func:`~trajectory_ensemble_lab.training.pipeline.normalize_latents`)."""
    return training_pipeline.normalize_latents(pipe, _scene_images(num_scenes), TOY_FORMAT)


def _scene_images(num_scenes: int) -> Iterator[np.ndarray]:
    return (task.render(task.make_scene(task.TRAIN_SEED_BASE + seed)) for seed in range(num_scenes))


def load_for_training(init: Path | None, seed: int) -> Cosmos3OmniPipeline:
    """The pipeline training starts from: the saved pipeline ``init``, or (``None``) a fresh one built from ``seed``.

    Args:
        init (`Path`, *optional*): A saved toy pipeline (e.g. the shipped weights) to continue from.
        seed (`int`): Seed of a fresh build (model init and action heads).
    """
    if init is not None:
        # Continue from a saved pipeline: its VAE (already fp16-rounded) and latent normalization come with it.
        pipe = load_toy_pipeline(path=init)
        pipe.scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config, flow_shift=TOY_CONFIG.flow_shift)
        print(f"initialized from {init}", flush=True)
        return pipe
    return fresh_pipeline(TOY_CONFIG, seed, _scene_images(64), TOY_FORMAT,
                          log=lambda message: print(message, flush=True))
