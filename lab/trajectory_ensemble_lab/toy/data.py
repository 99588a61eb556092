"""Training examples of the toy task, encoded once with the pipeline's own conditioning and VAE code.

Per training state (a scene, initial, mid-episode or closed-loop; see :func:`.examples.training_examples`) this
keeps:

- the clean conditioning latent, from :func:`~trajectory_ensemble_node.models.cosmos3.conditioning.encode_conditioning`
  with exactly the arguments the serving path uses, so training sees the latent inference will see;
- per expert option (two sides in a bimodal initial state, one otherwise): the normalized waypoints ``[H, 2]`` and
  the VAE latent of the rendered ``H + 1``-frame clip of the robot following them, encoded like upstream policy clips
  (``_prepare_action_video_conditioning`` -> ``_encode_video`` -> ``_remove_action_video_padding_from_latent``).

The encoding is the shared trainer's (:func:`~trajectory_ensemble_lab.training.dataset.encode_states`); this module
renders the toy's states for it. Encoding is the slow part of training on CPU (about 0.2 s per clip), so the result
is cached in a file keyed by the settings that determine it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models import cosmos3
from trajectory_ensemble_node.toy import task
from ..training.dataset import EncodedDataset, LabelledState, concat_datasets, encode_states
from . import examples
from .pipeline import TOY_FORMAT

ToyDataset = EncodedDataset
"""The toy's encoded examples: the shared trainer's data set (every toy example has a clip and a start)."""

__all__ = ["ToyDataset", "build_dataset", "concat_datasets", "encode_clips", "encode_labelled"]


def _cache_key(num_seeds: int, mid_probability: float, pipe: Cosmos3OmniPipeline, closed_loop_states: int = 0,
               recovery_states: int = 0) -> str:
    # The encoded latents depend on the scenes, the renderer and the VAE weights; hash all three.
    digest = hashlib.sha256()
    probe = task.make_scene(0)
    digest.update(np.ascontiguousarray(task.render_clip(probe, task.expert_path(probe, 1))).tobytes())
    for tensor in pipe.vae.state_dict().values():
        digest.update(tensor.detach().cpu().float().numpy().tobytes())
    settings = {
        "seeds": num_seeds,
        "mid": mid_probability,
        "h": task.HORIZON,
        "prompt": task.INSTRUCTION,
        "fps": task.FPS,
        "latents_mean": list(pipe.vae.config.latents_mean),
        "latents_std": list(pipe.vae.config.latents_std),
    }
    if closed_loop_states:
        # Only when set, so the key of the original dataset (and an existing cache of it) stays valid.
        settings["closed_loop_states"] = closed_loop_states
    if recovery_states:
        settings["recovery_states"] = recovery_states
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _labelled(num_seeds: int, mid_probability: float, closed_loop_states: int,
              recovery_states: int) -> list[tuple[task.Scene, list[np.ndarray]]]:
    return [example for seed in range(num_seeds)
            for example in examples.training_examples(seed, mid_probability, closed_loop_states, recovery_states)]


def _starts(labelled: list[tuple[task.Scene, list[np.ndarray]]]) -> torch.Tensor:
    # One row per example, in the order build_dataset stores them (states in order, their options in order).
    rows = [state.robot for state, chunks in labelled for _ in chunks]
    return torch.tensor(np.stack(rows), dtype=torch.float32)


def encode_clips(pipe: Cosmos3OmniPipeline, clips: list[list[np.ndarray]]) -> torch.Tensor:
    """VAE latents of several ``H + 1``-frame toy clips ``[256, 256, 3]``, as upstream encodes a policy clip
    (:func:`~trajectory_ensemble_node.models.cosmos3.conditioning.encode_clips`).

    Returns:
        `torch.Tensor` of shape `[len(clips), C, T, h, w]`, float32.
    """
    return cosmos3.encode_clips(pipe, clips, task.RESOLUTION_TIER, task.HORIZON + 1)


def build_dataset(
    pipe: Cosmos3OmniPipeline,
    num_seeds: int,
    *,
    mid_probability: float = 0.35,
    closed_loop_states: int = 0,
    recovery_states: int = 0,
    cache_dir: Path | None = None,
    batch: int = 8,
    log=print,
) -> ToyDataset:
    """Encode the training states of seeds ``0 .. num_seeds - 1`` (see :func:`.examples.training_examples`).

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline being trained (its tokenizer and VAE are used).
        num_seeds (`int`): Number of training scene seeds.
        mid_probability (`float`): Probability that a seed also contributes a mid-episode state.
        closed_loop_states (`int`): States along an expert detour per seed, up to and at the target, labelled with
            the detour's continuation (0: the original dataset).
        recovery_states (`int`): States per seed near the target, off the expert paths, labelled with the straight
            approach (``examples.recovery_state``; 0: none).
        cache_dir (`Path`, *optional*): Where to keep the encoded dataset between runs.
        batch (`int`): Clips per VAE call.
        log (`Callable[[str], None]`): Progress output.
    """
    if recovery_states:
        # Recovery states are encoded (and cached) as a part of their own, so adding them to a dataset whose other
        # states are cached already costs only their own encoding.
        main = build_dataset(pipe, num_seeds, mid_probability=mid_probability,
                             closed_loop_states=closed_loop_states, cache_dir=cache_dir, batch=batch, log=log)
        labelled = [example for seed in range(num_seeds)
                    for example in examples.recovery_examples(seed, recovery_states)]
        key = _cache_key(num_seeds, 0.0, pipe, 0, recovery_states) + "_recovery"
        return concat_datasets([main, _encode_cached(pipe, labelled, cache_dir, key, batch, log)])
    key = _cache_key(num_seeds, mid_probability, pipe, closed_loop_states)
    return _encode_cached(pipe, lambda: _labelled(num_seeds, mid_probability, closed_loop_states, 0), cache_dir, key,
                          batch, log)


def _encode_cached(pipe: Cosmos3OmniPipeline, labelled, cache_dir: Path | None, key: str, batch: int,
                   log) -> ToyDataset:
    # ``labelled``: the (state, chunks) list, or a function making it (only called when the states must be known).
    make = labelled if callable(labelled) else (lambda: labelled)
    cache = None if cache_dir is None else Path(cache_dir) / f"toy_data_{key}.pt"
    if cache is not None and cache.exists():
        saved = torch.load(cache, weights_only=False)
        log(f"loaded encoded dataset {cache} ({len(saved['options'])} states)")
        if saved.get("starts") is None:
            # Caches written before starts were kept: the states are a pure function of the settings (no
            # rendering or encoding needed), so recompute them rather than re-encode.
            saved["starts"] = _starts(make())
        return ToyDataset(**saved)
    dataset = encode_labelled(pipe, make(), batch=batch, log=log)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(dataset.__dict__, cache)
    return dataset


def encode_labelled(
    pipe: Cosmos3OmniPipeline,
    labelled: list[tuple[task.Scene, list[np.ndarray]]],
    *,
    batch: int = 8,
    log=print,
) -> ToyDataset:
    """Encode labelled states: per state its conditioning latent, per expert chunk of it the chunk and its clip.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline being trained (its tokenizer and VAE are used).
        labelled (`list`): ``(state, chunks)`` pairs, each chunk ``[H, 2]`` planned from ``state.robot`` (1 or 2
            per state: a state with two chunks is a bimodal one).
        batch (`int`): Clips per VAE call.
        log (`Callable[[str], None]`): Progress output.
    """
    return encode_states(pipe, _rendered(labelled), TOY_FORMAT, count=len(labelled), batch=batch, log=log)


def _rendered(labelled: list[tuple[task.Scene, list[np.ndarray]]]) -> Iterator[LabelledState]:
    # Rendered one state at a time, so that only one VAE batch of clips is held at once.
    for state, chunks in labelled:
        yield LabelledState(image=task.render(state), chunks=list(chunks),
                            clips=[task.render_clip(state, waypoints) for waypoints in chunks], start=state.robot)
