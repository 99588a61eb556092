"""What every reducer is: the :class:`Reducer` record with the properties the runtime checks, the
:class:`ContinuityReference` a continuity-aware reducer compares with, and the one finiteness rule."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import InvalidSpecError, NonFiniteCandidatesError, ReducerLayoutError

REDUCER_SPACES = ("normalized", "raw", "any")
"""Values of :attr:`Reducer.space`. An adapter reduces in ``"normalized"`` or ``"raw"`` space."""


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
