"""The model adapter protocol: what the engine needs from a model, and what a model must declare.

The engine owns this protocol and model packages implement it, so the dependency points one way. The engine owns
grouping, candidate identity, seeds, batching, cancellation, failure and metrics; the adapter owns everything
model-specific (encode once, one physical forward over group slices, one step, post-processing). No tensor names here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class AdapterCapabilities:
    """What a model adapter declares about its candidate output.

    Args:
        candidate_tensor (`str`): Name of the tensor that is the candidate action (documentation and metrics).
        reduce_before_denormalize (`bool`): Reducers declared valid in ``"any"`` or ``"normalized"`` space run on
            normalized model outputs when True; ``"raw"`` reducers always run after denormalization.
        valid_reducers (`tuple[str, ...]`): Reducer names valid for this action space (checked with each reducer's
            own ``check_layout`` for the request's action width by ``contract.check_request``).
        candidate_invariant (`tuple[str, ...]`): Conditioning encoded once per group, shared by all candidates.
        auxiliary_branch (`str`, *optional*): A branch denoised alongside the action (e.g. ``"video"``).
        auxiliary_required_for_action (`bool`): Whether that branch must run for the action to be correct.
        auxiliary_decode_skippable (`bool`): Whether its decode can be skipped when only actions are served.
        uses_state (`bool`): Whether the model consumes proprioceptive state (``JointState``).
        state_names (`tuple[str, ...]`): With ``uses_state``, the state's channels in the order the model reads them
            (its width is their count); faces pick the values by these names.
        context_guidance (`tuple[str, ...]`): Guidance modes (``engine.context.GUIDANCE_MODES``) with which the
            adapter honours an execution context; empty: it refuses one.
    """

    candidate_tensor: str
    reduce_before_denormalize: bool
    valid_reducers: tuple[str, ...]
    candidate_invariant: tuple[str, ...] = ()
    auxiliary_branch: str | None = None
    auxiliary_required_for_action: bool = False
    auxiliary_decode_skippable: bool = True
    uses_state: bool = False
    state_names: tuple[str, ...] = ()
    context_guidance: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class DenoiseState(Protocol):
    """Adapter-owned denoising state of one admitted group (or one sequential-fallback part of it).

    Its latents, velocities and stepper as the group steps; the engine holds it as ``GroupRun.state`` and hands it
    back to the adapter. Not :class:`~trajectory_ensemble_node.engine.status.GroupStatus`, which says how far a group
    got and how it ended.
    """

    count: int
    step_index: int
    num_steps: int


@dataclass(frozen=True)
class Slice:
    """Candidates ``[start, stop)`` of one group's denoise state, to be run in one physical forward."""

    state: Any
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


class ForwardAborted(Exception):
    """Raised by an adapter's ``forward`` when its ``should_abort`` callback turned true mid-forward.

    Control flow between adapter and engine, never a failure: every group in that forward was canceled, so the rest of
    the forward would be wasted. Adapters check it at a fine grain (e.g. per transformer layer) so a cancel lands in a
    fraction of a step.
    """


OBSERVATION_EMBEDDING = "observation_embedding"
"""Key of :attr:`CandidateOutput.extras` under which an adapter asked for one returns the group's observation
embedding (a flat float32 CPU tensor, computed from features its serving pass already has); the engine scores its
novelty when the request carries a :class:`~trajectory_ensemble_node.uncertainty.NoveltyCheck`."""


@dataclass
class CandidateOutput:
    """What an adapter hands back when a group finishes.

    Args:
        candidates (`torch.Tensor` of shape `[N, H, D]`): Float32 CPU candidates in the model's normalized action
            space, padding channels already dropped, ordered by candidate id.
        extras (`dict`): Adapter-specific outputs (e.g. a rollout record).
    """

    candidates: torch.Tensor
    extras: dict[str, Any] = field(default_factory=dict)


class CandidateModelAdapter(Protocol):
    """The engine-facing side of a model. All methods run on the engine's thread."""

    capabilities: AdapterCapabilities

    @property
    def weights_version(self) -> int: ...

    def prepare(self, payload: Any, generators: Sequence[torch.Generator]) -> DenoiseState:
        """Encode (or reuse) the payload's candidate-invariant conditioning; draw each candidate's noise."""
        ...

    def forward(self, slices: Sequence[Slice], should_abort: Callable[[], bool] | None = None) -> int:
        """Run the model over ``slices`` (possibly of several groups) and store their velocities.

        ``should_abort`` turns true when every group in the forward has been canceled; the adapter may then raise
        :class:`ForwardAborted` at any point (without storing anything). Returns the number of physical model
        forwards it took (1 when everything fits one forward).
        """
        ...

    def step(self, state: DenoiseState) -> None:
        """Advance a group by one denoising step once all of its candidates' velocities are in."""
        ...

    def finish(self, state: DenoiseState) -> CandidateOutput:
        """Post-process a finished group's candidates."""
        ...

    def release(self, state: DenoiseState) -> None:
        """Drop a group's buffers (called for finished, canceled and failed groups)."""
        ...
