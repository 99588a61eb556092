"""Live weight updates (safetensors only), and the optional q/k/v fusion they route into.

An unfused name is routed into its slice of a fused q/k/v parameter by shard id. An update is planned completely
before anything changes (strict: one bad entry rejects it all) and copied on the engine thread between groups, so no
group ever sees a mix (docs/rollouts-and-weights.md, "Weight updates").
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer, Cosmos3PackedMoTAttention

from ...errors import WeightUpdateError

# (unfused projection names) -> fused attribute, per pathway.
_FUSIONS = {
    "to_qkv": ("to_q", "to_k", "to_v"),
    "add_qkv": ("add_q_proj", "add_k_proj", "add_v_proj"),
}
_SHARDS = ("q", "k", "v")


def _attention_modules(transformer: Cosmos3OmniTransformer) -> list[tuple[str, Cosmos3PackedMoTAttention]]:
    return [(name, m) for name, m in transformer.named_modules() if isinstance(m, Cosmos3PackedMoTAttention)]


def _load_shard(sizes: tuple[int, int, int], param: torch.nn.Parameter, loaded: torch.Tensor,
                shard_id: str | None = None) -> None:
    """``weight_loader`` of a fused q/k/v parameter: the whole tensor, or one shard of it by id."""
    with torch.no_grad():
        if shard_id is None:
            param.copy_(loaded)
            return
        start = sum(sizes[: _SHARDS.index(shard_id)])
        param[start : start + sizes[_SHARDS.index(shard_id)]].copy_(loaded)


def fuse_qkv_projections(transformer: Cosmos3OmniTransformer) -> None:
    """Replace each attention's q/k/v projections (both pathways) by one fused ``Linear``.

    One GEMM instead of three per pathway and layer. The fused parameters carry a ``weight_loader`` so updates named
    after the unfused projections still land in the right rows. Results stay within the equivalence rule but are
    not bitwise equal to the unfused model (different GEMM shapes), which is why fusion is off by default.
    """
    for _, attn in _attention_modules(transformer):
        if hasattr(attn, "to_qkv"):
            continue
        for fused_name, parts in _FUSIONS.items():
            linears = [getattr(attn, p) for p in parts]
            sizes = tuple(int(lin.out_features) for lin in linears)
            has_bias = linears[0].bias is not None
            fused = torch.nn.Linear(linears[0].in_features, sum(sizes), bias=has_bias,
                                    device=linears[0].weight.device, dtype=linears[0].weight.dtype)
            with torch.no_grad():
                fused.weight.copy_(torch.cat([lin.weight for lin in linears]))
                if has_bias:
                    fused.bias.copy_(torch.cat([lin.bias for lin in linears]))
            for param in fused.parameters():
                param.weight_loader = functools.partial(_load_shard, sizes)
            fused.shard_sizes = sizes
            setattr(attn, fused_name, fused)
            for p in parts:
                delattr(attn, p)


def unfuse_qkv_projections(transformer: Cosmos3OmniTransformer) -> None:
    """Undo :func:`fuse_qkv_projections` (e.g. before ``save_pretrained``, so the checkpoint keeps the diffusers names)."""
    for _, attn in _attention_modules(transformer):
        for fused_name, parts in _FUSIONS.items():
            fused = getattr(attn, fused_name, None)
            if fused is None:
                continue
            start = 0
            for part, size in zip(parts, fused.shard_sizes):
                lin = torch.nn.Linear(fused.in_features, size, bias=fused.bias is not None,
                                      device=fused.weight.device, dtype=fused.weight.dtype)
                with torch.no_grad():
                    lin.weight.copy_(fused.weight[start : start + size])
                    if fused.bias is not None:
                        lin.bias.copy_(fused.bias[start : start + size])
                setattr(attn, part, lin)
                start += size
            delattr(attn, fused_name)


@dataclass(frozen=True)
class _Entry:
    name: str  # as given by the caller
    target: str  # parameter name in the (possibly fused) transformer
    tensor: torch.Tensor
    shard_id: str | None


@dataclass
class UpdatePlan:
    """A validated update: what will be copied where, and what was skipped (non-strict mode only)."""

    entries: list[_Entry] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]


def load_update_source(source: str | Path | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Read an update: a ``.safetensors`` file or a mapping of tensors. Pickle is never read.

    Raises:
        WeightUpdateError: the path is not a readable safetensors file, or the mapping holds non-tensors.
    """
    if isinstance(source, Mapping):
        bad = [k for k, v in source.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
        if bad:
            raise WeightUpdateError(f"weight update entries must be str -> torch.Tensor; bad keys: {bad[:5]!r}.")
        return dict(source)
    path = Path(source)
    if path.suffix != ".safetensors":
        raise WeightUpdateError(f"weights are loaded from .safetensors files only (no pickle); got {str(path)!r}.")
    if not path.is_file():
        raise WeightUpdateError(f"weight file {str(path)!r} does not exist.")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise WeightUpdateError(f"{str(path)!r} is not a valid safetensors file: {exc}") from exc


def plan_update(transformer: Cosmos3OmniTransformer, tensors: Mapping[str, torch.Tensor], *,
                strict: bool = True) -> UpdatePlan:
    """Validate an update against ``transformer`` without changing it.

    Raises:
        WeightUpdateError: in strict mode, on the first unknown name or shape/dtype mismatch (listing all of them).
    """
    params = dict(transformer.named_parameters())
    plan = UpdatePlan()
    problems: dict[str, str] = {}
    for name, tensor in tensors.items():
        key = name[len("transformer."):] if name.startswith("transformer.") else name
        target, shard_id, expected_shape = _resolve(params, key)
        if target is None:
            problems[name] = "unknown parameter"
            continue
        param = params[target]
        if tuple(tensor.shape) != expected_shape:
            problems[name] = f"shape {tuple(tensor.shape)} != {expected_shape}"
            continue
        if tensor.dtype != param.dtype:
            problems[name] = f"dtype {tensor.dtype} != {param.dtype}"
            continue
        if not torch.isfinite(tensor).all():
            problems[name] = "non-finite values"
            continue
        plan.entries.append(_Entry(name=name, target=target, tensor=tensor, shard_id=shard_id))
    if problems and strict:
        listed = "; ".join(f"{k}: {v}" for k, v in list(problems.items())[:10])
        raise WeightUpdateError(f"strict weight update rejected, nothing changed ({len(problems)} bad): {listed}")
    plan.skipped = problems
    return plan


def _resolve(params: Mapping[str, torch.nn.Parameter], key: str) -> tuple[str | None, str | None, tuple[int, ...]]:
    if key in params:
        return key, None, tuple(params[key].shape)
    # An unfused projection name while the model runs fused: route it by shard id.
    module_path, _, leaf = key.rpartition(".")
    parent, _, projection = module_path.rpartition(".")
    for fused_name, parts in _FUSIONS.items():
        if projection in parts:
            target = f"{parent}.{fused_name}.{leaf}"
            if target in params:
                fused = params[target]
                sizes = fused.weight_loader.args[0]
                shard = _SHARDS[parts.index(projection)]
                shape = (sizes[_SHARDS.index(shard)], *fused.shape[1:])
                return target, shard, shape
    return None, None, ()


def apply_update(transformer: Cosmos3OmniTransformer, plan: UpdatePlan) -> None:
    """Copy a validated plan into the transformer (call it between groups)."""
    params = dict(transformer.named_parameters())
    with torch.no_grad():
        for entry in plan.entries:
            param = params[entry.target]
            value = entry.tensor.to(device=param.device)
            loader = getattr(param, "weight_loader", None)
            if loader is not None:
                loader(param, value, entry.shard_id)
            else:
                param.copy_(value)
