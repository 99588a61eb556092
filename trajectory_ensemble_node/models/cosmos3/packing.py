"""Packing many candidates (and many groups) into ONE ``Cosmos3OmniTransformer.forward`` sequence.

``[prefix_0 | prefix_1 | ... | block_0 | block_1 | ...]``: every text prefix first (``forward`` needs all text tokens
before generation tokens), then each candidate's generation block per branch, every token keeping the position id a
single upstream run gives it. Who attends to whom is :class:`AttentionLayout`'s (:mod:`.attention`). Training packs
through :func:`pack_forward` too: one packing path only.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .attention import AttentionLayout, GenRun, PrefixSlot, install_fanout
from .prefix_cache import PrefixKVCache


@dataclass(frozen=True)
class PrefixSegment:
    """One tokenized prompt, shared by every candidate block that conditions on it.

    Args:
        input_ids (`torch.LongTensor` of shape `[L]`): Token ids, ending with eos and ``<|vision_start|>``.
        mrope_ids (`torch.Tensor` of shape `[3, L]`): Position ids of the text tokens.
        vision_start_temporal_offset (`int` or `float`): Temporal mRoPE offset where generation tokens start.
    """

    input_ids: torch.Tensor
    mrope_ids: torch.Tensor
    vision_start_temporal_offset: int | float

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])

    @functools.cached_property
    def content_key(self) -> bytes:
        """Digest of everything the text pathway reads from this prefix (token ids and their positions)."""
        digest = hashlib.sha256()
        for tensor in (self.input_ids, self.mrope_ids):
            digest.update(f"{tuple(tensor.shape)}{tensor.dtype};".encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.digest()


@dataclass(frozen=True)
class BlockTemplate:
    """Static layout of one candidate's generation block, for one prefix (positions depend on the prefix length).

    Args:
        vision_token_shape (`tuple[int, int, int]`): Patch grid ``(T, H/p, W/p)``.
        vision_noisy_frame_indexes (`torch.LongTensor`): Latent frames that are denoised (not conditioned).
        vision_noisy_offsets (`torch.LongTensor`): Offsets of the noisy vision tokens inside the block.
        vision_mrope_ids (`torch.Tensor` of shape `[3, num_vision_tokens]`): Vision position ids.
        action_len (`int`): Number of action tokens (0 when the block carries no action stream).
        action_noisy_frame_indexes (`torch.LongTensor`): Action tokens that are denoised.
        action_mrope_ids (`torch.Tensor` of shape `[3, action_len]`): Action position ids.
        domain_id (`torch.LongTensor` of shape `[1]`): Embodiment domain selecting the action head.
    """

    vision_token_shape: tuple[int, int, int]
    vision_noisy_frame_indexes: torch.Tensor
    vision_noisy_offsets: torch.Tensor
    vision_mrope_ids: torch.Tensor
    action_len: int
    action_noisy_frame_indexes: torch.Tensor | None
    action_mrope_ids: torch.Tensor | None
    domain_id: torch.Tensor | None

    @property
    def num_vision_tokens(self) -> int:
        t, h, w = self.vision_token_shape
        return t * h * w

    @property
    def num_noisy_vision_tokens(self) -> int:
        return int(self.vision_noisy_offsets.numel())

    @property
    def num_noisy_action_tokens(self) -> int:
        return 0 if self.action_noisy_frame_indexes is None else int(self.action_noisy_frame_indexes.numel())

    @property
    def length(self) -> int:
        return self.num_vision_tokens + self.action_len


@dataclass(frozen=True)
class Branch:
    """A prefix plus the block template of every candidate that conditions on it (one CFG branch of one group)."""

    prefix: PrefixSegment
    template: BlockTemplate


@dataclass
class PackItem:
    """``n`` candidate blocks of one branch, at one denoising timestep.

    Args:
        branch (`Branch`): Prefix and block template.
        vision (`torch.Tensor` of shape `[n, C, T, H, W]`): Noisy vision latents, in the transformer dtype.
        action (`torch.Tensor` of shape `[n, A, D]`, *optional*): Noisy action latents, in the transformer dtype.
        timestep (`float`, `int` or `tuple[float, ...]`): Timestep value of the noisy tokens: one for every
            candidate (a group's candidates are in lockstep), or one per candidate (``n`` values: a training batch
            whose examples share one branch but not their noise level, packed as one run of blocks).
    """

    branch: Branch
    vision: torch.Tensor
    action: torch.Tensor | None
    timestep: float | int | tuple[float, ...]

    @property
    def count(self) -> int:
        return int(self.vision.shape[0])


@dataclass(frozen=True)
class PackedForward:
    """Everything one physical forward needs: transformer kwargs, the attention layout, and how to unpack."""

    kwargs: dict[str, Any]
    layout: AttentionLayout
    counts: tuple[int, ...]


def pack_forward(
    items: Sequence[PackItem],
    device: torch.device,
    cached: Callable[[int], bool] | None = None,
) -> PackedForward:
    """Pack ``items`` into one joint sequence for ``Cosmos3OmniTransformer.forward``.

    Prefixes shared by several items (the same ``PrefixSegment`` object, e.g. microbatch slices of one group) are
    packed once. Blocks are laid out item by item, candidate-major, each block contiguous.

    Args:
        items (`Sequence[PackItem]`): The blocks to run; their order is the order of the unpacked predictions.
        device (`torch.device`): Device of the index tensors.
        cached (`Callable[[int], bool]`, *optional*): Whether a prefix (by ``id``) has its keys/values in the
            :class:`~.prefix_cache.PrefixKVCache`; those prefixes are left out of the sequence.

    Returns:
        `PackedForward`: ``kwargs`` for ``transformer(**kwargs, return_dict=False)``, the attention layout, and the
        per-item candidate counts to split predictions by.
    """
    if not items:
        raise ValueError("pack_forward needs at least one item.")
    prefix_index: dict[int, int] = {}
    prefixes: list[PrefixSegment] = []
    for item in items:
        key = id(item.branch.prefix)
        if key not in prefix_index:
            prefix_index[key] = len(prefixes)
            prefixes.append(item.branch.prefix)

    slots: list[PrefixSlot] = []
    computed: list[PrefixSegment] = []
    cursor = 0
    for prefix in prefixes:
        if cached is not None and cached(id(prefix)):
            slots.append(PrefixSlot(key=id(prefix), und_range=None))
            continue
        slots.append(PrefixSlot(key=id(prefix), und_range=(cursor, cursor + prefix.length)))
        computed.append(prefix)
        cursor += prefix.length
    und_len = cursor

    position_parts = [prefix.mrope_ids for prefix in computed]
    vision_tokens: list[torch.Tensor] = []
    vision_shapes: list[tuple[int, int, int]] = []
    vision_seq: list[torch.Tensor] = []
    vision_mse: list[torch.Tensor] = []
    vision_ts: list[torch.Tensor] = []
    vision_noisy: list[torch.Tensor] = []
    action_tokens: list[torch.Tensor] = []
    action_shapes: list[tuple[int, int, int]] = []
    action_seq: list[torch.Tensor] = []
    action_mse: list[torch.Tensor] = []
    action_ts: list[torch.Tensor] = []
    action_noisy: list[torch.Tensor] = []
    action_domains: list[torch.Tensor] = []
    runs: list[GenRun] = []

    has_action = items[0].action is not None
    for item in items:
        if (item.action is not None) != has_action:
            raise ValueError("Items of one physical forward must all carry an action stream, or none.")
        template = item.branch.template
        runs.append(GenRun(prefix=prefix_index[id(item.branch.prefix)], start=cursor - und_len,
                           count=item.count, length=template.length))
        n_vis = template.num_vision_tokens
        vision_arange = torch.arange(n_vis, dtype=torch.long, device=device)
        action_arange = torch.arange(template.action_len, dtype=torch.long, device=device)
        per_block = isinstance(item.timestep, tuple)
        if per_block and len(item.timestep) != item.count:
            raise ValueError(f"A PackItem of {item.count} blocks needs one timestep or {item.count}, got "
                             f"{len(item.timestep)}: {item.timestep!r}")
        for i in range(item.count):
            timestep = item.timestep[i] if per_block else item.timestep
            vision_tokens.append(item.vision[i : i + 1])
            vision_shapes.append(template.vision_token_shape)
            vision_seq.append(vision_arange + cursor)
            vision_mse.append(template.vision_noisy_offsets + cursor)
            # torch.full with the same Python scalar as upstream keeps the timestep dtype (and bits) identical.
            vision_ts.append(torch.full((template.num_noisy_vision_tokens,), timestep, device=device))
            vision_noisy.append(template.vision_noisy_frame_indexes)
            position_parts.append(template.vision_mrope_ids)
            if has_action:
                start = cursor + n_vis
                action_tokens.append(item.action[i])
                action_shapes.append((template.action_len, 1, 1))
                action_seq.append(action_arange + start)
                action_mse.append(template.action_noisy_frame_indexes + start)
                action_ts.append(torch.full((template.num_noisy_action_tokens,), timestep, device=device))
                action_noisy.append(template.action_noisy_frame_indexes)
                action_domains.append(template.domain_id)
                position_parts.append(template.action_mrope_ids)
            cursor += template.length

    input_ids = (torch.cat([prefix.input_ids for prefix in computed]) if computed
                 else torch.zeros(0, dtype=torch.long, device=device))
    kwargs: dict[str, Any] = {
        "input_ids": input_ids,
        "text_indexes": torch.arange(und_len, dtype=torch.long, device=device),
        "position_ids": torch.cat(position_parts, dim=1),
        "und_len": und_len,
        "sequence_length": cursor,
        "vision_tokens": vision_tokens,
        "vision_token_shapes": vision_shapes,
        "vision_sequence_indexes": torch.cat(vision_seq),
        "vision_mse_loss_indexes": torch.cat(vision_mse),
        "vision_timesteps": torch.cat(vision_ts),
        "vision_noisy_frame_indexes": vision_noisy,
    }
    if has_action:
        kwargs.update(
            action_tokens=action_tokens,
            action_token_shapes=action_shapes,
            action_sequence_indexes=torch.cat(action_seq),
            action_mse_loss_indexes=torch.cat(action_mse),
            action_timesteps=torch.cat(action_ts),
            action_noisy_frame_indexes=action_noisy,
            action_domain_ids=action_domains,
        )
    layout = AttentionLayout(prefixes=tuple(slots), gen_runs=tuple(runs))
    return PackedForward(kwargs=kwargs, layout=layout, counts=tuple(item.count for item in items))


def split_predictions(
    packed: PackedForward, preds: list[torch.Tensor] | None
) -> list[torch.Tensor | None]:
    """Regroup the transformer's per-block predictions into one ``[n, ...]`` tensor per item.

    Args:
        packed (`PackedForward`): The packing the predictions came from.
        preds (`list[torch.Tensor]`, *optional*): Per-block predictions in block order (``None`` passes through).

    Returns:
        `list`: per item, the stacked predictions of its ``n`` blocks (``None`` when ``preds`` is ``None``).
    """
    if preds is None:
        return [None] * len(packed.counts)
    out: list[torch.Tensor | None] = []
    start = 0
    for count in packed.counts:
        chunk = preds[start : start + count]
        # Vision predictions carry a leading batch axis of 1 per block; actions do not.
        out.append(torch.cat(chunk, dim=0) if chunk[0].dim() == 5 else torch.stack(chunk, dim=0))
        start += count
    return out


def forward_items(
    transformer: Any, items: Sequence[PackItem], device: torch.device, prefix_cache: PrefixKVCache | None = None
) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
    """Run ``items`` through ``transformer`` in one packed forward, outside the serving loop (training, probes).

    Without ``prefix_cache`` every prefix is in the sequence. Gradients flow unless the caller disables them.

    Args:
        transformer (`Cosmos3OmniTransformer`): The model; the fan-out processor is installed on it if needed.
        items (`Sequence[PackItem]`): The blocks to run.
        device (`torch.device`): Device of the index tensors.
        prefix_cache (`PrefixKVCache`, *optional*): Prefixes it holds (by the ``PrefixSegment`` object's identity,
            so keep that object alive) are left out of the sequence and their keys/values read from it, as the
            serving loop's later denoising steps do; a prefix computed here is stored and committed. The stored
            keys/values carry whatever graph they were computed in, so a trainer fills it under ``torch.no_grad()``
            and only while the text pathway's weights are frozen: then they are constants of the training run.

    Returns:
        `tuple`: per item, its stacked vision predictions ``[n, C, T, h, w]`` and action predictions ``[n, A, D]``
        (``None`` where the forward has none), in item order.
    """
    cached = prefix_cache.is_complete if prefix_cache is not None else None
    packed = pack_forward(items, device, cached=cached)
    processor = install_fanout(transformer)
    with processor.use_layout(packed.layout, cache=prefix_cache):
        preds_v, _, preds_a = transformer(**packed.kwargs, return_dict=False)
    if prefix_cache is not None:
        prefix_cache.commit(slot.key for slot in packed.layout.computed)
    return split_predictions(packed, preds_v), split_predictions(packed, preds_a)
