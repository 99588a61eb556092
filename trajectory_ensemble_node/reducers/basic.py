"""The built-in reducers that need nothing but the candidates: elementwise, medoid, mode and pose blocks."""

from __future__ import annotations

import math

import torch

from .._rotations import project_to_so3, rotation_from_6d, rotation_to_6d
from ..errors import InvalidSpecError
from .types import Reducer

# Kept as an integer denominator so the trim count is exact integer arithmetic, never a rounded float product.
_TRIM_DENOMINATOR = 5
TRIM_FRACTION = 1 / _TRIM_DENOMINATOR
"""``trimmed_mean`` drops ``floor(TRIM_FRACTION * N)`` values from each end of every element's sorted candidates."""

MODE_DISTANCE_THRESHOLD = 0.2
"""The fixed threshold ``mode`` used before the relative rule (RMS, normalized action units): ``mode_threshold: 0.2``
serves that rule again. A fixed threshold means different things under different normalizations (0.2 is about 51 px
on PushT's ``minmax`` over [0, 512]), which is why the default is :data:`MODE_RELATIVE_FACTOR`'s relative rule."""

MODE_RELATIVE_FACTOR = 2.0
"""The relative rule's cut, as a multiple of the group's median ``k``-th nearest-neighbour RMS distance
(:func:`relative_mode_threshold`). 2.0 is the smallest of 1.25, 1.5, 1.75, 2.0 at which bimodal groups with
isotropic noise inside each mode are never split into fragments (so the majority mode wins); on 200 toy scenes no
results file uses, the factors from 1.0 to 2.5 differ by a few scenes (``bench/results/mode_factor-toy.json``,
``docs/python-api.md#modes-cut``)."""


MODE_CORE_FRACTION = 0.35
"""The radius of ``mode``'s core, as a fraction of the group's median pairwise RMS distance (:func:`mode_core`).
Chosen on PushT validation starts 100000..100039 (the state oracle, N = 8) among 0.15, 0.25, 0.35 and 0.5: 0.25 and
0.35 cover alike (0.811 and 0.805 mean max coverage on the first 20 starts), 0.35 succeeds more often (10 against 4
of 60 episodes); checked on the toy's validation scenes (``docs/python-api.md#modes-core``, ``bench/results/mode_core-pusht.md``)."""


POSE_GRIPPER_BLOCK = 10
"""``pose_gripper`` block: 3 translation + 6 rotation (first two matrix columns) + 1 gripper."""

# float64 sums of up to a few hundred distances differ by ~1e-14 relative with summation order; totals closer than
# this are a mathematical tie and go to the lowest index.
_TIE_RTOL = 1e-12



def mean_reduce(candidates: torch.Tensor) -> torch.Tensor:
    """``mean``: the elementwise mean over candidates. Commutes with per-channel affine maps.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.

    Returns:
        `torch.Tensor` of shape `[H, D]`.
    """
    return candidates.mean(dim=0)


def median_reduce(candidates: torch.Tensor) -> torch.Tensor:
    """``median``: the elementwise median; for even N the mean of the two middle values (like
    ``torch.quantile(x, 0.5)``, unlike ``torch.median``, which returns the lower one).

    Averaging the two middle values makes the median commute with every per-channel affine map, including negative
    scales: a negative scale reverses the sort order, which would turn a lower median into an upper one.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.

    Returns:
        `torch.Tensor` of shape `[H, D]`.
    """
    ordered = candidates.sort(dim=0).values
    n = ordered.shape[0]
    if n % 2 == 1:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) * 0.5


def trimmed_mean_reduce(candidates: torch.Tensor) -> torch.Tensor:
    """``trimmed_mean``: per element, sort the N candidate values, drop ``k = floor(0.2 * N)`` (``= N // 5``) from
    each end and average the rest.

    ``k == 0`` for ``N < 5``, where this is exactly ``mean``. The trim is symmetric, so a negative scale (which
    reverses the order) keeps the same values: it commutes with per-channel affine maps.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.

    Returns:
        `torch.Tensor` of shape `[H, D]`.
    """
    n = candidates.shape[0]
    k = n // _TRIM_DENOMINATOR
    if k == 0:
        return candidates.mean(dim=0)
    return candidates.sort(dim=0).values[k : n - k].mean(dim=0)


def _pairwise_distances(candidates: torch.Tensor) -> torch.Tensor:
    """Frobenius distances between candidates, float64 on CPU so ties and merge order are device-independent.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`).

    Returns:
        `torch.Tensor` of shape `[N, N]`, float64, exactly symmetric with a zero diagonal.
    """
    flat = candidates.detach().reshape(candidates.shape[0], -1).to(device="cpu", dtype=torch.float64)
    # The matmul shortcut loses the exact symmetry and zero diagonal that tie-breaking relies on.
    return torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")


def medoid_reduce(candidates: torch.Tensor) -> torch.Tensor:
    """``medoid``: the candidate with the least summed Frobenius distance (over ``[H, D]``) to all others.

    The result is an exact copy of one input candidate, so it is always a trajectory the model actually produced:
    safe for multimodal candidates, where a mean can land between modes. Distances are computed in float64; totals
    within a relative ``1e-12`` of the minimum are ties (float64 summation noise), and ties go to the lowest
    candidate position.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.

    Returns:
        `torch.Tensor` of shape `[H, D]`: A copy of ``candidates[i]`` for the chosen ``i``.
    """
    totals = _pairwise_distances(candidates).sum(dim=1)
    tied = totals <= totals.min() * (1.0 + _TIE_RTOL)
    index = int(tied.nonzero()[0])
    return candidates[index].clone()


def check_mode_threshold(threshold: object) -> float | None:
    """The one check of a fixed ``mode`` threshold: ``None`` (the relative rule) or a finite number ``>= 0``.

    Args:
        threshold (`object`): The value to check.

    Returns:
        `float` or `None`: ``threshold`` as a float, or ``None`` for the relative rule.

    Raises:
        InvalidSpecError: If ``threshold`` is not ``None`` and not a finite real number ``>= 0``; the message quotes it.
    """
    if threshold is None:
        return None
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < math.inf:
        raise InvalidSpecError(f"mode threshold must be a finite number >= 0 (or None: relative), got {threshold!r}")
    return float(threshold)


def _rms_distances(candidates: torch.Tensor) -> torch.Tensor:
    """``[N, N]`` float64 RMS distances ``||x_i - x_j||_F / sqrt(H * D)`` (zero diagonal, exactly symmetric)."""
    return _pairwise_distances(candidates) / math.sqrt(candidates[0].numel())


def _median(values: torch.Tensor) -> float:
    ordered = values.sort().values
    n = ordered.numel()
    return float(ordered[n // 2]) if n % 2 == 1 else float((ordered[n // 2 - 1] + ordered[n // 2]) * 0.5)


def _relative_threshold(distances: torch.Tensor, factor: float = MODE_RELATIVE_FACTOR) -> float:
    n = distances.shape[0]
    if n <= 2:
        return 0.0
    k = max(1, n // 4)
    kth = distances.masked_fill(torch.eye(n, dtype=torch.bool), math.inf).sort(dim=1).values[:, k - 1]
    return factor * _median(kth)


def relative_mode_threshold(candidates: torch.Tensor, factor: float = MODE_RELATIVE_FACTOR) -> float:
    """The relative rule's cut for this group (the default of :func:`mode_clusters`).

    ``N <= 2``: 0 (two candidates carry no scale to judge their distance by, so only identical ones merge).
    Otherwise, with ``k = max(1, N // 4)``: ``MODE_RELATIVE_FACTOR`` (2.0) times the median over candidates of the
    RMS distance to their ``k``-th nearest other candidate (even ``N``: the mean of the two middle values). A
    candidate in a mode of at least ``k + 1`` members has its ``k``-th nearest neighbour inside that mode; while such
    modes hold more than half the group, the median is a distance inside modes, not between them. It is in the units
    of the candidates: multiplying every candidate by ``c != 0`` multiplies it by ``|c|``.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        factor (`float`, defaults to `MODE_RELATIVE_FACTOR`): The multiple; another value is for measuring the
            rule (``trajectory_ensemble_lab.toy.mode_factor``), the reducer always uses the default.

    Returns:
        `float`: The cut, ``>= 0`` (0 when most candidates have ``k`` identical twins).
    """
    return _relative_threshold(_rms_distances(candidates), factor)


def mode_clusters(candidates: torch.Tensor, threshold: float | None = None) -> tuple[tuple[int, ...], ...]:
    """Cluster candidates deterministically by complete-linkage agglomeration, cut at ``threshold``.

    Rule (normative; :func:`mode_reduce` builds on it):

    1. Distance: ``d_ij = ||x_i - x_j||_F / sqrt(H * D)``, the RMS elementwise difference, in float64 on CPU.
    2. Cut ``t``: ``threshold`` when given (a fixed cut in the candidates' units, e.g. the ``mode_threshold``
       parameter); else the relative rule, :func:`relative_mode_threshold`: 0 for ``N <= 2``, else
       ``MODE_RELATIVE_FACTOR`` (2.0) times the median distance to the ``k = max(1, N // 4)``-th nearest
       neighbour. The relative cut scales with the candidates, so the clusters do not depend on the units of the
       action space.
    3. Start with singletons; repeatedly merge the two clusters whose complete-linkage distance (the largest ``d_ij``
       between their members) is smallest, as long as it is ``<= t``. Equal distances go to the pair whose lowest
       members are lexicographically smallest. Every cluster therefore has diameter ``<= t``.

    Test vectors (``[N, 1, 1]`` candidates, relative rule):

    * ``[0, 1, 2, 3, 16]`` (``k = 1``): nearest distances ``[1, 1, 1, 1, 13]``, median 1, ``t = 2``:
      ``((0, 1), (2, 3), (4,))``. ``(0, 1)`` merges first (tie rule), then ``(2, 3)``; ``{0, 1, 2, 3}`` would have
      diameter 3 > 2.
    * ``[0, 0.5, 1, 1.5, 8, 8.5, 9, 20]`` (``k = 2``): second-nearest distances sorted
      ``[0.5, 0.5, 0.5, 1, 1, 1, 1, 11.5]``, median 1, ``t = 2``: ``((0, 1, 2, 3), (4, 5, 6), (7,))``.
    * ``[1, 1, 1]``: ``t = 0``: ``((0, 1, 2),)``. ``[0, 1]``: ``t = 0``: ``((0,), (1,))``.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        threshold (`float`, *optional*): A fixed largest RMS distance inside one cluster, ``>= 0``; ``None`` (the
            default): the relative rule.

    Returns:
        `tuple[tuple[int, ...], ...]`: Clusters as ascending candidate positions, ordered by their lowest position.

    Raises:
        InvalidSpecError: ``threshold`` is neither ``None`` nor a finite number ``>= 0``.
    """
    return _clusters(_rms_distances(candidates), check_mode_threshold(threshold))


def _clusters(distances: torch.Tensor, threshold: float | None) -> tuple[tuple[int, ...], ...]:
    n = distances.shape[0]
    linkage = distances.clone()
    if threshold is None:
        threshold = _relative_threshold(linkage)
    linkage.fill_diagonal_(math.inf)
    # Each cluster is indexed by its lowest member: a merge keeps the lower index.
    members: dict[int, list[int]] = {i: [i] for i in range(n)}
    while len(members) > 1:
        # argmin returns the first minimum in row-major order; the matrix is symmetric, so that is the pair (i, j)
        # with i < j and the smallest lowest members.
        i, j = divmod(int(torch.argmin(linkage)), n)
        if float(linkage[i, j]) > threshold:
            break
        merged = torch.maximum(linkage[i], linkage[j])
        linkage[i], linkage[:, i] = merged, merged
        linkage[i, i] = math.inf
        linkage[j], linkage[:, j] = math.inf, math.inf
        members[i].extend(members.pop(j))
    return tuple(tuple(sorted(members[key])) for key in sorted(members))


def mode_core(candidates: torch.Tensor, members: tuple[int, ...],
              fraction: float = MODE_CORE_FRACTION) -> tuple[int, ...]:
    """The densest part of one mode: the member with the most other members within the core radius, and those.

    Rule (normative; :func:`mode_reduce` averages what it returns):

    1. Radius ``r = MODE_CORE_FRACTION * median(d_ij, i < j)`` over the WHOLE group (``N(N-1)/2`` RMS distances as
       in :func:`mode_clusters`; an even count takes the mean of the two middle values). It is in the candidates'
       units, so a group times ``c != 0`` keeps the same core.
    2. For each member ``m``, its neighbourhood is the members within ``r`` of it (itself included). The centre is
       the member with the largest neighbourhood; equal sizes go to the lowest position (as equal modes do: with no
       denser part, ``mode`` stays with the lowest candidate, like one sample).
    3. The core is the centre's neighbourhood, ascending.

    Why a core and not the whole mode: on PushT the candidates of one mode spread along a continuum of pushes, and the
    mean of a wide mode is a push none of them proposed (the state oracle: the whole mode's mean 0.601 mean max
    coverage against one sample's 0.728; the core's mean 0.805). Where a mode is tight (the toy), the core is most
    of it.

    Test vectors (``[N, 1, 1]`` candidates): ``[1, 5, 7, 11, 12, 13, 15, 18]``, members ``(3, 4, 5, 6, 7)``:
    pairwise median 6, ``r = 2.1``; neighbourhood sizes 3, 3, 4, 2, 1: the centre is 13 (position 5), the core
    ``(3, 4, 5, 6)``. ``[0, 1, 2, 3, 16]``, members ``(0, 1)``: pairwise median 2.5, ``r = 0.875``: sizes 1, 1 and
    equal sums: ``(0,)``. ``[2, 2, 2]``, members ``(0, 1, 2)``: ``r = 0``: ``(0, 1, 2)``.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        members (`tuple[int, ...]`): One mode's positions, ascending (a cluster of :func:`mode_clusters`).
        fraction (`float`, defaults to `MODE_CORE_FRACTION`): The radius' fraction; another value is for measuring
            the rule (``trajectory_ensemble_lab.pusht.mode_core``), the reducer always uses the default.

    Returns:
        `tuple[int, ...]`: The core's positions, ascending, a non-empty subset of ``members``.
    """
    return _core(_rms_distances(candidates), members, fraction)


def _core(distances: torch.Tensor, members: tuple[int, ...], fraction: float) -> tuple[int, ...]:
    n = distances.shape[0]
    if len(members) <= 1 or n <= 2:
        return tuple(members)
    upper = torch.triu_indices(n, n, offset=1)
    radius = fraction * _median(distances[upper[0], upper[1]])
    index = torch.tensor(members)
    inside = distances.index_select(0, index).index_select(1, index)
    near = inside <= radius
    # argmax returns the first maximum: equal neighbourhoods go to the lowest position.
    best = int(torch.argmax(near.sum(dim=1)))
    return tuple(members[m] for m in range(len(members)) if bool(near[best, m]))


def mode_reduce(candidates: torch.Tensor, threshold: float | None = None, *,
                core_fraction: float = MODE_CORE_FRACTION) -> torch.Tensor:
    """``mode``: the majority mode's densest core, averaged; a bimodal set yields (part of) one of its modes, never
    the midpoint between them.

    Rule (normative). By default (the relative rule, no ``threshold``):

    1. Modes: :func:`mode_clusters` with the relative cut (2 times the group's median ``k``-th nearest-neighbour
       RMS distance). The majority mode is the cluster with the most members; equal sizes go to the one holding the
       lowest candidate position.
    2. Core: :func:`mode_core` of the majority mode (the member with the most mode members within
       ``MODE_CORE_FRACTION`` (0.35) times the group's median pairwise distance, and those members).
    3. Answer: the elementwise mean of the core.

    With a fixed ``threshold`` (the ``mode_threshold`` parameter; ``mode@T`` in a variant list): one scale only,
    the elementwise mean of the largest cluster at that cut (equal sizes: the lowest position's), as the fixed
    rule always served.

    Consequences:

    * ``N = 1`` returns that candidate; ``N = 2`` returns candidate 0 unless the two are identical (their mean).
    * Identical candidates: the mean of all (the cut and the radius are 0, and ``0 <= 0``).
    * Under the relative rule a group times ``c != 0`` gives its answer times ``c`` (the same modes, the same core):
      the result does not depend on the units of the action space.
    * Two modes farther apart than the cut give a mean of members of the larger one (the lower positions' on a tie),
      never the midpoint; a tight mode's core is the whole mode.

    Test vectors (``[N, 1, 1]`` candidates): ``[0, 0.5, 1, 1.5, 8, 8.5, 9, 20]`` -> 0.75 (modes ``(0, 1, 2, 3)``,
    ``(4, 5, 6)``, ``(7,)``; radius 0.35 x 7.5: the core is the whole first mode); the same times 100 -> 75;
    ``[1, 5, 7, 11, 12, 13, 15, 18]`` -> 12.75 (the core ``11, 12, 13, 15`` of the mode ``11..18``);
    ``[0, 1, 2, 3, 16]`` -> 0 (two modes of two, the lower positions'; its core is candidate 0 alone);
    ``[3, 5]`` -> 3; ``[2, 2, 2]`` -> 2; ``[7]`` -> 7; with ``threshold=1.0``, ``[0, 1, 2, 3, 16]`` -> 0.5 (one
    scale: the mean of the cluster ``(0, 1)``).

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        threshold (`float`, *optional*): A fixed cut (see :func:`mode_clusters`); ``None``: the relative rule.
        core_fraction (`float`, defaults to `MODE_CORE_FRACTION`): The core's radius fraction (:func:`mode_core`);
            another value is for measuring the rule, the reducer always uses the default.

    Returns:
        `torch.Tensor` of shape `[H, D]`.
    """
    distances = _rms_distances(candidates)
    clusters = _clusters(distances, check_mode_threshold(threshold))
    # max() keeps the first of equal keys, and clusters are ordered by lowest position.
    chosen = max(clusters, key=len)
    if threshold is None:
        chosen = _core(distances, chosen, core_fraction)
    index = torch.tensor(chosen, device=candidates.device)
    return candidates.index_select(0, index).mean(dim=0)


def pose_gripper_reduce(candidates: torch.Tensor) -> torch.Tensor:
    """``pose_gripper``: reduce end-effector poses block by block, respecting rotation geometry.

    The width is a multiple of 10; each 10-wide block is ``[tx, ty, tz, r1 (3), r2 (3), gripper]`` where ``r1, r2``
    are the first two columns of a rotation matrix (Zhou et al. 2019; e.g. ``droid_lerobot`` = 1 block,
    ``robomind-franka-dual`` = 2). Per block and timestep:

    * translation: the mean;
    * rotation: the chordal L2 mean. Each candidate's matrix is rebuilt from its 6D by Gram-Schmidt, the matrices are
      averaged, the average is projected onto SO(3) by SVD with the determinant fixed to +1, and the result is
      re-encoded as its first two columns. Computed in float64;
    * gripper: the elementwise median as in ``median`` (even N: mean of the two middle values). For a two-valued
      gripper this is the majority vote whenever one state has a strict majority (always, for odd N); an exact tie
      (even N, half open, half closed) gives the midpoint of the two states. Non-binary values get their median.

    Inputs must be raw (denormalized) poses: per-channel scaling would distort the rotation columns.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates, ``D = 10 * blocks``.

    Returns:
        `torch.Tensor` of shape `[H, D]`.
    """
    n, horizon, width = candidates.shape
    blocks = candidates.reshape(n, horizon, width // POSE_GRIPPER_BLOCK, POSE_GRIPPER_BLOCK)
    translation = blocks[..., 0:3].mean(dim=0)
    rotations = rotation_from_6d(blocks[..., 3:9].to(torch.float64))
    rotation = rotation_to_6d(project_to_so3(rotations.mean(dim=0))).to(candidates.dtype)
    gripper = median_reduce(blocks[..., 9:10])
    return torch.cat((translation, rotation, gripper), dim=-1).reshape(horizon, width)


BUILTIN: tuple[Reducer, ...] = (
    Reducer("mean", mean_reduce, streaming=True, space="any", description="elementwise mean"),
    Reducer("median", median_reduce, streaming=False, space="any", description="elementwise median (even N: mid)"),
    Reducer(
        "trimmed_mean",
        trimmed_mean_reduce,
        streaming=False,
        space="any",
        description="elementwise mean without the floor(0.2 N) lowest and highest values",
    ),
    Reducer(
        "medoid", medoid_reduce, streaming=False, space="normalized", description="candidate nearest all others"
    ),
    Reducer(
        "mode",
        mode_reduce,
        streaming=False,
        space="normalized",
        description="the largest complete-linkage cluster (cut: 2x the median k-th nearest-neighbour distance, "
        "k = max(1, N // 4)), averaged over its densest core (radius 0.35x the median pairwise distance)",
    ),
    Reducer(
        "pose_gripper",
        pose_gripper_reduce,
        streaming=False,
        space="raw",
        block_width=POSE_GRIPPER_BLOCK,
        description="per 10-wide block: mean translation, chordal-mean rotation, median gripper",
    ),
)
"""The elementwise and mode reducers, in the registry's order."""
