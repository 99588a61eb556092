"""Candidate-invariant conditioning, encoded once per group, and per-candidate initial noise.

Reproduces ``Cosmos3OmniPipeline.__call__`` / ``prepare_latents`` for one action request with the pipeline's own
segment builders, computed once per group and encoding only the conditioning frame (the causal Wan VAE gives the same
latent frame 0; docs/python-api.md, "Encoded once"). A declared state input adds latent frame 1 (docs/state.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    _ACTION_RESOLUTION_BINS,
    _EMBODIMENT_TO_DOMAIN_ID,
    Cosmos3OmniPipeline,
    CosmosActionCondition,
)
from diffusers.utils.torch_utils import randn_tensor
from diffusers.video_processor import VideoProcessor

from ...errors import InvalidSpecError, UnsupportedModeError
from .packing import BlockTemplate, Branch, PrefixSegment
from .state import STATE_FRAME_INDEX, StateInput, build_state_frame

# Modes whose public output is an action chunk (upstream returns ``action=None`` for forward_dynamics).
ACTION_MODES = ("policy", "inverse_dynamics")

MIN_IMAGE_SIDE = 16
"""Fewest pixels on either side of an image the model can take: the spatial factor of every Cosmos 3 VAE.

Measured, not assumed: the pipeline's video processor rounds each side down to a multiple of its
``vae_scale_factor`` before it resizes, so a side under it becomes 0 and the encode fails (``RuntimeError: Input and
output sizes should be greater than 0``). On the tiny and the toy pipelines, 1x1, 15x15, 2x256, 256x2 and 8x256
frames failed that way as ``ENGINE_FAILURE``; 16x16, 16x256, 17x17, 16x2048, 2048x16 and 16x16000 were served. No
aspect-ratio bound is needed: the resolution tier's bins scale any aspect down into the nearest canvas and pad it.
"""


def policy_condition(image: Any, *, chunk_size: int, domain_name: str, resolution_tier: int,
                     view_point: str = "ego_view") -> CosmosActionCondition:
    """The policy-mode condition of one observation frame: the one place the product builds a
    ``CosmosActionCondition``, so a request means the same on every face (the serving layer's request path, the
    toy task and calibration all call this).

    Args:
        image (`np.ndarray` of shape `[H, W, 3]`, uint8): The frame.
        chunk_size (`int`): Actions per chunk. domain_name (`str`): The embodiment.
        resolution_tier (`int`): The conditioning canvas tier. view_point (`str`): The camera view point.
    """
    return CosmosActionCondition(mode="policy", chunk_size=chunk_size, domain_name=domain_name,
                                 resolution_tier=resolution_tier, image=image, view_point=view_point)


def min_image_side(pipe: Any) -> int:
    """The fewest pixels a side of an image may have for ``pipe``: its video processor's ``vae_scale_factor``.

    Args:
        pipe (`Any`): The loaded pipeline; one without a video processor gets :data:`MIN_IMAGE_SIDE`.
    """
    factor = getattr(getattr(getattr(pipe, "video_processor", None), "config", None), "vae_scale_factor", None)
    return max(1, int(factor)) if factor else MIN_IMAGE_SIDE


def token_counter(pipe: Any) -> Callable[[str], int] | None:
    """A function counting an instruction's tokens with the pipeline's text tokenizer, or ``None`` if it has none.

    Args:
        pipe (`Any`): The loaded pipeline (``text_tokenizer``, else ``tokenizer``).
    """
    tokenizer = getattr(pipe, "text_tokenizer", None) or getattr(pipe, "tokenizer", None)
    if tokenizer is None:
        return None

    def count(text: str) -> int:
        # No special tokens and no chat template: the limit is on what the sender wrote.
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


@dataclass(frozen=True)
class GroupConditioning:
    """What every candidate of one request shares.

    Args:
        branches (`tuple[Branch, ...]`): ``(cond,)`` or ``(cond, uncond)`` when classifier-free guidance is on.
        cond_input_ids (`list[int]`), uncond_input_ids (`list[int]`): Token ids of both CFG branches.
        x0_vision (`torch.Tensor` of shape `[1, C, T, H, W]`): Clean conditioning latents (float32).
        vision_mask (`torch.Tensor` of shape `[T, 1, 1]`): 1 on conditioned latent frames.
        x0_action (`torch.Tensor` of shape `[A, D]`): Clean action tokens (zeros unless conditioned).
        action_mask (`torch.Tensor` of shape `[A, 1]`): 1 on conditioned action tokens.
        raw_action_dim (`int`): The embodiment's unpadded action width.
        height (`int`), width (`int`): Conditioning canvas in pixels.
        encode_ms (`float`): Prompt + VAE encode time.
        state_clipped (`int`, *optional*): With a state input, how many state channels were clipped to the
            statistics' range; ``None`` without one.
    """

    branches: tuple[Branch, ...]
    cond_input_ids: list[int]
    uncond_input_ids: list[int]
    x0_vision: torch.Tensor
    vision_mask: torch.Tensor
    x0_action: torch.Tensor
    action_mask: torch.Tensor
    raw_action_dim: int
    height: int
    width: int
    encode_ms: float
    state_clipped: int | None = None

    @property
    def has_noisy_action(self) -> bool:
        return bool(self.action_mask.sum() < self.action_mask.numel())

    @property
    def has_noisy_vision(self) -> bool:
        return bool(self.vision_mask.sum() < self.vision_mask.numel())


def check_action_request(pipe: Cosmos3OmniPipeline, action: CosmosActionCondition) -> None:
    """Refuse, before any model work, an action request this adapter cannot serve correctly.

    Raises:
        UnsupportedModeError: the mode has no action output or the checkpoint has no action head.
        InvalidSpecError: the action condition is malformed for this checkpoint.
    """
    if not isinstance(action, CosmosActionCondition):
        raise InvalidSpecError(f"`action` must be a diffusers CosmosActionCondition, got {type(action).__name__}.")
    if not getattr(pipe.transformer.config, "action_gen", False):
        raise UnsupportedModeError("This checkpoint has no action head (transformer.config.action_gen is False).")
    if action.mode not in ACTION_MODES:
        raise UnsupportedModeError(
            f"action mode {action.mode!r} has no action output to serve (upstream returns action=None for it); "
            f"candidate ensembling supports {list(ACTION_MODES)}."
        )
    if action.raw_action_dim > pipe.transformer.config.action_dim:
        raise InvalidSpecError(
            f"raw_action_dim={action.raw_action_dim} of domain {action.domain_name!r} exceeds the checkpoint's "
            f"action_dim={pipe.transformer.config.action_dim}."
        )


def check_state_slot(pipe: Cosmos3OmniPipeline, action: CosmosActionCondition) -> None:
    """Refuse, before any model work, a request whose clip has no room for the state frame.

    Raises:
        UnsupportedModeError: not ``policy`` mode (the state frame extends policy mode only).
        InvalidSpecError: the clip has a single latent frame (``chunk_size`` below the VAE's temporal factor).
    """
    if action.mode != "policy":
        raise UnsupportedModeError(f"a model that takes the robot's state serves policy mode only, got mode "
                                   f"{action.mode!r}")
    temporal = int(pipe.vae.config.scale_factor_temporal)
    latent_frames = action.chunk_size // temporal + 1
    if latent_frames <= STATE_FRAME_INDEX:
        raise InvalidSpecError(f"chunk_size={action.chunk_size} gives {latent_frames} latent frame(s); the state "
                               f"frame needs latent frame {STATE_FRAME_INDEX} (chunk_size >= {temporal})")


def encode_conditioning(
    pipe: Cosmos3OmniPipeline,
    *,
    prompt: str,
    negative_prompt: str | None,
    action: CosmosActionCondition,
    fps: float,
    guidance_scale: float,
    device: torch.device,
    use_system_prompt: bool | None = None,
    encode_only_used_frames: bool = True,
    state_input: StateInput | None = None,
    state: Sequence[float] | None = None,
) -> GroupConditioning:
    """Tokenize the prompt and encode the conditioning image once for a whole candidate group.

    Args:
        pipe (`Cosmos3OmniPipeline`): Any Cosmos 3 omni pipeline, tiny or real.
        prompt (`str`): Task instruction (becomes the structured action JSON caption, as upstream).
        negative_prompt (`str`, *optional*): Unconditional prompt; ``None`` means ``""`` as upstream.
        action (`CosmosActionCondition`): The upstream action condition.
        fps (`float`): Frame rate, used in the caption and the mRoPE temporal modulation.
        guidance_scale (`float`): CFG scale; the uncond branch exists only when it is not 1.0.
        device (`torch.device`): Execution device.
        use_system_prompt (`bool`, *optional*): As upstream; ``None`` uses the pipeline default.
        encode_only_used_frames (`bool`): In policy mode, VAE-encode only the conditioning frame (bit-identical).
        state_input (`StateInput`, *optional*): The checkpoint's declared state input; ``None`` (no declaration):
            ``state`` is not read and nothing changes.
        state (`Sequence[float]` of length `state_input.width`, *optional*): The robot's state in the declared
            order and units; latent frame ``STATE_FRAME_INDEX`` becomes its clean frame (``build_state_frame``).

    Returns:
        `GroupConditioning`

    Raises:
        MissingObservationKeyError, ObservationArrayError, NonFiniteStateError: with a state input, a missing,
            malformed or non-finite ``state`` (:meth:`StateInput.check`).
    """
    check_action_request(pipe, action)
    if state_input is not None:
        check_state_slot(pipe, action)
        state = state_input.check(state)
    started = time.perf_counter()
    num_frames = action.chunk_size + 1
    clip = [action.image] if action.image is not None else action.video
    cond_ids, uncond_ids, height, width = tokenize_action_prompt(pipe, prompt, negative_prompt, action, fps,
                                                                 use_system_prompt)

    sampling_dtype = torch.float32
    temporal = int(pipe.vae.config.scale_factor_temporal)
    latent_frames = (num_frames - 1) // temporal + 1
    only_first = encode_only_used_frames and action.mode == "policy"
    x0 = encode_clips(pipe, [clip], action.resolution_tier, 1 if only_first else num_frames, device=device)
    if only_first:
        # Frames after 0 are multiplied by a zero mask upstream; zeros keep the same shape and the same bits.
        full = x0.new_zeros((x0.shape[0], x0.shape[1], latent_frames, x0.shape[3], x0.shape[4]))
        full[:, :, :1] = x0[:, :, :1]
        x0 = full

    state_clipped = None
    if state_input is not None:
        normalized, state_clipped = state_input.normalize(state)
        frame = build_state_frame(normalized.to(device=x0.device, dtype=x0.dtype), x0.shape[1], x0.shape[3],
                                  x0.shape[4])
        x0[:, :, STATE_FRAME_INDEX] = frame
    if action.mode == "policy":
        vision_condition_frames = [0] if state_input is None else [0, STATE_FRAME_INDEX]
    else:  # inverse_dynamics: every latent frame of the given clip is conditioning
        vision_condition_frames = list(range(latent_frames))
    vision_mask = torch.zeros((x0.shape[2], 1, 1), device=device, dtype=sampling_dtype)
    for index in vision_condition_frames:
        if 0 <= index < vision_mask.shape[0]:
            vision_mask[index, 0, 0] = 1.0

    action_dim = pipe.transformer.config.action_dim
    x0_action = torch.zeros(action.chunk_size, action_dim, device=device, dtype=sampling_dtype)
    action_mask = torch.zeros((action.chunk_size, 1), device=device, dtype=sampling_dtype)
    domain_id = torch.tensor([_EMBODIMENT_TO_DOMAIN_ID[action.domain_name]], dtype=torch.long, device=device)

    vision_condition_indexes = [int(i) for i in torch.nonzero(vision_mask[:, 0, 0] > 0).flatten().tolist()]
    meta_vision = torch.empty(x0.shape, device="meta")
    meta_action = torch.empty(x0_action.shape, device="meta")
    branch_ids = [cond_ids] + ([uncond_ids] if guidance_scale != 1.0 else [])
    branches = tuple(
        _build_branch(pipe, ids, meta_vision, meta_action, vision_condition_indexes, domain_id, fps, device)
        for ids in branch_ids
    )
    return GroupConditioning(
        branches=branches,
        cond_input_ids=list(cond_ids),
        uncond_input_ids=list(uncond_ids),
        x0_vision=x0,
        vision_mask=vision_mask,
        x0_action=x0_action,
        action_mask=action_mask,
        raw_action_dim=int(action.raw_action_dim),
        height=int(height),
        width=int(width),
        encode_ms=(time.perf_counter() - started) * 1e3,
        state_clipped=state_clipped,
    )


def tokenize_action_prompt(
    pipe: Cosmos3OmniPipeline,
    prompt: str,
    negative_prompt: str | None,
    action: CosmosActionCondition,
    fps: float,
    use_system_prompt: bool | None = None,
) -> tuple[list[int], list[int], int, int]:
    """The token ids of both CFG branches' captions for ``action``, as upstream builds them, and the conditioning
    canvas they name; no frame is encoded.

    Args:
        pipe (`Cosmos3OmniPipeline`): Its tokenizer and video processor are used.
        prompt (`str`), negative_prompt (`str`, *optional*), fps (`float`), use_system_prompt (`bool`, *optional*):
            As :func:`encode_conditioning`.
        action (`CosmosActionCondition`): The upstream action condition (its frames' size picks the canvas).

    Returns:
        `tuple`: ``(cond_input_ids, uncond_input_ids, height, width)``.
    """
    clip = [action.image] if action.image is not None else action.video
    probe = pipe.video_processor.preprocess_video(clip)
    height, width = VideoProcessor.classify_height_width_bin(
        int(probe.shape[-2]), int(probe.shape[-1]), ratios=_ACTION_RESOLUTION_BINS[str(action.resolution_tier)]
    )
    cond_ids, uncond_ids = pipe.tokenize_prompt(
        prompt,
        negative_prompt,
        num_frames=action.chunk_size + 1,
        height=height,
        width=width,
        fps=fps,
        use_system_prompt=use_system_prompt,
        action_mode=action.mode,
        action_view_point=action.view_point,
    )
    return cond_ids, uncond_ids, height, width


@torch.no_grad()
def encode_clips(
    pipe: Cosmos3OmniPipeline,
    clips: Sequence[Any],
    resolution_tier: int,
    num_frames: int,
    *,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """VAE latents of clips that share one frame size, in one VAE call: how a served group encodes its clip.

    Each clip goes through upstream's ``_prepare_action_video_conditioning`` (resize into the tier's bin, pad), the
    batch through ``_encode_video`` once, and the padding is cut with ``_remove_action_video_padding_from_latent``.
    :func:`encode_conditioning` calls it with one clip; training calls it with many, so that its examples are
    encoded the way they are served (a batched VAE call may differ from one clip's in the last bits).

    Args:
        pipe (`Cosmos3OmniPipeline`): Its VAE encodes.
        clips (`Sequence[Any]`): Clips the pipeline's video processor takes (lists of uint8 arrays
            ``[H, W, 3]``, PIL images), every frame of every clip one size.
        resolution_tier (`int`): Upstream resolution tier (a key of its action resolution bins).
        num_frames (`int`): Frames per clip (`chunk + 1` for a policy clip, 1 for its conditioning frame alone).
        device (`torch.device` or `str`): Where the VAE runs.

    Returns:
        `torch.Tensor` of shape `[len(clips), C, T, h, w]`, float32.

    Raises:
        ValueError: no clip, or clips whose frames land on different canvases.
    """
    if not clips:
        raise ValueError("encode_clips needs at least one clip, got none")
    frames, sizes = [], []
    for clip in clips:
        video, image_size, _, _ = pipe._prepare_action_video_conditioning(
            clip, resolution_tier, num_frames, device=device, dtype=torch.float32
        )
        frames.append(video)
        sizes.append(image_size)
    if any(not torch.equal(size, sizes[0]) for size in sizes[1:]):
        raise ValueError(f"clips encoded together must share one frame size, got {[s.tolist() for s in sizes]}")
    latents = pipe._encode_video(torch.cat(frames, dim=0)).contiguous().float()
    return pipe._remove_action_video_padding_from_latent(latents, sizes[0])


def _build_branch(
    pipe: Cosmos3OmniPipeline,
    input_ids: list[int],
    meta_vision: torch.Tensor,
    meta_action: torch.Tensor,
    vision_condition_indexes: list[int],
    domain_id: torch.Tensor,
    fps: float,
    device: torch.device,
) -> Branch:
    text = pipe._prepare_text_segment(input_ids, device=device)
    offset = text["vision_start_temporal_offset"]
    # Built at curr=0 so the returned indexes are offsets inside the block; the packer relocates them.
    vision = pipe._prepare_vision_segment(
        input_vision_tokens=meta_vision,
        has_image_condition=bool(vision_condition_indexes),
        mrope_offset=offset,
        vision_fps=fps,
        curr=0,
        device=device,
        condition_frame_indexes=vision_condition_indexes,
    )
    action = pipe._prepare_action_segment(
        input_action_tokens=meta_action,
        condition_frame_indexes=[],
        mrope_offset=offset,
        action_fps=fps,
        curr=0,
        device=device,
    )
    template = BlockTemplate(
        vision_token_shape=tuple(vision["vision_token_shapes"][0]),
        vision_noisy_frame_indexes=vision["vision_noisy_frame_indexes"][0],
        vision_noisy_offsets=vision["vision_mse_loss_indexes"],
        vision_mrope_ids=vision["vision_mrope_ids"],
        action_len=int(action["action_len"]),
        action_noisy_frame_indexes=action["action_noisy_frame_indexes"][0],
        action_mrope_ids=action["action_mrope_ids"],
        domain_id=domain_id,
    )
    prefix = PrefixSegment(
        input_ids=text["input_ids"], mrope_ids=text["text_mrope_ids"], vision_start_temporal_offset=offset
    )
    return Branch(prefix=prefix, template=template)


def draw_initial_latents(
    conditioning: GroupConditioning,
    generators: Sequence[torch.Generator],
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw each candidate's initial noise from its own generator, in upstream order (vision, then action).

    Args:
        conditioning (`GroupConditioning`): The group's shared conditioning.
        generators (`Sequence[torch.Generator]`): One fresh generator per candidate, in candidate order.
        device (`torch.device`): Where the latents live.

    Returns:
        `tuple`: vision latents ``[N, C, T, H, W]`` and action latents ``[N, A, D]``, float32.
    """
    dtype = torch.float32
    vision_noise, action_noise = [], []
    for generator in generators:
        vision_noise.append(randn_tensor(tuple(conditioning.x0_vision.shape), generator=generator, device=device,
                                         dtype=dtype))
        action_noise.append(randn_tensor(tuple(conditioning.x0_action.shape), generator=generator, device=device,
                                         dtype=dtype))
    vision_mask = conditioning.vision_mask
    vision = vision_mask * conditioning.x0_vision + (1.0 - vision_mask) * torch.cat(vision_noise, dim=0)
    action_mask = conditioning.action_mask
    action = action_mask * conditioning.x0_action + (1.0 - action_mask) * torch.stack(action_noise, dim=0)
    action[:, :, conditioning.raw_action_dim :] = 0
    return vision, action
