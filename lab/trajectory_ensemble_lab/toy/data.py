"""Training examples of the toy task, encoded once with the pipeline's own conditioning and VAE code.

Per training state (a scene, initial, mid-episode or closed-loop; see :func:`task.training_examples`) this keeps:

- the clean conditioning latent, from :func:`~trajectory_ensemble_node.models.cosmos3.conditioning.encode_conditioning`
  with exactly the arguments the serving path uses, so training sees the latent inference will see;
- per expert option (two sides in a bimodal initial state, one otherwise): the normalized waypoints ``[H, 2]`` and
  the VAE latent of the rendered ``H + 1``-frame clip of the robot following them, encoded like upstream policy clips
  (``_prepare_action_video_conditioning`` -> ``_encode_video`` -> ``_remove_action_video_padding_from_latent``).

Encoding is the slow part of training on CPU (about 0.2 s per clip), so the result is cached in a file keyed by the
settings that determine it.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import Branch, encode_conditioning
from trajectory_ensemble_node.toy import action_condition, task




@dataclass
class ToyDataset:
    """Encoded training examples.

    Args:
        branch (`Branch`): Prefix and block template shared by every example (same prompt, same shapes).
        condition (`torch.Tensor` of shape `[S, C, 1, h, w]`): Clean conditioning latent per state.
        clips (`torch.Tensor` of shape `[E, C, T, h, w]`): Clip latent per example (frame 0 = its state's condition).
        actions (`torch.Tensor` of shape `[E, H, 2]`): Expert waypoints per example.
        state_of (`torch.LongTensor` of shape `[E]`): State index of each example.
        options (`list[list[int]]`): Example indexes of each state (1 or 2).
        starts (`torch.Tensor` of shape `[E, 2]`, *optional*): Robot position each example's waypoints start from.
    """

    branch: Branch
    condition: torch.Tensor
    clips: torch.Tensor
    actions: torch.Tensor
    state_of: torch.Tensor
    options: list[list[int]]
    starts: torch.Tensor | None = None

    @property
    def num_states(self) -> int:
        return len(self.options)


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
            for example in task.training_examples(seed, mid_probability, closed_loop_states, recovery_states)]


def _starts(labelled: list[tuple[task.Scene, list[np.ndarray]]]) -> torch.Tensor:
    # One row per example, in the order build_dataset stores them (states in order, their options in order).
    rows = [state.robot for state, chunks in labelled for _ in chunks]
    return torch.tensor(np.stack(rows), dtype=torch.float32)


@torch.no_grad()
def encode_clips(pipe: Cosmos3OmniPipeline, clips: list[list[np.ndarray]]) -> torch.Tensor:
    """VAE latents of several ``H + 1``-frame clips, as upstream encodes a policy clip.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline whose VAE encodes.
        clips (`list[list[np.ndarray]]`): Clips of ``H + 1`` uint8 frames ``[256, 256, 3]``.

    Returns:
        `torch.Tensor` of shape `[len(clips), C, T, h, w]`, float32.
    """
    frames, sizes = [], []
    for clip in clips:
        video, image_size, _, _ = pipe._prepare_action_video_conditioning(
            clip, task.RESOLUTION_TIER, task.HORIZON + 1, device="cpu", dtype=torch.float32
        )
        frames.append(video)
        sizes.append(image_size)
    latents = pipe._encode_video(torch.cat(frames, dim=0)).contiguous().float()
    # Every toy image has the same size, so one padding removal fits all.
    return pipe._remove_action_video_padding_from_latent(latents, sizes[0])


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
    """Encode the training states of seeds ``0 .. num_seeds - 1`` (see :func:`task.training_examples`).

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline being trained (its tokenizer and VAE are used).
        num_seeds (`int`): Number of training scene seeds.
        mid_probability (`float`): Probability that a seed also contributes a mid-episode state.
        closed_loop_states (`int`): States along an expert detour per seed, up to and at the target, labelled with
            the detour's continuation (0: the original dataset).
        recovery_states (`int`): States per seed near the target, off the expert paths, labelled with the straight
            approach (``task.recovery_state``; 0: none).
        cache_dir (`Path`, *optional*): Where to keep the encoded dataset between runs.
        batch (`int`): Clips per VAE call.
        log (`Callable[[str], None]`): Progress output.
    """
    if recovery_states:
        # Recovery states are encoded (and cached) as a part of their own, so adding them to a dataset whose other
        # states are cached already costs only their own encoding.
        main = build_dataset(pipe, num_seeds, mid_probability=mid_probability,
                             closed_loop_states=closed_loop_states, cache_dir=cache_dir, batch=batch, log=log)
        labelled = [example for seed in range(num_seeds) for example in task.recovery_examples(seed, recovery_states)]
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
    if not labelled:
        raise ValueError("encode_labelled needs at least one labelled state, got none")
    device = torch.device("cpu")
    branch: Branch | None = None
    conditions: list[torch.Tensor] = []
    actions: list[np.ndarray] = []
    state_of: list[int] = []
    options: list[list[int]] = []
    pending: list[list[np.ndarray]] = []
    clips: list[torch.Tensor] = []
    started = time.perf_counter()
    states = [state for state, _ in labelled]
    for index, (state, chunks) in enumerate(labelled):
        image = task.render(state)
        conditioning = encode_conditioning(
            pipe,
            prompt=task.INSTRUCTION,
            negative_prompt=None,
            action=action_condition(image),
            fps=task.FPS,
            guidance_scale=task.GUIDANCE_SCALE,
            device=device,
        )
        if branch is None:
            branch = conditioning.branches[0]
        elif not torch.equal(branch.prefix.input_ids, conditioning.branches[0].prefix.input_ids):
            raise RuntimeError("toy prompts must tokenize identically so one prefix serves every example")
        conditions.append(conditioning.x0_vision[:, :, :1].detach().clone())
        options.append([])
        for waypoints in chunks:
            options[-1].append(len(actions))
            actions.append(waypoints)
            state_of.append(index)
            pending.append(task.render_clip(state, waypoints))
        if len(pending) >= batch or index == len(states) - 1:
            clips.append(encode_clips(pipe, pending))
            pending = []
        if (index + 1) % 100 == 0:
            log(f"encoded {index + 1}/{len(states)} states ({time.perf_counter() - started:.0f} s)")
    clip_latents = torch.cat(clips, dim=0)
    condition = torch.cat(conditions, dim=0)
    state_index = torch.tensor(state_of, dtype=torch.long)
    # Frame 0 of a clip must be what inference conditions on; the Wan VAE encodes frame 0 alone in its first causal
    # chunk, so the two agree up to batching round-off. Use the serving path's latent bit for bit.
    drift = (clip_latents[:, :, :1] - condition[state_index]).abs().max().item()
    if drift > 1e-3:
        raise RuntimeError(f"clip frame 0 differs from the conditioning latent by {drift:.2e}")
    clip_latents[:, :, :1] = condition[state_index]
    dataset = ToyDataset(
        branch=branch,
        condition=condition,
        clips=clip_latents,
        actions=torch.tensor(np.stack(actions), dtype=torch.float32),
        state_of=state_index,
        options=options,
        starts=_starts(labelled),
    )
    log(f"encoded {len(states)} states, {len(actions)} examples in {time.perf_counter() - started:.0f} s")
    return dataset


def concat_datasets(datasets: list[ToyDataset]) -> ToyDataset:
    """One dataset holding every state and example of ``datasets``, in order (DAgger's aggregation).

    Every part must share the same prefix (prompt), which one packed forward serves for all examples.
    """
    if not datasets:
        raise ValueError("concat_datasets needs at least one dataset, got none")
    first = datasets[0]
    for part in datasets[1:]:
        if not torch.equal(part.branch.prefix.input_ids, first.branch.prefix.input_ids):
            raise ValueError("datasets to concatenate must share one prompt prefix")
    if any(part.starts is None for part in datasets):
        raise ValueError("datasets to concatenate must all keep their start positions (starts)")
    state_offset, example_offset = 0, 0
    state_of, options = [], []
    for part in datasets:
        state_of.append(part.state_of + state_offset)
        options.extend([[example + example_offset for example in option] for option in part.options])
        state_offset += part.num_states
        example_offset += len(part.actions)
    return ToyDataset(
        branch=first.branch,
        condition=torch.cat([part.condition for part in datasets]),
        clips=torch.cat([part.clips for part in datasets]),
        actions=torch.cat([part.actions for part in datasets]),
        state_of=torch.cat(state_of),
        options=options,
        starts=torch.cat([part.starts for part in datasets]),
    )
