"""How ``train-toy`` varies a demonstration: the shared trainer's augmentations (:mod:`..training.augment`), named
here for the toy's callers."""

from __future__ import annotations

from ..training.augment import drift_chunk, offset_prefix, retime_chunk, sample_prefixes, sample_speeds

__all__ = ["drift_chunk", "offset_prefix", "retime_chunk", "sample_prefixes", "sample_speeds"]
