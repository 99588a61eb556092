"""Several reducers, and several ``mode`` cuts, applied to one group: the offline comparison of reducers.

Candidates are drawn once and every reducer is a pure function of them, so this is the one path for comparing them
(``calibrate --bag``, the lab's benches). A variant is ``NAME`` or ``NAME@THRESHOLD`` (``mode@0.05``: ``mode`` at a
fixed cut); ``single`` is candidate 0 alone, what ``count = 1`` serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..errors import InvalidSpecError
from ..normalization import ActionNormalizer
from .basic import check_mode_threshold
from .registry import CLUSTERING_REDUCERS, configured_reducer, get_reducer

SINGLE = "single"
"""The variant label of candidate 0 alone (no reduction)."""


@dataclass(frozen=True)
class ReducerVariant:
    """A registered reducer, with a fixed ``mode`` cut where it clusters.

    Args:
        reducer (`str`): A registered reducer name, or :data:`SINGLE`.
        mode_threshold (`float`, *optional*): A fixed cut (``mode``, ``mode_continuity``); ``None``: the relative
            rule.

    Raises:
        UnknownReducerError: ``reducer`` is not registered.
        InvalidSpecError: ``mode_threshold`` is invalid, or given for a reducer that does not cluster.
    """

    reducer: str
    mode_threshold: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode_threshold", check_mode_threshold(self.mode_threshold))
        if self.reducer != SINGLE:
            get_reducer(self.reducer)
        if self.mode_threshold is not None and self.reducer not in CLUSTERING_REDUCERS:
            raise InvalidSpecError(f"a fixed threshold applies to {list(CLUSTERING_REDUCERS)} only, got "
                                   f"{self.reducer!r}@{self.mode_threshold:g}")

    @property
    def label(self) -> str:
        """``NAME`` or ``NAME@THRESHOLD`` (the form :func:`parse_variants` reads)."""
        return self.reducer if self.mode_threshold is None else f"{self.reducer}@{self.mode_threshold:g}"


def parse_variants(text: str | Iterable[str]) -> tuple[ReducerVariant, ...]:
    """Variants from ``"single,mean,mode,mode@0.05"`` (or the same items as a sequence).

    Raises:
        InvalidSpecError: An item is empty, repeated, or its threshold is not a number; the message quotes it.
        UnknownReducerError: An item names no registered reducer.
    """
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text)]
    variants = []
    for item in items:
        name, at, value = item.partition("@")
        if not name:
            raise InvalidSpecError(f"reducer variant {item!r}: expected NAME or NAME@THRESHOLD")
        try:
            threshold = float(value) if at else None
        except ValueError:
            raise InvalidSpecError(f"reducer variant {item!r}: threshold {value!r} is not a number") from None
        variants.append(ReducerVariant(name, threshold))
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise InvalidSpecError(f"reducer variants repeat: {labels}")
    return tuple(variants)


def reduce_variants(candidates: torch.Tensor, variants: Sequence[ReducerVariant],
                    normalizer: ActionNormalizer | None = None) -> dict[str, torch.Tensor]:
    """Each variant's chunk from the same candidates, each reducer in the space it is valid in.

    As the served path does (:func:`~trajectory_ensemble_node.engine.reduction.reduce_candidates`): ``normalized``
    and ``any`` reducers run on the normalized candidates and their result is denormalized; ``raw`` ones run on the
    denormalized candidates. Continuity-aware reducers get no reference (an episode's first chunk).

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates in the model's normalized space.
        variants (`Sequence[ReducerVariant]`): What to apply (:func:`parse_variants`).
        normalizer (`ActionNormalizer`, *optional*): Into robot units; ``None``: the chunks stay normalized.

    Returns:
        `dict[str, torch.Tensor]`: ``{label: [H, D]}`` in the variants' order, in robot units with a normalizer.
    """
    raw = normalizer.denormalize(candidates) if normalizer is not None else candidates
    out: dict[str, torch.Tensor] = {}
    for variant in variants:
        if variant.reducer == SINGLE:
            out[variant.label] = raw[0].clone()
            continue
        reducer = configured_reducer(variant.reducer, variant.mode_threshold)
        if normalizer is None or reducer.space == "raw":
            out[variant.label] = reducer(raw)
        else:
            out[variant.label] = normalizer.denormalize(reducer(candidates))
    return out


def variant_table(variants: Sequence[ReducerVariant]) -> Mapping[str, dict[str, object]]:
    """``{label: {"reducer": name, "mode_threshold": cut or None}}``: how a record names what it compared."""
    return {v.label: {"reducer": v.reducer, "mode_threshold": v.mode_threshold} for v in variants}
