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
| ``mode`` | mean of the largest complete-linkage cluster (RMS threshold 0.2) | no | normalized | - |
| ``pose_gripper`` | per 10-wide block: mean translation, chordal-mean rotation, median gripper | no | raw | 10 |
| ``backward_coherence`` | the candidate nearest the previous chunk over the overlap (BID) | no | normalized | - |
| ``mode_continuity`` | in the cluster nearest the previous chunk over the overlap, its nearest member | no | normalized | - |

The last two (:mod:`.continuity`) are continuity-aware (``uses_context``): they also receive a
:class:`ContinuityReference`, the previous chunk at the new chunk's times with per-action weights, when a request
carries an execution context, and fall back to ``medoid`` / ``mode`` when it does not (an episode's first chunk).

``"none"`` is not a reducer: it is the spec's name for "count is 1, return the single candidate".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ._rotations import project_to_so3, rotation_from_6d, rotation_to_6d
from .errors import InvalidSpecError, NonFiniteCandidatesError, ReducerLayoutError, UnknownReducerError

REDUCER_SPACES = ("normalized", "raw", "any")
"""Values of :attr:`Reducer.space`. An adapter reduces in ``"normalized"`` or ``"raw"`` space."""

# Kept as an integer denominator so the trim count is exact integer arithmetic, never a rounded float product.
_TRIM_DENOMINATOR = 5
TRIM_FRACTION = 1 / _TRIM_DENOMINATOR
"""``trimmed_mean`` drops ``floor(TRIM_FRACTION * N)`` values from each end of every element's sorted candidates."""

MODE_DISTANCE_THRESHOLD = 0.2
"""``mode`` merges clusters while their complete-linkage RMS distance is at most this (normalized action units)."""

POSE_GRIPPER_BLOCK = 10
"""``pose_gripper`` block: 3 translation + 6 rotation (first two matrix columns) + 1 gripper."""

# float64 sums of up to a few hundred distances differ by ~1e-14 relative with summation order; totals closer than
# this are a mathematical tie and go to the lowest index.
_TIE_RTOL = 1e-12


@dataclass(frozen=True)
class Reducer:
    """A named candidate reducer with the properties the runtime validates against.

    Args:
        name (`str`): Registry name, used in requests. ``"none"`` is reserved.
        fn (`Callable[[torch.Tensor], torch.Tensor]`): Pure function ``[N, H, D] -> [H, D]``. It receives finite
            float32/float64 candidates and must not modify them.
        streaming (`bool`): ``True`` if candidates could be folded in incrementally (e.g. mean).
        space (`str`): One of :data:`REDUCER_SPACES` (see the module docstring).
        block_width (`int`, *optional*): The action width must be a positive multiple of it; ``None`` = any width.
        description (`str`, defaults to `""`): One line for logs and ``--help``.
        uses_context (`bool`, defaults to `False`): ``fn`` takes ``(candidates, reference)`` with ``reference`` a
            :class:`ContinuityReference` or ``None``; other reducers never see a reference.
    """

    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    streaming: bool
    space: str
    block_width: int | None = None
    description: str = ""
    uses_context: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name == "none":
            raise InvalidSpecError(f"reducer name must be a non-empty string other than 'none', got {self.name!r}")
        if not callable(self.fn):
            raise InvalidSpecError(f"reducer {self.name!r}: fn must be callable, got {self.fn!r}")
        if self.space not in REDUCER_SPACES:
            raise InvalidSpecError(f"reducer {self.name!r}: space must be one of {REDUCER_SPACES}, got {self.space!r}")
        if self.block_width is not None and (
            isinstance(self.block_width, bool) or not isinstance(self.block_width, int) or self.block_width < 1
        ):
            raise InvalidSpecError(
                f"reducer {self.name!r}: block_width must be None or an int >= 1, got {self.block_width!r}"
            )

    def check_layout(self, action_dim: int) -> None:
        """Refuse an action width this reducer cannot handle.

        Args:
            action_dim (`int`): The action width ``D`` the reducer will see (after padding is dropped).

        Raises:
            ReducerLayoutError: If ``action_dim`` is not a positive int, or not a multiple of ``block_width``.
        """
        if isinstance(action_dim, bool) or not isinstance(action_dim, int) or action_dim < 1:
            raise ReducerLayoutError(f"reducer {self.name!r}: action width must be an int >= 1, got {action_dim!r}")
        if self.block_width is not None and action_dim % self.block_width != 0:
            raise ReducerLayoutError(
                f"reducer {self.name!r} needs an action width that is a positive multiple of {self.block_width}, "
                f"got width {action_dim}"
            )

    def check_space(self, space: str) -> None:
        """Refuse to reduce in a space where this reducer is not valid.

        Args:
            space (`str`): ``"normalized"`` or ``"raw"``: where the adapter reduces.

        Raises:
            InvalidSpecError: If ``space`` is neither ``"normalized"`` nor ``"raw"``.
            ReducerLayoutError: If this reducer is not valid in ``space``.
        """
        if space not in ("normalized", "raw"):
            raise InvalidSpecError(f"reduction space must be 'normalized' or 'raw', got {space!r}")
        if self.space not in ("any", space):
            raise ReducerLayoutError(
                f"reducer {self.name!r} is valid only in {self.space!r} space, "
                f"but this model reduces in {space!r} space"
            )

    def __call__(self, candidates: torch.Tensor, reference: ContinuityReference | None = None) -> torch.Tensor:
        """Reduce candidates to one trajectory.

        Args:
            candidates (`torch.Tensor` of shape `[N, H, D]`): Floating point, ``N >= 1``, ordered by candidate id.
            reference (`ContinuityReference`, *optional*): The previous chunk to continue; used only by
                ``uses_context`` reducers, ignored by the others.

        Returns:
            `torch.Tensor` of shape `[H, D]`: The reduced trajectory, in the input dtype and on the input device.

        Raises:
            InvalidSpecError: If ``candidates`` is not a floating tensor of shape ``[N, H, D]`` with positive sizes.
            ReducerLayoutError: If ``D`` does not fit :attr:`block_width`.
            NonFiniteCandidatesError: If any element is NaN or Inf.
        """
        if not isinstance(candidates, torch.Tensor):
            raise InvalidSpecError(f"reducer {self.name!r} expects a torch.Tensor, got {type(candidates).__name__}")
        if candidates.ndim != 3 or min(candidates.shape) < 1:
            raise InvalidSpecError(
                f"reducer {self.name!r} expects candidates of shape [N, H, D] with N, H, D >= 1, "
                f"got shape {tuple(candidates.shape)}"
            )
        if not candidates.is_floating_point():
            raise InvalidSpecError(f"reducer {self.name!r} expects a floating tensor, got dtype {candidates.dtype}")
        self.check_layout(candidates.shape[-1])
        check_finite(candidates)
        # Half precision cannot hold sums of many candidates (or SVD inputs) accurately.
        work = candidates if candidates.dtype in (torch.float32, torch.float64) else candidates.float()
        if self.uses_context:
            if reference is not None:
                reference.check(tuple(candidates.shape[1:]))
            reduced = self.fn(work, reference)
        else:
            reduced = self.fn(work)
        if tuple(reduced.shape) != tuple(candidates.shape[1:]):
            raise InvalidSpecError(
                f"reducer {self.name!r} returned shape {tuple(reduced.shape)}, expected {tuple(candidates.shape[1:])}"
            )
        return reduced.to(candidates.dtype)


@dataclass(frozen=True)
class ContinuityReference:
    """What a continuity-aware reducer compares candidates with.

    Args:
        target (`torch.Tensor` of shape `[H, D]`): The previous chunk's actions at the new chunk's times (any
            value where ``weights`` is 0), in the space the reducer runs in.
        weights (`torch.Tensor` of shape `[H]`): Per-action weights in ``[0, 1]`` (1 frozen, ramp, 0).
    """

    target: torch.Tensor
    weights: torch.Tensor

    def __post_init__(self) -> None:
        for name, value, ndim in (("target", self.target, 2), ("weights", self.weights, 1)):
            if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.ndim != ndim:
                raise InvalidSpecError(f"continuity reference {name} must be a floating {ndim}-D tensor, got {value!r}")
            if not bool(torch.isfinite(value).all()):
                raise NonFiniteCandidatesError(f"continuity reference {name} holds NaN or Inf")
        if self.weights.shape[0] != self.target.shape[0]:
            raise InvalidSpecError(
                f"continuity reference weights {tuple(self.weights.shape)} do not match target {tuple(self.target.shape)}"
            )
        if bool((self.weights < 0).any()) or bool((self.weights > 1).any()):
            raise InvalidSpecError(f"continuity reference weights must lie in [0, 1], got {self.weights.tolist()}")

    def check(self, shape: tuple[int, ...]) -> None:
        """Refuse a reference that does not match candidates of per-candidate ``shape`` ``(H, D)``."""
        if tuple(self.target.shape) != tuple(shape):
            raise InvalidSpecError(
                f"continuity reference has shape {tuple(self.target.shape)}, candidates have {tuple(shape)}"
            )


def check_finite(tensor: torch.Tensor, what: str = "candidates") -> None:
    """Raise if ``tensor`` holds NaN or Inf: the one finiteness rule for candidates and results.

    Args:
        tensor (`torch.Tensor` of shape `[N, ...]`): Candidates (or an action's rows) along dim 0.
        what (`str`, defaults to `"candidates"`): What ``tensor`` is, for the message (e.g. ``"action"``).

    Raises:
        NonFiniteCandidatesError: Naming how many elements are non-finite and at which positions along dim 0.
    """
    bad = ~torch.isfinite(tensor)
    if bool(bad.any()):
        per_position = bad.reshape(tensor.shape[0], -1).any(dim=1)
        positions = per_position.nonzero().flatten().tolist()
        raise NonFiniteCandidatesError(
            f"{int(bad.sum())} non-finite (NaN/Inf) element(s) of {tensor.numel()} in {what} at position(s) "
            f"{positions} of {tensor.shape[0]}; refusing to reduce or publish them"
        )


# --- registry -----------------------------------------------------------------------------------------------------

_REGISTRY: dict[str, Reducer] = {}


def register_reducer(reducer: Reducer, *, replace: bool = False) -> Reducer:
    """Add a reducer to the registry so requests can name it.

    Args:
        reducer (`Reducer`): The reducer to add.
        replace (`bool`, defaults to `False`): Allow replacing a reducer of the same name.

    Returns:
        `Reducer`: ``reducer``, so this can be used inline.

    Raises:
        InvalidSpecError: If ``reducer`` is not a :class:`Reducer`, or the name is taken and ``replace`` is False.
    """
    if not isinstance(reducer, Reducer):
        raise InvalidSpecError(f"register_reducer expects a Reducer, got {reducer!r}")
    if reducer.name in _REGISTRY and not replace:
        raise InvalidSpecError(f"reducer {reducer.name!r} is already registered; pass replace=True to replace it")
    _REGISTRY[reducer.name] = reducer
    return reducer


def get_reducer(name: str) -> Reducer:
    """Look a reducer up by name.

    Args:
        name (`str`): A registered name.

    Returns:
        `Reducer`: The registered reducer.

    Raises:
        UnknownReducerError: If ``name`` is not registered; the message lists the known names.
    """
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownReducerError(
            f"unknown reducer {name!r}; registered reducers: {', '.join(available_reducers())}"
        ) from None


def available_reducers() -> tuple[str, ...]:
    """Names of all registered reducers, sorted."""
    return tuple(sorted(_REGISTRY))


# --- built-in reducers --------------------------------------------------------------------------------------------


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


def mode_clusters(
    candidates: torch.Tensor, threshold: float = MODE_DISTANCE_THRESHOLD
) -> tuple[tuple[int, ...], ...]:
    """Cluster candidates deterministically by complete-linkage agglomeration, cut at ``threshold``.

    Distance between two candidates is their RMS elementwise difference, ``||x_i - x_j||_F / sqrt(H * D)``: in
    action units, independent of horizon and width. Start with singletons; repeatedly merge the two clusters whose
    complete-linkage distance (the largest pairwise distance between their members) is smallest, as long as it is
    ``<= threshold``. Equal distances go to the pair whose lowest members are lexicographically smallest. Every
    cluster therefore has diameter ``<= threshold``.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        threshold (`float`, defaults to `MODE_DISTANCE_THRESHOLD`): Largest RMS distance inside one cluster, ``>= 0``.

    Returns:
        `tuple[tuple[int, ...], ...]`: Clusters as ascending candidate positions, ordered by their lowest position.
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < math.inf:
        raise InvalidSpecError(f"mode threshold must be a finite number >= 0, got {threshold!r}")
    n = candidates.shape[0]
    elements = candidates[0].numel()
    linkage = _pairwise_distances(candidates) / math.sqrt(elements)
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


def mode_reduce(candidates: torch.Tensor, threshold: float = MODE_DISTANCE_THRESHOLD) -> torch.Tensor:
    """``mode``: the mean of the largest cluster of :func:`mode_clusters`, so a bimodal set yields one of its modes,
    never the midpoint between them.

    Rule: cluster with complete linkage at ``threshold`` (default 0.2 RMS, i.e. 10% of a [-1, 1] normalized range);
    keep the cluster with the most members; if several are equally large, keep the one holding the lowest candidate
    position; return the elementwise mean of its members. Consequences: ``N = 1`` returns that candidate; identical
    candidates form one cluster (the mean of all); if every pair is farther apart than ``threshold`` all clusters are
    singletons and the result is candidate 0. The threshold is in the units of the candidates, which is why this
    reducer is declared for normalized space. For another threshold, register a variant, e.g.
    ``Reducer("mode_wide", functools.partial(mode_reduce, threshold=0.4), streaming=False, space="normalized")``.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Finite candidates.
        threshold (`float`, defaults to `MODE_DISTANCE_THRESHOLD`): See :func:`mode_clusters`.

    Returns:
        `torch.Tensor` of shape `[H, D]`.
    """
    clusters = mode_clusters(candidates, threshold)
    # max() keeps the first of equal keys, and clusters are ordered by lowest position.
    largest = max(clusters, key=len)
    index = torch.tensor(largest, device=candidates.device)
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


for _builtin in (
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
        description="mean of the largest complete-linkage cluster (RMS threshold 0.2)",
    ),
    Reducer(
        "pose_gripper",
        pose_gripper_reduce,
        streaming=False,
        space="raw",
        block_width=POSE_GRIPPER_BLOCK,
        description="per 10-wide block: mean translation, chordal-mean rotation, median gripper",
    ),
):
    register_reducer(_builtin)
del _builtin

# Registers the continuity-aware reducers (they build on mode_clusters and medoid_reduce above).
from . import continuity as _continuity  # noqa: E402,F401
