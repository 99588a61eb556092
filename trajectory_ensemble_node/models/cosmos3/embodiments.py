"""What a Cosmos 3 policy request may name: embodiments (and their raw action widths), resolution tiers, view points.

diffusers keeps these tables private to ``pipeline_cosmos3_omni``; this module is the one place that reads them, so
the node's parameter checks and the adapter agree on them and a diffusers rename breaks one import, not several.
"""

from __future__ import annotations

from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    _ACTION_RESOLUTION_BINS,
    _ACTION_VIEWPOINT_TEMPLATES,
    _EMBODIMENT_TO_RAW_ACTION_DIM,
)

RESOLUTION_TIERS: tuple[int, ...] = tuple(sorted(int(tier) for tier in _ACTION_RESOLUTION_BINS))
"""Conditioning resolution tiers a policy request may name (``resolution_tier``)."""

VIEW_POINTS: tuple[str, ...] = tuple(_ACTION_VIEWPOINT_TEMPLATES)
"""Camera view points a policy request may name (``view_point``; ``concat_view`` for tiled cameras)."""


def embodiment_widths() -> dict[str, int]:
    """Every embodiment (``domain_name``) with a fixed raw action width, and that width.

    Returns:
        `dict[str, int]`: a fresh copy, e.g. ``{"pusht": 2, "droid_lerobot": 10, ...}``; domains without a canonical
        width (which cannot serve policy requests) are absent.
    """
    return dict(_EMBODIMENT_TO_RAW_ACTION_DIM)
