"""Training examples, encoded once with the serving path's own conditioning and VAE code.

A task hands the trainer :class:`LabelledState` s: a conditioning frame ``[H, W, 3]`` uint8, and per expert option
of that frame an action chunk ``[chunk, width]`` in the model's normalized units, with an optional target clip (the
``chunk + 1`` frames the robot would see while following it). Per state this keeps:

- the clean conditioning latent, from :func:`~trajectory_ensemble_node.models.cosmos3.conditioning.encode_conditioning`
  with exactly the arguments the serving path uses (:class:`ExampleFormat`), so training sees the latent inference
  will see;
- per option: its chunk and, when the state has clips, the VAE latent of its clip, encoded by the serving path's
  :func:`~trajectory_ensemble_node.models.cosmos3.conditioning.encode_clips` as upstream encodes a policy clip.

One packed forward serves a whole batch under one text prefix, so every state carries the same instruction.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline, CosmosActionCondition

from trajectory_ensemble_node.models.cosmos3 import (
    Branch,
    build_state_frame,
    declared_state_input,
    encode_clips,
    encode_conditioning,
)

from . import TrainingError

Log = Callable[[str], None]


@dataclass(frozen=True)
class ExampleFormat:
    """How the policy is called, which fixes how its training examples are encoded.

    Args:
        instruction (`str`): The prompt every example carries.
        domain_name (`str`): Cosmos 3 embodiment (``pusht``: domain id 4, raw width 2).
        chunk_size (`int`): Actions per chunk; the clip has ``chunk_size + 1`` frames.
        resolution_tier (`int`): Upstream resolution tier (256: a 96x96 frame is padded, never scaled up).
        fps (`float`): Frame rate, in the caption and the mRoPE temporal modulation.
        guidance_scale (`float`): CFG scale the policy is served with (1.0: no uncond branch).
    """

    instruction: str
    domain_name: str
    chunk_size: int
    resolution_tier: int
    fps: float
    guidance_scale: float = 1.0

    def action_condition(self, image: np.ndarray) -> CosmosActionCondition:
        """The policy-mode condition for one frame ``[H, W, 3]`` uint8, as the serving path builds it."""
        return CosmosActionCondition(mode="policy", chunk_size=self.chunk_size, domain_name=self.domain_name,
                                     resolution_tier=self.resolution_tier, image=image)


@dataclass
class LabelledState:
    """One conditioning frame and what the expert did from it.

    Args:
        image (`np.ndarray` of shape `[H, W, 3]`, uint8): The conditioning frame.
        chunks (`list[np.ndarray]`): Per expert option, the chunk ``[chunk, width]`` in normalized units.
        clips (`list[list[np.ndarray]]`, *optional*): Per option, the ``chunk + 1`` frames following it (frame 0 =
            ``image``); ``None`` trains without the vision term.
        start (`np.ndarray` of shape `[width]`, *optional*): Where the chunk starts from (the toy's retiming needs it).
        proprio (`np.ndarray` of shape `[S]`, *optional*): The robot's state at the frame, in the order and units of
            the state input the pipeline declares (``declare_state_input``); needed exactly when it declares one.
    """

    image: np.ndarray
    chunks: list[np.ndarray]
    clips: list[list[np.ndarray]] | None = None
    start: np.ndarray | None = None
    proprio: np.ndarray | None = None


@dataclass
class EncodedDataset:
    """Encoded training examples.

    Args:
        branch (`Branch`): Prefix and block template shared by every example (same prompt, same shapes).
        condition (`torch.Tensor` of shape `[S, C, K, h, w]`): Clean conditioning latents per state: its frame
            (K = 1), and the state frame after it (K = 2) when the pipeline declares a state input.
        clips (`torch.Tensor` of shape `[E, C, T, h, w]`, *optional*): Clip latent per example (frame 0 = its
            state's condition); ``None``: the data set has no target clips and trains the actions alone.
        actions (`torch.Tensor` of shape `[E, chunk, width]`): Expert chunk per example, normalized units.
        state_of (`torch.LongTensor` of shape `[E]`): State index of each example.
        options (`list[list[int]]`): Example indexes of each state (several for a state with several expert options).
        starts (`torch.Tensor` of shape `[E, width]`, *optional*): Where each example's chunk starts from.
    """

    branch: Branch
    condition: torch.Tensor
    clips: torch.Tensor | None
    actions: torch.Tensor
    state_of: torch.Tensor
    options: list[list[int]]
    starts: torch.Tensor | None = None

    @property
    def num_states(self) -> int:
        return len(self.options)


@torch.no_grad()
def condition_latents(pipe: Cosmos3OmniPipeline, example_format: ExampleFormat,
                      frames: list[tuple[np.ndarray, np.ndarray | None]], state_input=None) -> torch.Tensor:
    """The clean conditioning latents of several frames in one VAE call, as ``encode_conditioning`` builds them.

    The serving path's own encoder (``encode_clips``, which ``encode_conditioning`` calls with one clip, here with
    one-frame clips) and, with a state input, the same ``StateInput.normalize`` and ``build_state_frame``; only the
    frames share one VAE call.

    Args:
        pipe (`Cosmos3OmniPipeline`): Its VAE encodes.
        example_format (`ExampleFormat`): How the policy is called (its resolution tier).
        frames (`list[tuple[np.ndarray, np.ndarray | None]]`): Per state, its frame ``[H, W, 3]`` uint8 (one size
            for all) and its ``proprio`` (``None`` without a state input).
        state_input (`StateInput`, *optional*): The pipeline's declared state input.

    Returns:
        `torch.Tensor` of shape `[len(frames), C, K, h, w]`, float32: K = 1 (the frame), 2 with a state input.
    """
    latents = encode_clips(pipe, [[image] for image, _ in frames], example_format.resolution_tier, 1)[:, :, :1]
    if state_input is None:
        return latents
    return with_state_frames(latents, state_input, [proprio for _, proprio in frames])


def with_state_frames(latents: torch.Tensor, state_input, proprios) -> torch.Tensor:
    """Frame latents ``[E, C, 1, h, w]`` with each example's state frame appended as latent frame 1
    (``StateInput.normalize`` and ``build_state_frame``, as ``encode_conditioning`` builds it).

    Returns:
        `torch.Tensor` of shape `[E, C, 2, h, w]`.
    """
    states = []
    for proprio in proprios:
        normalized, _ = state_input.normalize(state_input.check(proprio))
        states.append(build_state_frame(normalized.float(), latents.shape[1], latents.shape[3], latents.shape[4]))
    return torch.cat([latents, torch.stack(states)[:, :, None]], dim=2)


def encode_states(
    pipe: Cosmos3OmniPipeline,
    states: Iterable[LabelledState],
    example_format: ExampleFormat,
    *,
    count: int | None = None,
    batch: int = 8,
    frame_batch: int = 1,
    log: Log = print,
) -> EncodedDataset:
    """Encode labelled states: per state its conditioning latent, per option its chunk and (if given) its clip.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline being trained (its tokenizer and VAE are used).
        states (`Iterable[LabelledState]`): The states, read once (a generator keeps memory to one clip batch).
        example_format (`ExampleFormat`): How the policy is called.
        count (`int`, *optional*): How many states ``states`` yields, for progress lines only.
        batch (`int`): Clips per VAE call.
        frame_batch (`int`): Conditioning frames per VAE call. 1 encodes each state with ``encode_conditioning``
            itself; more encodes frames together through the same upstream calls (:func:`condition_latents`),
            about twice as fast on a CPU, and checks state 0 against ``encode_conditioning`` (the VAE's batched
            convolutions may differ from a single frame's in the last bits).
        log (`Callable[[str], None]`): Progress output.

    A pipeline that declares a state input (``declare_state_input``) gets each state's ``proprio`` built into its
    state frame by the serving path's own ``encode_conditioning``.

    Raises:
        TrainingError: no states, states with and without clips mixed, chunks of another shape, or prompts that do
            not share one prefix.
        MissingObservationKeyError, ObservationArrayError, NonFiniteStateError: with a state input, a state's
            ``proprio`` is missing, of the wrong width or not finite.
    """
    device = torch.device("cpu")
    fmt = example_format
    state_input = declared_state_input(pipe)
    branch: Branch | None = None
    conditions: list[torch.Tensor] = []
    actions: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    state_of: list[int] = []
    options: list[list[int]] = []
    pending: list[list[np.ndarray]] = []
    frames_pending: list[tuple[np.ndarray, np.ndarray | None]] = []
    if frame_batch < 1:
        raise TrainingError(f"frame_batch must be an integer >= 1, got {frame_batch!r}")
    clips: list[torch.Tensor] = []
    with_clips: bool | None = None
    started = time.perf_counter()
    index = -1
    iterator = iter(states)
    state = next(iterator, None)
    while state is not None:
        index += 1
        following = next(iterator, None)
        has_clips = state.clips is not None
        if with_clips is None:
            with_clips = has_clips
        elif has_clips != with_clips:
            raise TrainingError(f"state {index} {'has' if has_clips else 'lacks'} target clips, unlike state 0: "
                                "a data set trains with clips for every example or for none")
        if branch is None or frame_batch == 1:
            conditioning = encode_conditioning(
                pipe, prompt=fmt.instruction, negative_prompt=None, action=fmt.action_condition(state.image),
                fps=fmt.fps, guidance_scale=fmt.guidance_scale, device=device, state_input=state_input,
                state=state.proprio,
            )
            if branch is None:
                branch = conditioning.branches[0]
                first_shape = np.shape(state.image)
                clean_frames = int(conditioning.vision_mask.sum().item())  # the image, and the state frame if any
                reference = conditioning.x0_vision[:, :, :clean_frames].detach().clone()
            elif not torch.equal(branch.prefix.input_ids, conditioning.branches[0].prefix.input_ids):
                raise TrainingError(f"state {index} tokenizes to another prefix than state 0: one packed forward "
                                    "serves every example under one prefix, so the frames must share one size bin")
            if frame_batch == 1:
                conditions.append(conditioning.x0_vision[:, :, :clean_frames].detach().clone())
        if frame_batch > 1:
            if np.shape(state.image) != first_shape:
                raise TrainingError(f"state {index} has a frame of shape {np.shape(state.image)}, state 0 one of "
                                    f"{first_shape}: frames encoded together must share one size")
            frames_pending.append((state.image, state.proprio))
            if len(frames_pending) >= frame_batch or following is None:
                conditions.append(condition_latents(pipe, fmt, frames_pending, state_input))
                frames_pending = []
        options.append([])
        for k, chunk in enumerate(state.chunks):
            if np.shape(chunk)[0] != fmt.chunk_size:
                raise TrainingError(f"state {index} option {k}: a chunk of {fmt.chunk_size} actions is needed, got "
                                    f"shape {np.shape(chunk)}")
            options[-1].append(len(actions))
            actions.append(chunk)
            state_of.append(index)
            if state.start is not None:
                starts.append(state.start)
            if has_clips:
                pending.append(state.clips[k])
        if pending and (len(pending) >= batch or following is None):
            try:
                clips.append(encode_clips(pipe, pending, fmt.resolution_tier, fmt.chunk_size + 1))
            except ValueError as error:  # clips of several frame sizes: named, as the trainer's refusals are
                raise TrainingError(str(error)) from error
            pending = []
        if (index + 1) % 100 == 0:
            total = f"/{count}" if count is not None else ""
            log(f"encoded {index + 1}{total} states ({time.perf_counter() - started:.0f} s)")
        state = following
    if branch is None:
        raise TrainingError("encoding needs at least one labelled state, got none")
    if starts and len(starts) != len(actions):
        raise TrainingError(f"every state or none must give its start, got {len(starts)} starts for "
                            f"{len(actions)} examples")
    condition = torch.cat(conditions, dim=0)
    if frame_batch > 1:
        drift = (condition[:1] - reference).abs().max().item()
        if drift > 1e-3:
            raise TrainingError(f"the batched conditioning latent of state 0 differs from encode_conditioning's by "
                                f"{drift:.2e}")
    state_index = torch.tensor(state_of, dtype=torch.long)
    clip_latents = None
    if with_clips:
        clip_latents = torch.cat(clips, dim=0)
        # Frame 0 of a clip must be what inference conditions on; the Wan VAE encodes frame 0 alone in its first
        # causal chunk, so the two agree up to batching round-off. Use the serving path's latent bit for bit.
        drift = (clip_latents[:, :, :1] - condition[state_index][:, :, :1]).abs().max().item()
        if drift > 1e-3:
            raise TrainingError(f"clip frame 0 differs from the conditioning latent by {drift:.2e}")
        clip_latents[:, :, : condition.shape[2]] = condition[state_index]
    dataset = EncodedDataset(
        branch=branch,
        condition=condition,
        clips=clip_latents,
        actions=torch.tensor(np.stack(actions), dtype=torch.float32),
        state_of=state_index,
        options=options,
        starts=torch.tensor(np.stack(starts), dtype=torch.float32) if starts else None,
    )
    log(f"encoded {index + 1} states, {len(actions)} examples in {time.perf_counter() - started:.0f} s")
    return dataset


def concat_datasets(datasets: list[EncodedDataset]) -> EncodedDataset:
    """One dataset holding every state and example of ``datasets``, in order (DAgger's aggregation).

    Every part must share the same prefix (prompt), which one packed forward serves for all examples.

    Raises:
        TrainingError: no parts, parts under different prompts, or parts that disagree on having starts or clips.
    """
    if not datasets:
        raise TrainingError("concat_datasets needs at least one dataset, got none")
    first = datasets[0]
    for part in datasets[1:]:
        if not torch.equal(part.branch.prefix.input_ids, first.branch.prefix.input_ids):
            raise TrainingError("datasets to concatenate must share one prompt prefix")
    if len({part.starts is None for part in datasets}) > 1:
        raise TrainingError("datasets to concatenate must all keep their start positions (starts), or all lack them")
    if len({part.clips is None for part in datasets}) > 1:
        raise TrainingError("datasets to concatenate must all have target clips, or all lack them")
    state_offset, example_offset = 0, 0
    state_of, options = [], []
    for part in datasets:
        state_of.append(part.state_of + state_offset)
        options.extend([[example + example_offset for example in option] for option in part.options])
        state_offset += part.num_states
        example_offset += len(part.actions)
    return EncodedDataset(
        branch=first.branch,
        condition=torch.cat([part.condition for part in datasets]),
        clips=None if first.clips is None else torch.cat([part.clips for part in datasets]),
        actions=torch.cat([part.actions for part in datasets]),
        state_of=torch.cat(state_of),
        options=options,
        starts=None if first.starts is None else torch.cat([part.starts for part in datasets]),
    )
