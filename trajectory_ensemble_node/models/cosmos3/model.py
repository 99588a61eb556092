"""``Cosmos3ActionModel``: N candidate action chunks from any diffusers ``Cosmos3OmniPipeline``, in one batch."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline, CosmosActionCondition

from ...contract import DEFAULT_MAX_CANDIDATES, CandidateTrajectorySpec, EnsembleResult
from ...engine import ExecutionContext, GroupHandle, GroupRequest, ProgressEvent, ValidityPolicy
from ...engine.request import new_group
from ...engine.validity import request_check
from ...errors import InvalidSpecError
from ...normalization import ActionNormalizer
from ...reducers import check_mode_threshold
from ...safety import ActionLimits, load_limits
from ...uncertainty import AlarmRule, NoveltyCheck, alarm_in_force
from ...service import EnsembleService
from .adapter import Cosmos3Adapter, Cosmos3Request
from .capture import check_step_capture
from .conditioning import check_action_request, check_state_slot, encode_conditioning, min_image_side, token_counter
from .embedding import DEFAULT_EMBEDDING_GRID, check_novelty_scorer, observation_embedding
from .guidance import check_context
from .rollout import RolloutSpec
from .state import StateInput
from .weights import apply_update, fuse_qkv_projections, load_update_source, plan_update


@dataclass(frozen=True)
class WeightUpdateReport:
    """Outcome of :meth:`Cosmos3ActionModel.update_weights`.

    Args:
        weights_version (`int`): The version now serving (incremented by this update).
        applied (`list[str]`): Names copied, as given.
        skipped (`dict[str, str]`): Non-strict mode only: names left out, with the reason.
    """

    weights_version: int
    applied: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


class Cosmos3ActionModel(EnsembleService):
    """Serve N candidate action trajectories per observation from a Cosmos 3 omni pipeline.

    The :class:`~trajectory_ensemble_node.service.EnsembleService` for a :class:`Cosmos3Adapter`: it adds the
    Cosmos 3 request builder (:meth:`make_request`), :meth:`generate` and :meth:`update_weights`.

    Candidate ``i`` of a group equals ``pipe(..., generator=torch.Generator().manual_seed(result.seeds[i]),
    output_type="latent").action[0]`` (bitwise for ``count=1``; within ``1e-3 * max(1, max|ref|)`` in fp32 on CPU
    otherwise), but the N candidates share one prompt pass and one VAE encode, and every denoising step is ONE
    transformer forward for the whole group, classifier-free guidance included.

    Args:
        pipe (`Cosmos3OmniPipeline`): Any Cosmos 3 omni pipeline, tiny or real.
        max_batch_candidates (`int`), oversize_policy (`str`), max_retries (`int`), max_candidates (`int`),
        action_stats (`ActionNormalizer` or `Mapping[str, ActionNormalizer]`, *optional*): As
            :class:`~trajectory_ensemble_node.service.EnsembleService`.
        generator_device (`str` or `torch.device`, *optional*): Device of the per-candidate generators; defaults to
            the execution device. ``"cpu"`` makes the noise identical across CPU and GPU hosts.
        cfg_mode (`str`): ``"auto"``, ``"fused"`` or ``"separate"`` classifier-free guidance topology (see
            :class:`Cosmos3Adapter`).
        fuse_qkv (`bool`): Fuse each attention's q/k/v projections into one GEMM (faster; within the equivalence
            rule but not bitwise). Weight updates named after the unfused projections are routed by shard id.
        prefix_cache (`bool`): Compute each text prefix's per-layer keys/values once per group instead of once per
            step (bitwise-neutral; off only to measure what it saves).
        prefix_retain (`int`): Text prefixes whose keys/values are kept after their group for later groups with the
            same instruction (least recently used out; 0 = none), whatever shares the later forward: each prefix is
            computed on its own, so bitwise-neutral too; each costs ``2 x layers x tokens x kv_dim`` values of
            memory.
        row_block_rows (`int | str`, *optional*): Each decoder layer's token-wise work (norms, projections, MLP) runs
            in row ranges of at least this many rows, cut at candidate boundaries, still inside one forward per step
            (see ``models/cosmos3/layers.py``). ``"auto"`` (default): 256 on CPU, off on CUDA; ``None``/0: off.
        step_capture (`str`): ``"off"`` (default), ``"cuda_graph"`` (CUDA only) or ``"compile"``: each step's decoder
            stack captured once per shape and replayed (``models/cosmos3/capture.py``); ``generate`` takes the same
            keyword per group.
        forward_threads (`int | str`, *optional*): Threads for the independent pieces of one forward (row blocks and
            attention runs of co-batched groups; ``models/cosmos3/workers.py``), bitwise-neutral. ``"auto"``
            (default): on CPU the cores torch's intra-op threads leave free, 1 on CUDA; ``None``/0/1: off.
        limits (`ActionLimits`, `str` or `Path`, *optional*): Per-channel action limits in robot units, or the path
            of a limits YAML file (schema in :mod:`trajectory_ensemble_node.safety`). NaN/Inf candidates are
            dropped whether or not limits are given.
        min_valid_candidates (`int`): Fewest valid candidates that still make a result; fewer fail the group with
            ``TooFewValidCandidatesError`` (default 1).
        position_policy (`str`): ``"drop"`` (default) or ``"clamp"`` candidates outside the ``min``/``max`` limits.
        uncertainty_threshold (`float`, *optional*): Calibrated threshold (``trajectory-ensemble calibrate``); results
            whose ``uncertainty_score`` exceeds it carry ``uncertain=True`` in their metrics.
        novelty (`NoveltyCheck`, *optional*): Observation novelty scorer and its calibrated alarm rule
            (:func:`~trajectory_ensemble_node.uncertainty.load_calibration`): every group then returns its
            observation embedding (``embedding.py``), and its metrics carry ``novelty_score``, ``novel`` and
            ``uncertain`` by the rule. ``None`` (default): nothing of it runs. The attribute may be swapped between
            groups (``calibrate`` times groups with and without it).
        mode_threshold (`float`, *optional*): A fixed cut for ``mode`` and ``mode_continuity`` (RMS, normalized
            units; :func:`~trajectory_ensemble_node.reducers.configured_reducer`); ``None`` (default): their relative
            rule.
        state_input (`StateInput`, *optional*): The robot-state input the checkpoint declares (``state.py``);
            ``None`` (default): the one ``pipe`` was loaded with, if any (``load_directory`` reads it from the
            checkpoint's ``action_stats.json``). A model with one takes ``state`` with every request.
    """

    def __init__(
        self,
        pipe: Cosmos3OmniPipeline,
        *,
        max_batch_candidates: int = 16,
        oversize_policy: str = "microbatch",
        max_retries: int = 0,
        max_candidates: int = DEFAULT_MAX_CANDIDATES,
        action_stats: ActionNormalizer | Mapping[str, ActionNormalizer] | None = None,
        generator_device: str | torch.device | None = None,
        cfg_mode: str = "auto",
        fuse_qkv: bool = False,
        prefix_cache: bool = True,
        prefix_retain: int = 8,
        row_block_rows: int | str | None = "auto",
        step_capture: str = "off",
        forward_threads: int | str | None = "auto",
        limits: ActionLimits | str | Path | None = None,
        min_valid_candidates: int = 1,
        position_policy: str = "drop",
        uncertainty_threshold: float | None = None,
        novelty: NoveltyCheck | None = None,
        mode_threshold: float | None = None,
        state_input: StateInput | None = None,
    ) -> None:
        self.pipe = pipe
        self.mode_threshold = check_mode_threshold(mode_threshold)
        if isinstance(limits, (str, Path)):
            limits = load_limits(limits)
        self.validity = ValidityPolicy(limits=limits, min_valid_candidates=min_valid_candidates,
                                       position_policy=position_policy)
        self.uncertainty_threshold = uncertainty_threshold
        if novelty is not None:
            check_novelty_scorer(pipe, novelty.scorer)
        self.novelty = novelty
        if fuse_qkv:
            fuse_qkv_projections(pipe.transformer)
        adapter = Cosmos3Adapter(pipe, cfg_mode=cfg_mode, prefix_cache=prefix_cache, prefix_retain=prefix_retain,
                                 row_block_rows=row_block_rows, step_capture=step_capture,
                                 forward_threads=forward_threads, state_input=state_input)
        if generator_device is not None:
            adapter.generator_device = torch.device(generator_device)
        super().__init__(
            adapter, device=adapter.device, max_batch_candidates=max_batch_candidates, oversize_policy=oversize_policy,
            max_retries=max_retries, max_candidates=max_candidates, action_stats=action_stats,
        )
        self.adapter: Cosmos3Adapter = adapter

    @property
    def device(self) -> torch.device:
        return self.adapter.device

    @property
    def alarm(self) -> AlarmRule | None:
        """The rule a result is called ``uncertain`` by: the novelty scorer's, else ``spread`` on the threshold."""
        return alarm_in_force(self.novelty, self.uncertainty_threshold)

    @property
    def min_image_side(self) -> int:
        """Fewest pixels a side of a frame may have: the pipeline's VAE factor (``conditioning.min_image_side``)."""
        return min_image_side(self.pipe)

    @property
    def count_tokens(self) -> Callable[[str], int] | None:
        """An instruction's token count by the pipeline's tokenizer; ``None`` for a pipeline without one."""
        return token_counter(self.pipe)

    @property
    def state_input(self) -> StateInput | None:
        """The robot-state input this model takes (names in order, normalization), or ``None``: it takes none."""
        return self.adapter.state_input

    def make_request(
        self,
        *,
        prompt: str,
        action: CosmosActionCondition,
        num_inference_steps: int = 35,
        guidance_scale: float = 6.0,
        fps: float = 24.0,
        negative_prompt: str | None = None,
        spec: CandidateTrajectorySpec | None = None,
        base_seed: int | None = None,
        use_system_prompt: bool | None = None,
        rollout: RolloutSpec | None = None,
        request_id: str | None = None,
        on_progress: Callable[[ProgressEvent], None] | None = None,
        step_capture: str | None = None,
        deadline_s: float | None = None,
        current_state: torch.Tensor | tuple[float, ...] | None = None,
        context: ExecutionContext | None = None,
        state: Sequence[float] | torch.Tensor | None = None,
    ) -> GroupRequest:
        """Validate and build a group request, before any model work.

        ``deadline_s`` (seconds from submission, 0/None = none) lets the engine run fewer steps, or stop early from
        the clean-action estimate, to have a result in time (``steps_used`` / ``steps_fitted`` / ``steps_planned`` in the metrics).
        ``current_state`` (``[raw_action_dim]``, robot units) enables the limits' ``max_start_jump`` check.
        ``context`` (an :class:`~trajectory_ensemble_node.engine.context.ExecutionContext`, normalized space): the
        chunk being executed. Every candidate is guided toward it in the batched pass (``context.guidance``), and
        continuity-aware reducers select against it. ``None`` serves exactly as without this feature.
        ``state`` (``[width]``, the robot's state in the order and units :attr:`state_input` declares; not to be
        confused with ``current_state``, which is in action units): a model with a state input needs it, and it
        becomes the group's state frame (built once, shared by every candidate). A model without one ignores it:
        not checked, not fed, the result bitwise that of the same request without it.

        Raises:
            InvalidSpecError: and its subclasses (count above the maximum, unknown reducer, reducer invalid for the
                action layout), or ``UnsupportedModeError`` for a mode with no action output;
                ``ExecutionContextError`` and its subclasses for a context this request cannot continue.
            MissingObservationKeyError, ObservationArrayError, NonFiniteStateError: a model with a state input got
                no ``state``, one of the wrong shape, or one holding NaN/Inf (``StateInput.check``).
        """
        check_action_request(self.pipe, action)
        state_input = self.adapter.state_input
        if state_input is not None:
            check_state_slot(self.pipe, action)
            state = state_input.check(state)
        else:
            state = None
        spec, seeds, group, reducer = new_group(
            spec, base_seed=base_seed, request_id=request_id, max_count=self.max_candidates,
            action_dim=int(action.raw_action_dim), valid_reducers=self.valid_reducers(),
            domain_name=action.domain_name, mode_threshold=self.mode_threshold)
        if not isinstance(num_inference_steps, int) or num_inference_steps < 1:
            raise InvalidSpecError(f"num_inference_steps must be an int >= 1, got {num_inference_steps!r}.")
        if rollout is not None:
            if not isinstance(rollout, RolloutSpec):
                raise InvalidSpecError(f"rollout must be a RolloutSpec, got {type(rollout).__name__}.")
            rollout.check_steps(num_inference_steps)
        if step_capture is not None:
            check_step_capture(step_capture, self.device)
        if deadline_s and rollout is not None:
            raise InvalidSpecError("a rollout cannot take a deadline: its log-probs need the full step grid.")
        validity = request_check(self.validity, int(action.raw_action_dim), fps, current_state)
        if context is not None:
            check_context(context, action, rollout=rollout, guidance_scale=float(guidance_scale),
                          supported=self.adapter.capabilities.context_guidance)
        payload = Cosmos3Request(
            prompt=prompt,
            action=action,
            num_inference_steps=num_inference_steps,
            guidance_scale=float(guidance_scale),
            fps=float(fps),
            negative_prompt=negative_prompt,
            use_system_prompt=use_system_prompt,
            rollout=rollout,
            request_id=group.request_id,
            seeds=seeds,
            candidate_ids=group.candidate_ids,
            step_capture=step_capture,
            context=context,
            embedding_grid=None if self.novelty is None else self.novelty.scorer.embedding.grid,
            state=state,
        )
        return GroupRequest(
            group=group,
            spec=spec,
            seeds=seeds,
            payload=payload,
            reducer=reducer,
            normalizer=self.normalizer_for(action.domain_name),
            on_progress=on_progress,
            validity=validity,
            deadline_s=deadline_s,
            uncertainty_threshold=self.uncertainty_threshold,
            context=context,
            novelty=self.novelty,
        )

    def observation_embedding(self, *, prompt: str, action: CosmosActionCondition, fps: float,
                              guidance_scale: float = 1.0, negative_prompt: str | None = None,
                              grid: int = DEFAULT_EMBEDDING_GRID) -> torch.Tensor:
        """The observation embedding a group on this observation returns when novelty is on, without serving it.

        Encodes the conditioning exactly as a group does (same function, same arguments), so the value is the one
        the engine scores; ``calibrate`` fits scorers on it.

        Returns:
            `torch.Tensor` of shape `[z_dim * grid * grid]`, float32 CPU.
        """
        check_action_request(self.pipe, action)
        with torch.no_grad():
            conditioning = encode_conditioning(self.pipe, prompt=prompt, negative_prompt=negative_prompt,
                                               action=action, fps=float(fps), guidance_scale=float(guidance_scale),
                                               device=self.device)
        return observation_embedding(conditioning, grid)

    def submit(self, **kwargs) -> GroupHandle:
        """Build a request (see :meth:`make_request`) and queue it; returns a handle to wait on or cancel."""
        return self.submit_request(self.make_request(**kwargs))

    def generate(self, **kwargs) -> EnsembleResult:
        """Run one candidate group to completion and return its reduced action (see :meth:`make_request`).

        Returns:
            `EnsembleResult`: ``action`` ``[chunk_size, raw_action_dim]``, ``candidates``
            ``[N, chunk_size, raw_action_dim]`` (float32 CPU, when ``spec.return_candidates``), ``seeds``,
            ``candidate_ids``, ``metrics``.
        """
        return self.wait(self.submit(**kwargs))

    def update_weights(
        self,
        source: str | Path | Mapping[str, torch.Tensor],
        *,
        strict: bool = True,
        timeout: float | None = None,
    ) -> WeightUpdateReport:
        """Load new transformer weights atomically between groups; ``weights_version`` increments.

        Args:
            source (`str`, `Path` or `Mapping[str, torch.Tensor]`): A ``.safetensors`` file or tensors named as in
                the diffusers checkpoint (an optional ``transformer.`` prefix is accepted). Pickle is never read.
            strict (`bool`): Reject the whole update on any unknown name, shape or dtype mismatch (nothing changes);
                when False, apply the rest and report what was skipped.
            timeout (`float`, *optional*): Seconds to wait for the running groups to finish.

        Returns:
            `WeightUpdateReport`

        Raises:
            WeightUpdateError: the source is not safetensors, or the strict update is invalid.
        """
        tensors = load_update_source(source)
        plan = plan_update(self.pipe.transformer, tensors, strict=strict)

        def apply() -> int:
            apply_update(self.pipe.transformer, plan)
            return self.adapter.bump_weights_version()

        version = self.run_between_groups(apply, timeout)
        return WeightUpdateReport(weights_version=version, applied=plan.names, skipped=dict(plan.skipped))
