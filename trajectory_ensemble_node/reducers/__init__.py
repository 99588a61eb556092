"""Candidate reducers: pure functions ``[N, H, D] -> [H, D]`` that turn N candidate trajectories into one.

What each reducer computes, and what its declarations (``streaming``, ``space``, ``block_width``) mean, is in
docs/python-api.md, "Reducers" (the reference); each reducer's own docstring gives its details.
"""

from .basic import (
    MODE_CORE_FRACTION,
    MODE_DISTANCE_THRESHOLD,
    MODE_RELATIVE_FACTOR,
    POSE_GRIPPER_BLOCK,
    TRIM_FRACTION,
    check_mode_threshold,
    mean_reduce,
    median_reduce,
    medoid_reduce,
    mode_clusters,
    mode_core,
    mode_reduce,
    pose_gripper_reduce,
    relative_mode_threshold,
    trimmed_mean_reduce,
)
from .continuity import backward_coherence_reduce, coherence_scores, mode_continuity_reduce
from .registry import available_reducers, configured_reducer, get_reducer, register_reducer
from .variants import ReducerVariant, parse_variants, reduce_variants
from .types import REDUCER_SPACES, ContinuityReference, Reducer, check_finite
