"""The PushT policy's format and training data: what ``trajectory-ensemble train-pusht`` (:mod:`.train_cli`) trains.

The model is the toy's class, the real ``Cosmos3OmniTransformer`` (:data:`PUSHT_CONFIG`), in the ``pusht`` domain
(domain id 4, raw width 2). It is conditioned on the rendered 96x96 frame, in which the agent is visible (the policy
mode has no proprio input), and on :data:`~trajectory_ensemble_lab.pusht.INSTRUCTION`. At resolution tier 256 the
pipeline pads a 96x96 frame to 256x256 and never scales it up, so the VAE (factor 16) keeps a 6x6 latent: 3x3 vision
tokens per latent frame after the transformer's 2x2 patches.

Examples (:func:`demo_states`): for every control step ``t`` of every demonstration in the bags, the frame at ``t``
and the next :data:`CHUNK` expert actions, the tail padded by repeating the last action as Diffusion Policy does.
Actions are absolute agent targets in env pixels, ``[0, 512]^2``, normalized by a fixed ``minmax`` over ``[0, 512]``
(:func:`action_stats`): the run writes that file as ``action_stats.json`` beside the saved pipeline, in the shape the
node's ``action_stats_file`` reads (``action_stats_method: minmax``). Chunk 16 with 8 executed are Diffusion Policy's
defaults; how many rows run is a serving setting, the chunk is the model's.

The objective, the loop, EMA and saving are the shared trainer's (:mod:`trajectory_ensemble_lab.training`). A target
clip (the 17 frames that followed) is optional, ``--clips``: its VAE encode costs about 1.1 s per example on one CPU
core against about 0.1 s for the conditioning frame, so by default the vision positions train toward the latent mean.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

from trajectory_ensemble_node.models.cosmos3 import (
    Branch,
    StateInput,
    declare_state_input,
    declared_state_input,
    tokenize_action_prompt,
    write_state_input,
)
from trajectory_ensemble_node.normalization import ActionNormalizer
from trajectory_ensemble_node.replay import bags
from ..toy.pipeline import TOY_CONFIG
from ..training import TrainingError
from ..training.dataset import (
    EncodedDataset,
    ExampleFormat,
    LabelledState,
    concat_datasets,
    encode_states,
    with_state_frames,
)
from ..training.pipeline import fresh_pipeline, normalize_latents
from . import INSTRUCTION
from .demos import Episode
from .recording import EPISODES_KEY, RecordedEpisode, read_demo_bag
from .policy_state import AGENT_STATE_NAMES, STATE_RANGES, STATE_SETS, state_values
from .sim import CONTROL_HZ, make_env, render_states
from .state_demos import read_episode
from ..records import write_json

CHUNK = 16
"""Actions per chunk (Diffusion Policy's prediction horizon); it executes 8 of them."""
DOMAIN_NAME = "pusht"
ACTION_WIDTH = 2
ACTION_RANGE = (0.0, 512.0)
"""Where a PushT action (the agent's absolute target, env pixels) lies, per channel."""
RESOLUTION_TIER = 256

PUSHT_FORMAT = ExampleFormat(instruction=INSTRUCTION, domain_name=DOMAIN_NAME, chunk_size=CHUNK,
                             resolution_tier=RESOLUTION_TIER, fps=float(CONTROL_HZ), guidance_scale=1.0)
"""How the PushT policy is called: ``pusht``, chunk 16, tier 256, 10 fps (the env's control rate), no CFG."""

PUSHT_CONFIG = dataclasses.replace(
    TOY_CONFIG, hidden_size=256, num_heads=8, intermediate_size=512,
    # The serving schedule's shift; a setting of the saved scheduler config, to be chosen on validation starts.
    flow_shift=1.0,
)
"""Shape of the PushT policy: the toy's layout, wider (hidden 256 against 192), under 10 MB in fp16 with its VAE and
tokenizer (4 layers of this width would be 10.3 MB)."""

EPISODES_PER_PART = 40
"""State-only episodes encoded (and cached) together: the unit a stopped or sharded encoding resumes by."""
FRAME_BATCH = 32
"""Conditioning frames per VAE call when encoding state-only episodes."""

DEFAULT_BAGS = Path("out/pusht/demos/bags")
DEFAULT_OUT = Path("out/pusht/policy")
STATS_FILE = "action_stats.json"
NORMALIZATION_FRAMES = 64
"""Training frames whose latents set the VAE's per-channel normalization of a fresh pipeline."""


def action_stats() -> dict[str, dict[str, dict[str, list[float]]]]:
    """The PushT action statistics, in the shape the node's ``action_stats_file`` reads (``minmax``, domain entry)."""
    low, high = ACTION_RANGE
    return {DOMAIN_NAME: {"action": {"min": [low] * ACTION_WIDTH, "max": [high] * ACTION_WIDTH}}}


def action_normalizer() -> ActionNormalizer:
    """The node's own normalizer over :func:`action_stats` (so training and serving use one formula)."""
    return ActionNormalizer.from_dict(action_stats(), "minmax", ACTION_WIDTH, DOMAIN_NAME, source="pusht.action_stats")


def state_input(names: Sequence[str] = AGENT_STATE_NAMES) -> StateInput:
    """The policy's state input ``names`` (default: the agent's position), ``minmax`` over each channel's
    :data:`~.policy_state.STATE_RANGES`, declared under the ``pusht`` domain of ``action_stats.json``."""
    low, high = zip(*(STATE_RANGES[name] for name in names))
    return StateInput.from_stats(tuple(names), "minmax", {"min": list(low), "max": list(high)},
                                 domain=DOMAIN_NAME, source="pusht.state_input")


def demo_bags(root: str | Path) -> list[Path]:
    """The demonstration bags under ``root`` (or ``root`` itself when it is one), in name order.

    Raises:
        TrainingError: ``root`` holds no rosbag2 folder.
    """
    root = Path(root)
    if (root / "metadata.yaml").is_file():
        return [root]
    found = sorted(path for path in root.iterdir() if (path / "metadata.yaml").is_file()) if root.is_dir() else []
    if not found:
        raise TrainingError(f"no demonstration bag (a folder with metadata.yaml) at {str(root)!r}")
    return found


def chunk_at(actions: np.ndarray, t: int, chunk: int = CHUNK) -> np.ndarray:
    """Actions ``t .. t + chunk - 1`` of an episode ``[K, width]``, the tail padded with its last action."""
    rows = np.minimum(np.arange(t, t + chunk), len(actions) - 1)
    return actions[rows]


def clip_at(frames: np.ndarray, t: int, chunk: int = CHUNK) -> list[np.ndarray]:
    """The ``chunk + 1`` frames from ``t`` of an episode ``[K + 1, H, W, 3]``, the tail padded with its last frame."""
    return [frames[min(j, len(frames) - 1)] for j in range(t, t + chunk + 1)]


def episode_states(episode: RecordedEpisode, normalizer: ActionNormalizer, *, clips: bool = False,
                   stride: int = 1) -> Iterator[LabelledState]:
    """One example per control step ``t`` (every ``stride``-th) of a demonstration: frame ``t``, the next chunk.

    Args:
        episode (`RecordedEpisode`): Frames ``[K + 1, 96, 96, 3]`` and actions ``[K, 2]`` (env pixels).
        normalizer (`ActionNormalizer`): Maps actions into the model's units (:func:`action_normalizer`).
        clips (`bool`): Also give each example its ``CHUNK + 1``-frame target clip.
        stride (`int`): Control steps between examples.
    """
    normalized = normalizer.normalize(torch.as_tensor(episode.actions, dtype=torch.float64)).numpy()
    for t in range(0, len(episode.actions), stride):
        yield LabelledState(image=episode.frames[t], chunks=[chunk_at(normalized, t).astype(np.float32)],
                            clips=[clip_at(episode.frames, t)] if clips else None)


def demo_states(bag_paths: Sequence[Path], *, clips: bool = False, stride: int = 1) -> Iterator[LabelledState]:
    """:func:`episode_states` of every episode of every bag, read one bag at a time."""
    normalizer = action_normalizer()
    for path in bag_paths:
        for episode in read_demo_bag(path):
            yield from episode_states(episode, normalizer, clips=clips, stride=stride)


def state_episode_states(episode: Episode, normalizer: ActionNormalizer, *, stride: int = 1,
                         state_names: Sequence[str] | None, env=None) -> Iterator[LabelledState]:
    """One example per control step ``t`` (every ``stride``-th) of a state-only episode (``pusht-demos
    --states-only``): the frame gym-pusht draws of state ``t`` (bit for bit the env's observation), the expert's
    labels ``t .. t + 15`` (for a DART episode its clean targets, not the noisy ones sent), and with ``state_names``
    those channels of state ``t`` as ``proprio``.

    Args:
        episode (`Episode`): States ``[K + 1, 5]`` and labels ``[K, 2]`` (env pixels).
        normalizer (`ActionNormalizer`): Maps actions into the model's units (:func:`action_normalizer`).
        stride (`int`): Control steps between examples.
        state_names (`Sequence[str]`, *optional*): The state input's channels (:mod:`.policy_state`); ``None``:
            no state.
        env (*optional*): A ``make_env(pixels=True)`` env to draw with.
    """
    labels = normalizer.normalize(torch.as_tensor(episode.labels, dtype=torch.float64)).numpy()
    steps = list(range(0, len(episode.labels), stride))
    frames = render_states(episode.states[steps], env)
    for frame, t in zip(frames, steps):
        yield LabelledState(image=frame, chunks=[chunk_at(labels, t).astype(np.float32)],
                            proprio=(state_values(state_names, episode.states[t, :2], episode.states[t, 2:5])
                                     if state_names else None))


def state_episode_files(folders: Sequence[Path]) -> list[Path]:
    """The state-only episode files under ``folders``, in name order (start, expert seed).

    Raises:
        TrainingError: a folder holds none.
    """
    files: list[Path] = []
    for folder in folders:
        found = sorted(p for p in Path(folder).glob("pusht_*.npz") if not p.name.endswith(".tmp.npz"))
        if not found:
            raise TrainingError(f"no state-only episode (pusht_*.npz) under {str(folder)!r}")
        files.extend(found)
    return files


def build_state_dataset(pipe: Cosmos3OmniPipeline, files: Sequence[Path], *, stride: int = 1,
                        cache_dir: Path | None = None, shard: tuple[int, int] | None = None,
                        log=print) -> EncodedDataset | None:
    """Encode the state-only episodes ``files``, :data:`EPISODES_PER_PART` at a time, each part cached by content.

    The episodes trained on are :func:`.oracle.training_episodes`': clean successes and every DART episode. With a
    state input declared on ``pipe`` each example carries the agent's position. ``shard = (k, n)`` encodes only the
    parts ``k, k + n, ...`` into the cache and returns ``None``, ``(0, 1)`` included: ``n`` processes fill one cache,
    and a run (``shard=None``) then reads it whole.

    Raises:
        TrainingError: ``stride`` below 1, a bad shard, no file, or a start outside the demonstration range.
    """
    from .oracle import training_episodes
    if stride < 1:
        raise TrainingError(f"stride must be an integer >= 1, got {stride!r}")
    if shard is not None and not (0 <= shard[0] < shard[1]):
        raise TrainingError(f"shard must be K/N with 0 <= K < N, got {shard[0]}/{shard[1]}")
    if not files:
        raise TrainingError("build_state_dataset needs at least one episode file, got none")
    declared = declared_state_input(pipe)
    state_names = declared.names if declared is not None else None
    normalizer, env = action_normalizer(), make_env(pixels=True)
    parts_files = [list(files[i:i + EPISODES_PER_PART]) for i in range(0, len(files), EPISODES_PER_PART)]
    parts, done, started = [], 0, time.perf_counter()
    branch = None  # the pipeline's own prefix and template, put on every part read from the cache
    for index, part_files in enumerate(parts_files):
        if shard is not None and index % shard[1] != shard[0]:
            continue
        cache = content = None
        if cache_dir is not None:
            content = _content_digest(pipe, part_files)
            key = _cache_key(pipe, part_files, False, stride, content=content)
            cache = Path(cache_dir) / "pusht_data" / f"{key}.pt"
        if cache is not None and cache.exists():
            part = EncodedDataset(**torch.load(cache, weights_only=False))
        elif cache is not None and (part := _restated(pipe, part_files, stride, cache.parent, content)) is not None:
            torch.save(part.__dict__, cache)
        else:
            episodes = training_episodes([read_episode(path) for path in part_files])
            states = (s for ep in episodes
                      for s in state_episode_states(ep, normalizer, stride=stride, state_names=state_names, env=env))
            part = encode_states(pipe, states, PUSHT_FORMAT, frame_batch=FRAME_BATCH, log=lambda message: None)
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                torch.save(part.__dict__, cache)
        if cache is not None:
            # A part's latents and labels do not depend on the tokenizer, its prefix does: a part cached for a
            # pipeline with another tokenizer (--prompt-merges) trains under this pipeline's prefix.
            if branch is None:
                branch = _pipeline_branch(pipe, part, part_files[0], normalizer, env, state_names)
            part = dataclasses.replace(part, branch=branch)
        parts.append(part)
        done += part.num_states
        log(f"encoded part {index + 1}/{len(parts_files)}, {done} states ({time.perf_counter() - started:.0f} s)")
    if shard is not None:
        return None
    return parts[0] if len(parts) == 1 else concat_datasets(parts)


def _pipeline_branch(pipe: Cosmos3OmniPipeline, part: EncodedDataset, path: Path, normalizer: ActionNormalizer,
                     env, state_names: Sequence[str] | None) -> Branch:
    """``pipe``'s prefix and block template for PushT examples: ``part``'s own when it was cached under ``pipe``'s
    tokenizer (no frame encoded), else the one ``encode_states`` gives the first state of the episode ``path``."""
    episode = read_episode(path)
    first = next(state_episode_states(episode, normalizer, stride=len(episode.labels), state_names=state_names,
                                      env=env))
    fmt = PUSHT_FORMAT
    ids, _, _, _ = tokenize_action_prompt(pipe, fmt.instruction, None, fmt.action_condition(first.image), fmt.fps)
    if part.branch.prefix.input_ids.reshape(-1).tolist() == list(ids):
        return part.branch
    return encode_states(pipe, [first], fmt, log=lambda message: None).branch


def listed_episodes(bag_paths: Sequence[Path]) -> list[dict[str, object]]:
    """The episodes the bags list in their ``custom_data`` (seeds, steps, route), without reading a frame."""
    return [entry for path in bag_paths
            for entry in json.loads(bags.bag_info(path).custom_data.get(EPISODES_KEY, "[]"))]


def normalization_images(bag_paths: Sequence[Path], count: int = NORMALIZATION_FRAMES) -> list[np.ndarray]:
    """``count`` training frames spread over the bags: frame 0 and the middle frame of the first episodes."""
    images: list[np.ndarray] = []
    for path in bag_paths:
        for episode in read_demo_bag(path):
            images.extend([episode.frames[0], episode.frames[len(episode.frames) // 2]])
            if len(images) >= count:
                return images[:count]
    return images


def _restated(pipe: Cosmos3OmniPipeline, part_files: Sequence[Path], stride: int, cache: Path,
              content: hashlib._Hash) -> EncodedDataset | None:
    """The part ``part_files`` from its cache under another state input of :data:`STATE_SETS`, its state frames
    rebuilt for ``pipe``'s: the frames' latents do not depend on the state input, so a run that changes only the state
    input encodes no frame again. ``None`` when ``pipe`` declares no state input or no such part is cached.
    ``content`` is :func:`_content_digest` of ``part_files``, hashed once by the caller for all the keys."""
    from .oracle import training_episodes

    declared = declared_state_input(pipe)
    if declared is None:
        return None
    others = [cache / f"{_cache_key(pipe, part_files, False, stride, state_input(names), content=content)}.pt"
              for names in STATE_SETS.values() if names != declared.names]
    found = next((path for path in others if path.exists()), None)
    if found is None:
        return None
    part = EncodedDataset(**torch.load(found, weights_only=False))
    episodes = training_episodes([read_episode(path) for path in part_files])
    proprios = [state_values(declared.names, ep.states[t, :2], ep.states[t, 2:5])
                for ep in episodes for t in range(0, len(ep.labels), stride)]
    if len(proprios) != part.num_states:
        raise TrainingError(f"{str(found)!r} holds {part.num_states} states, its episodes give {len(proprios)}")
    return dataclasses.replace(part, condition=with_state_frames(part.condition[:, :, :1], declared, proprios))


def _content_digest(pipe: Cosmos3OmniPipeline, source: Path | Sequence[Path]) -> hashlib._Hash:
    """The running hash of what a part's latents are made from: the data's bytes (a bag folder's files, or episode
    files) and the VAE's weights. :func:`_cache_key` finishes a copy of it, so one part's keys under several settings
    read the files and the VAE once."""
    digest = hashlib.sha256()
    files = sorted(p for p in source.iterdir() if p.is_file()) if isinstance(source, Path) else list(source)
    for file in files:
        digest.update(file.name.encode())
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    for tensor in pipe.vae.state_dict().values():
        digest.update(tensor.detach().cpu().float().numpy().tobytes())
    return digest


def _cache_key(pipe: Cosmos3OmniPipeline, source: Path | Sequence[Path], clips: bool, stride: int,
               declared: StateInput | None | bool = True, *, content: hashlib._Hash | None = None) -> str:
    # Latents depend on the data's bytes and the VAE (``content``, the same hash whoever computed it), the VAE's
    # normalization, the state input (its frame is part of the condition), and how examples are cut.
    digest = (_content_digest(pipe, source) if content is None else content).copy()
    declared = declared_state_input(pipe) if declared is True else declared  # True: the pipeline's own
    settings = {"format": PUSHT_FORMAT.__dict__, "clips": clips, "stride": stride, "stats": action_stats(),
                "latents_mean": list(pipe.vae.config.latents_mean), "latents_std": list(pipe.vae.config.latents_std)}
    if declared is not None:  # absent without one, so the keys of caches written before state inputs still hold
        settings["state_input"] = declared.entry()
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def build_pusht_dataset(pipe: Cosmos3OmniPipeline, bag_paths: Sequence[Path], *, clips: bool = False,
                        stride: int = 1, cache_dir: Path | None = None, log=print) -> EncodedDataset:
    """Encode every demonstration of ``bag_paths`` (:func:`demo_states`), one bag at a time.

    Each bag's encoding is cached in ``cache_dir/pusht_data`` by its content, so a stopped run resumes after the
    last bag it finished and a grown set encodes only its new bags.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline being trained (its tokenizer and VAE are used).
        bag_paths (`Sequence[Path]`): Demonstration bags (:func:`demo_bags`).
        clips (`bool`): Encode each example's target clip too (about 10x the encoding time).
        stride (`int`): Control steps between examples.
        cache_dir (`Path`, *optional*): Where to keep the encoded bags between runs.
        log (`Callable[[str], None]`): Progress output.

    Raises:
        TrainingError: ``stride`` below 1, or no bag.
    """
    if stride < 1:
        raise TrainingError(f"stride must be an integer >= 1, got {stride!r}")
    if not bag_paths:
        raise TrainingError("build_pusht_dataset needs at least one bag, got none")
    total = sum(math.ceil(int(entry["steps"]) / stride) for entry in listed_episodes(bag_paths))
    parts, done, started = [], 0, time.perf_counter()
    for index, bag in enumerate(bag_paths):
        cache = None
        if cache_dir is not None:
            cache = Path(cache_dir) / "pusht_data" / f"{_cache_key(pipe, bag, clips, stride)}.pt"
        if cache is not None and cache.exists():
            part = EncodedDataset(**torch.load(cache, weights_only=False))
        else:
            part = encode_states(pipe, demo_states([bag], clips=clips, stride=stride), PUSHT_FORMAT,
                                 log=lambda message: None)
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                torch.save(part.__dict__, cache)
        parts.append(part)
        done += part.num_states
        if (index + 1) % 20 == 0 or index + 1 == len(bag_paths):
            log(f"encoded {index + 1}/{len(bag_paths)} bags, {done}/{total} states "
                f"({time.perf_counter() - started:.0f} s)")
    return parts[0] if len(parts) == 1 else concat_datasets(parts)


def install_encoder(pipe: Cosmos3OmniPipeline, bundle: Path, images: Sequence[np.ndarray]) -> None:
    """Put the VAE of ``bundle`` (a ``pusht-encoder train`` bundle, :func:`.encoder.save_bundle`) into ``pipe`` and
    normalize its latents per channel on ``images``, as a fresh pipeline's are (``train-pusht --encoder``).

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline to train; its VAE is replaced in place.
        bundle (`Path`): The trained encoder's bundle.
        images (`Sequence[np.ndarray]`): Frames ``[96, 96, 3]`` uint8 for the normalization.

    Raises:
        TrainingError: the bundle's VAE has another shape than ``pipe``'s.
    """
    from trajectory_ensemble_node.catalog import load_pipeline

    trained, _ = load_pipeline(str(bundle), "cpu", "float32")
    ours = {k: tuple(v.shape) for k, v in pipe.vae.state_dict().items()}
    if {k: tuple(v.shape) for k, v in trained.vae.state_dict().items()} != ours:
        raise TrainingError(f"the VAE of {str(bundle)!r} has other weights' shapes than the pipeline's")
    with torch.no_grad():
        pipe.vae.load_state_dict({k: v.to(pipe.vae.dtype) for k, v in trained.vae.state_dict().items()})
        normalize_latents(pipe, list(images), PUSHT_FORMAT)


def state_normalization_images(files: Sequence[Path], count: int = NORMALIZATION_FRAMES) -> list[np.ndarray]:
    """:func:`normalization_images` for state-only episodes: frame 0 and the middle frame of the first episodes."""
    images: list[np.ndarray] = []
    env = make_env(pixels=True)
    for path in files[: -(-count // 2)]:
        states = read_episode(path).states
        images.extend(render_states(states[[0, len(states) // 2]], env))
    return images[:count]


def load_for_training(init: Path | None, seed: int, images: Sequence[np.ndarray], encoder: Path | None = None,
                      state_names: Sequence[str] | None = None, redeclare: bool = False,
                      prompt_merges: int = 0) -> Cosmos3OmniPipeline:
    """The saved pipeline ``init``, or (``None``) a fresh :data:`PUSHT_CONFIG` one from ``seed``, its latents
    normalized on ``images`` (training frames); with ``encoder`` (a ``pusht-encoder train`` bundle), that bundle's VAE
    in place of its own, normalized on ``images`` (the latent cache is keyed by the VAE, so nothing stale is reused);
    with ``state_names``, declaring :func:`state_input` of those channels. A saved ``init`` must declare the same
    one, unless ``redeclare``: then this run's declaration replaces its own (the state frame means something else
    now, and the run retrains what reads it).

    A fresh pipeline's tokenizer learns ``prompt_merges`` merges on the caption (``fresh_pipeline``); a saved
    ``init`` keeps its own.

    Raises:
        TrainingError: ``init`` declares another state input than the one asked for, without ``redeclare``; or
            ``prompt_merges`` with ``init``.
    """
    wanted = state_input(state_names) if state_names else None
    if prompt_merges < 0:
        raise TrainingError(f"--prompt-merges must be >= 0, got {prompt_merges!r}")
    if init is not None and prompt_merges:
        raise TrainingError(f"--prompt-merges {prompt_merges} builds a fresh tokenizer; {str(init)!r} keeps its own "
                            "(drop --init or --prompt-merges)")
    if init is not None:
        from trajectory_ensemble_node.catalog import load_pipeline

        pipe, _ = load_pipeline(str(init), "cpu", "float32")
        print(f"initialized from {init}", flush=True)
        declared = declared_state_input(pipe)
        entries = (declared.entry() if declared is not None else None, wanted.entry() if wanted else None)
        if entries[0] != entries[1]:
            if not redeclare:
                raise TrainingError(f"{str(init)!r} declares the state input {entries[0]}, this run asks for "
                                    f"{entries[1]} (--redeclare-state retrains it with this run's)")
            declare_state_input(pipe, wanted)
            print(f"state input redeclared: {entries[0]} -> {entries[1]}", flush=True)
    else:
        pipe = fresh_pipeline(PUSHT_CONFIG, seed, images, PUSHT_FORMAT,
                              log=lambda message: print(message, flush=True), prompt_merges=prompt_merges)
        declare_state_input(pipe, wanted)
    if encoder is not None:
        install_encoder(pipe, encoder, images)
        print(f"VAE from {encoder}", flush=True)
    return pipe


def write_stats(directory: Path, declared: StateInput | None = None) -> Path:
    """Write :func:`action_stats` as ``directory/action_stats.json`` (the node's ``action_stats_file``), with the
    state input ``declared`` merged into it (the checkpoint's declaration lives in the same file)."""
    path = write_json(directory / STATS_FILE, action_stats())
    write_state_input(directory, declared)
    return path
