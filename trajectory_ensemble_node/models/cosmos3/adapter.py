"""The engine-facing Cosmos 3 adapter: one physical forward over candidate slices of one or more groups.

Per group it holds the stacked candidate latents ``[N, ...]`` and a private stepper state. Per physical forward it
packs every slice's blocks (both CFG branches, cond and uncond prefixes of any lengths) into one sequence, runs the
transformer once with the fan-out attention layout, and stores each group's masked velocities. The group's step
then applies CFG and its stepper, exactly as the upstream loop does for one sample.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline, CosmosActionCondition

from ...contract import allowed_reducers
from ...engine.adapter import OBSERVATION_EMBEDDING, AdapterCapabilities, CandidateOutput, Slice
from ...errors import ContextUnsupportedError, InvalidSpecError, UnsupportedModeError
from .attention import install_fanout
from .prefix_cache import PrefixKVCache
from .capture import StepCapture, check_step_capture
from .conditioning import GroupConditioning, draw_initial_latents, encode_conditioning
from .embedding import observation_embedding
from .guidance import GroupGuidance, condition_frozen_prefix, vjp_velocity
from .layers import default_row_block_rows, install_row_blocks
from .workers import ForwardWorkers, resolve_forward_threads
from .packing import PackItem, pack_forward, split_predictions
from .rollout import RolloutError, RolloutSpec, RolloutStepper, build_rollout_scheduler
from .state import StateInput, declared_state_input
from .steppers import GroupStepper, PipelineStepper


@dataclass
class Cosmos3Request:
    """The model-specific half of a group request (what upstream ``__call__`` takes, minus the generator).

    The conditioning is encoded on first use and cached here, so retries and sequential-fallback parts of the same
    group reuse it instead of encoding again.
    """

    prompt: str
    action: CosmosActionCondition
    num_inference_steps: int
    guidance_scale: float
    fps: float
    negative_prompt: str | None = None
    use_system_prompt: bool | None = None
    rollout: RolloutSpec | None = None
    # Identity of the group, recorded in rollout files (the adapter otherwise never needs it).
    request_id: str = ""
    seeds: tuple[int, ...] = ()
    candidate_ids: tuple[int, ...] = ()
    # None: the adapter's own step_capture (see ``capture.py``).
    step_capture: str | None = None
    conditioning: GroupConditioning | None = field(default=None, repr=False)
    # The chunk being executed (``engine.context.ExecutionContext``); None serves exactly as before.
    context: Any = None
    # Novelty: return the observation embedding pooled to this grid (``embedding.py``); None computes nothing.
    embedding_grid: int | None = None
    # The robot's state, declared order and units (``state.py``); read only when the adapter has a state input.
    state: tuple[float, ...] | None = None


@dataclass
class Cosmos3DenoiseState:
    """Stacked candidate latents and stepper state of one admitted group."""

    request: Cosmos3Request
    conditioning: GroupConditioning
    stepper: GroupStepper
    vision: torch.Tensor
    action: torch.Tensor
    count: int
    num_steps: int
    step_index: int = 0
    # Masked velocities of the current step, per CFG branch: filled slice by slice, consumed by ``step``.
    velocity_vision: list[torch.Tensor | None] = field(default_factory=list)
    velocity_action: list[torch.Tensor | None] = field(default_factory=list)
    fuse_cfg: bool = True
    # Deadlines (engine/deadline.py): steps the request asked for, and the clean-action estimate of the last step,
    # kept only once the engine re-scheduled or may stop the group early.
    steps_requested: int | None = None
    anytime: bool = False
    clean_action: torch.Tensor | None = None
    guidance: GroupGuidance | None = None


CFG_MODES = ("auto", "fused", "separate")


class Cosmos3Adapter:
    """Implements :class:`~trajectory_ensemble_node.engine.adapter.CandidateModelAdapter` for ``Cosmos3OmniPipeline``.

    Args:
        pipe (`Cosmos3OmniPipeline`): Tiny or real; its transformer gets the fan-out attention processor, which
            behaves exactly like the stock one outside our forwards.
        cfg_mode (`str`): Topology of classifier-free guidance. ``"fused"`` runs both branches of every candidate in
            ONE forward per step. ``"separate"`` runs the cond blocks and the uncond blocks as two forwards.
            ``"auto"`` (default) fuses groups of more than one candidate and keeps ``count=1`` groups separate.
        prefix_cache (`bool`), prefix_retain (`int`), row_block_rows (`int | str`, *optional*), step_capture
        (`str`; a request's own overrides it), forward_threads (`int | str`, *optional*), state_input
            (`StateInput`, *optional*): As :class:`~.model.Cosmos3ActionModel`. With a state input, each group's
            conditioning gets the state frame, and ``capabilities`` say ``uses_state=True`` with its ``state_names``.

    Why ``auto`` keeps ``count=1`` separate: BLAS libraries (MKL, cuBLAS) pick GEMM kernels by row count, and a
    row's result can change in the last bits with the kernel. A lone candidate with separate branches has exactly
    the row counts of an upstream call, so it is bitwise equal to it; fused, it is equal within the equivalence
    rule but not always bitwise. Larger groups change row counts anyway, so they take the fused forward.
    """

    capabilities = AdapterCapabilities(
        candidate_tensor="action_latents[:, :, :raw_action_dim]",
        reduce_before_denormalize=True,
        valid_reducers=("mean", "median", "medoid", "trimmed_mean", "pose_gripper", "mode", "backward_coherence",
                        "mode_continuity"),
        candidate_invariant=(
            "prompt tokens (cond and uncond)",
            "VAE latent of the conditioning frame",
            "packed static segments (positions, indexes)",
        ),
        auxiliary_branch="video",
        # The action tokens attend to the video tokens at every step, so the video must still be denoised...
        auxiliary_required_for_action=True,
        # ...but its VAE decode is never needed to serve actions.
        auxiliary_decode_skippable=True,
        uses_state=False,
        context_guidance=("prefix", "mask", "vjp", "none"),
    )

    def __init__(self, pipe: Cosmos3OmniPipeline, *, cfg_mode: str = "auto", prefix_cache: bool = True,
                 prefix_retain: int = 8, row_block_rows: int | str | None = "auto",
                 step_capture: str = "off", forward_threads: int | str | None = "auto",
                 state_input: StateInput | None = None) -> None:
        if cfg_mode not in CFG_MODES:
            raise InvalidSpecError(f"cfg_mode must be one of {list(CFG_MODES)}, got {cfg_mode!r}.")
        if not (row_block_rows is None or row_block_rows == "auto"
                or (isinstance(row_block_rows, int) and not isinstance(row_block_rows, bool) and row_block_rows >= 0)):
            raise InvalidSpecError(f"row_block_rows must be 'auto', None or an int >= 0, got {row_block_rows!r}.")
        if getattr(pipe.transformer, "_cp_shard_fn", None) is not None:
            raise UnsupportedModeError("Candidate fan-out does not support context-parallel transformers.")
        self.pipe = pipe
        self.transformer = pipe.transformer
        self.processor = install_fanout(pipe.transformer)
        install_row_blocks(pipe.transformer)
        self.device = pipe._get_execution_device()
        # Token-wise layer work in candidate-sized row ranges (see ``layers.py``); 0 or None runs whole layers.
        if row_block_rows == "auto":
            row_block_rows = default_row_block_rows(self.device)
        self.row_block_rows: int | None = row_block_rows or None
        try:
            threads = resolve_forward_threads(forward_threads, self.device)
        except ValueError as error:
            raise InvalidSpecError(str(error)) from None
        # Co-batched forwards' row blocks and attention runs on the cores intra-op threads leave free (``workers.py``).
        self.forward_workers: ForwardWorkers | None = ForwardWorkers(threads) if threads > 1 else None
        self.generator_device: torch.device | str = self.device
        self.cfg_mode = cfg_mode
        # The text pathway never sees generation tokens, so each prefix's per-layer keys/values are computed at a
        # group's first step and reused for every later step, and by later groups with the same instruction
        # (identical values, so bitwise-neutral).
        self.prefix_cache = PrefixKVCache(retain=prefix_retain) if prefix_cache else None
        self._weights_version = 0
        self.step_capture_mode = check_step_capture(step_capture, self.device)
        self.step_capture = StepCapture(pipe.transformer, self.processor, row_block_rows=self.row_block_rows)
        self.state_input = state_input if state_input is not None else declared_state_input(pipe)
        if self.state_input is not None:
            # Per instance: the class attribute stays the declaration of a checkpoint without state.
            self.capabilities = dataclasses.replace(
                type(self).capabilities, uses_state=True, state_names=self.state_input.names,
                candidate_invariant=(*type(self).capabilities.candidate_invariant, "state latent frame"))

    # --- declared properties ----------------------------------------------------------------------------------------

    @property
    def weights_version(self) -> int:
        return self._weights_version

    def bump_weights_version(self) -> int:
        # Updates land between groups, so nothing should be cached; clearing makes stale keys impossible anyway.
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        self._weights_version += 1
        return self._weights_version

    @property
    def model_dtype(self) -> torch.dtype:
        return self.transformer.dtype

    def valid_reducers(self) -> tuple[str, ...]:
        """Declared reducers that are registered (layout checks happen per request)."""
        return allowed_reducers(self.capabilities.valid_reducers)

    # --- engine protocol -------------------------------------------------------------------------------------------

    def encode(self, request: Cosmos3Request) -> GroupConditioning:
        """Encode (once) the candidate-invariant conditioning of ``request``."""
        if request.conditioning is None:
            request.conditioning = encode_conditioning(
                self.pipe,
                prompt=request.prompt,
                negative_prompt=request.negative_prompt,
                action=request.action,
                fps=request.fps,
                guidance_scale=request.guidance_scale,
                device=self.device,
                use_system_prompt=request.use_system_prompt,
                state_input=self.state_input,
                state=request.state,
            )
        return request.conditioning

    def make_stepper(
        self, request: Cosmos3Request, conditioning: GroupConditioning, generators: Sequence[torch.Generator]
    ) -> GroupStepper:
        native = bool(self.pipe.config.use_native_flow_schedule)
        if request.rollout is None:
            return PipelineStepper(self.pipe.scheduler, request.num_inference_steps, self.device,
                                   use_native_flow_schedule=native, has_action=True)
        if len(generators) != len(request.seeds):
            raise RolloutError(
                "a rollout group must run as one group (batched or microbatched); the sequential fallback would "
                "split it into separate records."
            )
        scheduler = build_rollout_scheduler(self.pipe.scheduler, request.num_inference_steps, self.device,
                                            flow_shift=request.rollout.flow_shift, use_native_flow_schedule=native)
        return RolloutStepper(request.rollout, scheduler, conditioning, generators)

    def prepare(self, payload: Cosmos3Request, generators: Sequence[torch.Generator]) -> Cosmos3DenoiseState:
        conditioning = self.encode(payload)
        guidance = None
        if payload.context is not None:
            if payload.rollout is not None:
                raise ContextUnsupportedError("an execution context cannot guide a rollout group")
            guidance = GroupGuidance.build(payload.context, conditioning, self.device)
            if guidance.mode == "mask":
                conditioning = condition_frozen_prefix(conditioning, guidance)
        vision, action = draw_initial_latents(conditioning, generators, self.device)
        # Built after the initial noise: rollout SDE noise continues each candidate's own generator stream.
        stepper = self.make_stepper(payload, conditioning, generators)
        branches = len(conditioning.branches)
        state = Cosmos3DenoiseState(
            request=payload,
            conditioning=conditioning,
            stepper=stepper,
            vision=vision,
            action=action,
            count=len(generators),
            num_steps=stepper.num_steps,
            velocity_vision=[None] * branches,
            velocity_action=[None] * branches,
            fuse_cfg=self.cfg_mode == "fused" or (self.cfg_mode == "auto" and len(generators) > 1),
            guidance=guidance,
        )
        return state

    def forward(self, slices: Sequence[Slice], should_abort: Callable[[], bool] | None = None) -> int:
        """Run the slices' blocks; returns the number of transformer forwards (1, or 2 with separate CFG).

        ``should_abort`` is checked at every attention layer (see ``FanoutAttnProcessor.use_layout``).
        """
        dtype = self.model_dtype
        passes: tuple[list[PackItem], list[PackItem]] = ([], [])
        targets: tuple[list[tuple[Cosmos3DenoiseState, int, int, int, torch.Tensor | None]], ...] = ([], [])
        for piece in slices:
            state: Cosmos3DenoiseState = piece.state
            timestep = state.stepper.timesteps[state.step_index].item()
            vision = state.vision[piece.start : piece.stop].to(device=self.device, dtype=dtype)
            leaf = None
            if state.guidance is not None and state.guidance.mode == "vjp":
                # RTC pulls the gap back through the model: the action latents are the leaf of that graph.
                leaf = state.action[piece.start : piece.stop].detach().clone().requires_grad_(True)
                action = leaf.to(device=self.device, dtype=dtype)
            else:
                action = state.action[piece.start : piece.stop].to(device=self.device, dtype=dtype)
            for branch_index, branch in enumerate(state.conditioning.branches):
                which = 0 if (state.fuse_cfg or branch_index == 0) else 1
                passes[which].append(PackItem(branch=branch, vision=vision, action=action, timestep=timestep))
                targets[which].append((state, branch_index, piece.start, piece.stop, leaf))
        ran = 0
        for items, item_targets in zip(passes, targets):
            if items:
                self._run_pass(items, item_targets, should_abort)
                ran += 1
        return ran

    @contextlib.contextmanager
    def _graph_for(self, needed: bool) -> Iterator[None]:
        # Only the action latents get a graph: the weights stay out of it, so the prefix keys/values cached in a
        # step are plain tensors and the backward computes nothing for the parameters.
        if not needed:
            yield
            return
        params = [p for p in self.transformer.parameters() if p.requires_grad]
        for p in params:
            p.requires_grad_(False)
        try:
            with torch.enable_grad():
                yield
        finally:
            for p in params:
                p.requires_grad_(True)

    def _run_pass(
        self,
        items: list[PackItem],
        targets: list[tuple[Cosmos3DenoiseState, int, int, int, torch.Tensor | None]],
        should_abort: Callable[[], bool] | None,
    ) -> None:
        cache = self.prefix_cache
        prefixes = {id(item.branch.prefix): item.branch.prefix for item in items}  # insertion order = packing order
        if cache is not None:
            pending = [(key, prefix.content_key) for key, prefix in prefixes.items() if not cache.is_complete(key)]
            if pending:
                cache.adopt(pending)
        rtc = any(target[4] is not None for target in targets)
        # Packing too runs under the graph: the packed action tokens are views of the RTC leaf.
        with self._graph_for(rtc):
            packed = pack_forward(items, self.device, cached=cache.is_complete if cache is not None else None)
            # Co-batched groups that disagree on step_capture run eagerly: it computes the same either way. An RTC
            # forward runs eagerly too: its vector-Jacobian product needs the autograd graph a replay does not keep.
            modes = {state.request.step_capture or self.step_capture_mode for state, *_ in targets}
            capture_mode = modes.pop() if len(modes) == 1 and not rtc else "off"
            # A captured stack replays one thread's kernels: workers only for eager forwards.
            workers = self.forward_workers if capture_mode == "off" else None
            with (self.processor.use_layout(packed.layout, should_abort, cache, self.row_block_rows, workers),
                  self.step_capture.active(capture_mode)):
                preds_vision, _, preds_action = self.transformer(**packed.kwargs, return_dict=False)
            self._store(packed, targets, preds_vision, preds_action)
        if cache is not None:
            computed = packed.layout.computed
            cache.commit(slot.key for slot in computed)
            cache.retain_forward([(slot.key, prefixes[slot.key].content_key) for slot in computed])

    def _store(
        self,
        packed: Any,
        targets: list[tuple[Cosmos3DenoiseState, int, int, int, torch.Tensor | None]],
        preds_vision: torch.Tensor,
        preds_action: torch.Tensor,
    ) -> None:
        # Masked velocities per slice; an RTC group's are corrected here, while its graph is still alive.
        for (state, branch_index, start, stop, leaf), pred_v, pred_a in zip(
            targets, split_predictions(packed, preds_vision), split_predictions(packed, preds_action)
        ):
            velocity_v, velocity_a = self._mask(state.conditioning, pred_v, pred_a)
            if leaf is not None:
                sigma = float(state.stepper.sigmas[state.step_index])
                velocity_a, _ = vjp_velocity(state.guidance, leaf, velocity_a, sigma)
                velocity_v = velocity_v.detach()
            if state.velocity_vision[branch_index] is None:
                state.velocity_vision[branch_index] = velocity_v.new_empty((state.count, *velocity_v.shape[1:]))
                state.velocity_action[branch_index] = velocity_a.new_empty((state.count, *velocity_a.shape[1:]))
            state.velocity_vision[branch_index][start:stop] = velocity_v
            state.velocity_action[branch_index][start:stop] = velocity_a

    @staticmethod
    def _mask(
        conditioning: GroupConditioning, pred_v: torch.Tensor, pred_a: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Same ops, dtype and order as upstream ``_mask_velocity_predictions``, over a stack of candidates.
        noisy_v = (1.0 - conditioning.vision_mask).to(dtype=pred_v.dtype, device=pred_v.device)
        velocity_v = pred_v * noisy_v if noisy_v.sum() > 0 else torch.zeros_like(pred_v)
        noisy_a = (1.0 - conditioning.action_mask).to(dtype=pred_a.dtype, device=pred_a.device)
        velocity_a = pred_a * noisy_a if noisy_a.sum() > 0 else torch.zeros_like(pred_a)
        velocity_a[:, :, conditioning.raw_action_dim :] = 0
        return velocity_v.float(), velocity_a.float()

    def combined_velocity(self, state: Cosmos3DenoiseState) -> tuple[torch.Tensor, torch.Tensor]:
        """Classifier-free guidance over the stacked candidates (elementwise, as upstream)."""
        cond_v, cond_a = state.velocity_vision[0], state.velocity_action[0]
        if len(state.conditioning.branches) == 1:
            return cond_v, cond_a
        scale = state.request.guidance_scale
        uncond_v, uncond_a = state.velocity_vision[1], state.velocity_action[1]
        return uncond_v + scale * (cond_v - uncond_v), uncond_a + scale * (cond_a - uncond_a)

    def step(self, state: Cosmos3DenoiseState) -> None:
        velocity_v, velocity_a = self.combined_velocity(state)
        has_noisy_action = state.conditioning.has_noisy_action
        guidance = state.guidance
        if guidance is not None and guidance.mode in ("prefix", "mask") and has_noisy_action:
            sigma = float(state.stepper.sigmas[state.step_index])
            velocity_a = guidance.prefix_velocity(state.action, velocity_a, sigma)
        if state.anytime and has_noisy_action:
            # Flow prediction (``prediction_type="flow_prediction"``): x0 = x_t - sigma_t * v, exactly what UniPC's
            # ``convert_model_output`` uses as this step's clean estimate.
            sigma = state.stepper.sigmas[state.step_index].to(state.action.device, state.action.dtype)
            state.clean_action = state.action - sigma * velocity_a.to(state.action.dtype)
        state.vision, action = state.stepper.step(
            state.step_index,
            velocity_v,
            state.vision,
            velocity_a if has_noisy_action else None,
            state.action,
        )
        if has_noisy_action:
            action[:, :, state.conditioning.raw_action_dim :] = 0
        state.action = action
        state.velocity_vision = [None] * len(state.velocity_vision)
        state.velocity_action = [None] * len(state.velocity_action)
        state.step_index += 1

    def reschedule(self, state: Cosmos3DenoiseState, steps: int) -> None:
        """Deadlines: before the first step, run the group with ``steps`` steps (the schedule of a ``steps`` request).

        Raises:
            InvalidSpecError: after the first step, for rollouts (their log-probs need the full grid), or a bad count.
        """
        if state.step_index != 0 or state.request.rollout is not None or not 1 <= steps <= state.num_steps:
            raise InvalidSpecError(
                f"cannot re-schedule to {steps!r} steps (step {state.step_index} of {state.num_steps}, "
                f"rollout={state.request.rollout is not None})"
            )
        state.steps_requested = state.steps_requested or state.num_steps
        state.stepper = PipelineStepper(self.pipe.scheduler, steps, self.device,
                                        use_native_flow_schedule=bool(self.pipe.config.use_native_flow_schedule),
                                        has_action=True)
        state.num_steps = steps
        state.anytime = True

    def enable_anytime(self, state: Cosmos3DenoiseState) -> None:
        """Keep each step's clean-action estimate so the group can stop early (costs one ``[N, A, D]`` tensor)."""
        if state.request.rollout is not None:
            raise InvalidSpecError("a rollout cannot stop early: its log-probs need the full grid")
        state.anytime = True

    def finish_now(self, state: Cosmos3DenoiseState) -> None:
        """Deadlines: end the group at the step just taken, its candidates being that step's clean estimate."""
        if state.clean_action is None:
            raise InvalidSpecError("no clean-action estimate to finish from (no step taken, or anytime was off)")
        state.steps_requested = state.steps_requested or state.num_steps
        action = state.clean_action
        action[:, :, state.conditioning.raw_action_dim :] = 0
        state.action = action
        state.num_steps = state.step_index

    def finish(self, state: Cosmos3DenoiseState) -> CandidateOutput:
        candidates = state.action[:, :, : state.conditioning.raw_action_dim].detach().to("cpu", torch.float32)
        extras: dict[str, Any] = {"num_inference_steps": state.num_steps}
        if state.conditioning.state_clipped is not None:
            extras["state_clipped"] = state.conditioning.state_clipped
        if state.request.embedding_grid is not None:
            extras[OBSERVATION_EMBEDDING] = observation_embedding(state.conditioning, state.request.embedding_grid)
        if state.steps_requested is not None:
            extras["steps_requested"] = state.steps_requested
            extras["steps_used"] = state.num_steps
        if isinstance(state.stepper, RolloutStepper):
            request = state.request
            extras["rollout"] = state.stepper.result(
                request_id=request.request_id,
                seeds=request.seeds,
                candidate_ids=request.candidate_ids,
                weights_version=self.weights_version,
                guidance_scale=request.guidance_scale,
                domain_name=request.action.domain_name,
            )
        return CandidateOutput(candidates=candidates, extras=extras)

    def release(self, state: Cosmos3DenoiseState) -> None:
        state.velocity_vision = []
        state.velocity_action = []
        if self.prefix_cache is not None:
            self.prefix_cache.drop(id(branch.prefix) for branch in state.conditioning.branches)
