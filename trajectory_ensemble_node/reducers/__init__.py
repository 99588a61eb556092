"""Candidate reducers: pure functions ``[N, H, D] -> [H, D]`` that turn N candidate trajectories into one.

This docstring and the reducers' own docstrings are the reference for what each reducer computes.

Every reducer is a :class:`Reducer`: a pure function plus declared properties the runtime checks before any model
work is spent.

* ``streaming``: it could fold candidates one at a time (mean). ``False`` means it needs all N at once.
* ``space``: where the result is meaningful.
  ``"any"``: it commutes with per-channel affine maps ``a * x + b`` (any nonzero ``a``, including negative), so
  reducing before or after denormalization gives the same trajectory.
  ``"normalized"``: it compares channels with one distance, so channels must be on a common scale.
  ``"raw"``: it needs physical units (e.g. rotation matrices).
* ``block_width``: the action width must be a positive multiple of it (``pose_gripper``: 10). Requests are held to
  it by :func:`~trajectory_ensemble_node.contract.check_request` (through :meth:`Reducer.check_layout`), so a bad
  layout is rejected before the model runs.

Calling a reducer validates its input (a floating tensor ``[N, H, D]``, ``N >= 1``) and refuses NaN/Inf with
:class:`~trajectory_ensemble_node.errors.NonFiniteCandidatesError`: a non-finite candidate is never averaged away
silently. Half-precision inputs are reduced in float32 and returned in their own dtype.

| name | rule | streaming | space | block |
| --- | --- | --- | --- | --- |
| ``mean`` | elementwise mean | yes | any | - |
| ``median`` | elementwise median; even N: mean of the two middle values | no | any | - |
| ``trimmed_mean`` | elementwise mean after dropping ``k = floor(0.2 N)`` lowest and highest | no | any | - |
| ``medoid`` | the candidate with least summed Frobenius distance to the others | no | normalized | - |
| ``mode`` | the largest complete-linkage cluster (cut: 2x the median k-th nearest-neighbour distance, k = max(1, N // 4)), averaged over its densest core (radius 0.35x the median pairwise distance) | no | normalized | - |
| ``pose_gripper`` | per 10-wide block: mean translation, chordal-mean rotation, median gripper | no | raw | 10 |
| ``backward_coherence`` | the candidate nearest the previous chunk over the overlap (BID) | no | normalized | - |
| ``mode_continuity`` | in the cluster nearest the previous chunk over the overlap, its nearest member | no | normalized | - |

The last two (:mod:`.continuity`) are continuity-aware (``uses_context``): they also receive a
:class:`ContinuityReference`, the previous chunk at the new chunk's times with per-action weights, when a request
carries an execution context, and fall back to ``medoid`` / ``mode`` when it does not (an episode's first chunk).

``mode`` finds the majority mode at a cut relative to the group (:func:`relative_mode_threshold`) and averages its
densest core (:func:`mode_core`), so its answer does not depend on the units of the action space; a served model can
fix the cut instead (``mode_threshold``, applied by :func:`configured_reducer`: one scale, the cluster's mean). :func:`reduce_variants` applies several reducers and cuts to one group, for comparing
them offline (``calibrate --bag``, the lab's benches).

``"none"`` is not a reducer: it is the spec's name for "count is 1, return the single candidate".
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
