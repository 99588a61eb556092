"""``Cosmos3ActionModel``: N candidate action chunks from any diffusers ``Cosmos3OmniPipeline``, in one batch."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline, CosmosActionCondition

from ...contract import DEFAULT_MAX_CANDIDATES, CandidateGroup, CandidateTrajectorySpec, EnsembleResult
from ...engine.context import ExecutionContext
from ...engine import EngineConfig, GroupEngine, GroupHandle, GroupRequest, ProgressEvent
from ...errors import InvalidSpecError, ReducerLayoutError
from ...normalization import ActionNormalizer
from ...reducers import get_reducer
from ...seeding import candidate_seeds, fresh_base_seed
from .adapter import Cosmos3Adapter, Cosmos3Request
from .conditioning import check_action_request
from .guidance import check_context
from .rollout import RolloutSpec
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


class Cosmos3ActionModel:
    """Serve N candidate action trajectories per observation from a Cosmos 3 omni pipeline.

    Candidate ``i`` of a group equals ``pipe(..., generator=torch.Generator().manual_seed(result.seeds[i]),
    output_type="latent").action[0]`` (bitwise for ``count=1``; within ``1e-3 * max(1, max|ref|)`` in fp32 on CPU
    otherwise), but the N candidates share one prompt pass and one VAE encode, and every denoising step is ONE
    transformer forward for the whole group, classifier-free guidance included.

    Args:
        pipe (`Cosmos3OmniPipeline`): Any Cosmos 3 omni pipeline, tiny or real.
        max_batch_candidates (`int`): Most candidates in one physical forward.
        oversize_policy (`str`): ``"microbatch"``, ``"sequential"`` or ``"reject"`` for larger groups.
        max_retries (`int`): Whole-group reruns after a failed forward.
        max_candidates (`int`): Largest accepted ``spec.count``.
        action_stats (`ActionNormalizer` or `Mapping[str, ActionNormalizer]`, *optional*): Denormalization into
            robot units, one for all domains or one per ``domain_name``.
        generator_device (`str` or `torch.device`, *optional*): Device of the per-candidate generators; defaults to
            the execution device. ``"cpu"`` makes the noise identical across CPU and GPU hosts.
        cfg_mode (`str`): ``"auto"``, ``"fused"`` or ``"separate"`` classifier-free guidance topology (see
            :class:`Cosmos3Adapter`).
        fuse_qkv (`bool`): Fuse each attention's q/k/v projections into one GEMM (faster; within the equivalence
            rule but not bitwise). Weight updates named after the unfused projections are routed by shard id.
        prefix_cache (`bool`): Compute each text prefix's per-layer keys/values once per group instead of once per
            step (bitwise-neutral; off only to measure what it saves).
        prefix_retain (`int`): Text prefixes whose keys/values are kept after their group for later groups with the
            same instruction (least recently used out; 0 = none). They are reused only where the later forward would
            compute the same prefixes together, so bitwise-neutral too; each costs ``2 x layers x tokens x kv_dim``
            values of memory.
        row_block_rows (`int | str`, *optional*): Each decoder layer's token-wise work (norms, projections, MLP) runs
            in row ranges of at least this many rows, cut at candidate boundaries, still inside one forward per step
            (see ``models/cosmos3/layers.py``). ``"auto"`` (default): 256 on CPU, off on CUDA; ``None``/0: off.
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
    ) -> None:
        self.pipe = pipe
        if fuse_qkv:
            fuse_qkv_projections(pipe.transformer)
        self.adapter = Cosmos3Adapter(pipe, cfg_mode=cfg_mode, prefix_cache=prefix_cache, prefix_retain=prefix_retain,
                                      row_block_rows=row_block_rows)
        if generator_device is not None:
            self.adapter.generator_device = torch.device(generator_device)
        self.max_candidates = int(max_candidates)
        self.action_stats = action_stats
        self.engine = GroupEngine(
            self.adapter,
            EngineConfig(
                max_batch_candidates=max_batch_candidates, oversize_policy=oversize_policy, max_retries=max_retries
            ),
            device=self.adapter.device,
        )

    @property
    def device(self) -> torch.device:
        return self.adapter.device

    @property
    def weights_version(self) -> int:
        return self.adapter.weights_version

    def normalizer_for(self, domain_name: str) -> ActionNormalizer | None:
        """The configured action statistics for ``domain_name`` (``None`` when actions stay normalized)."""
        stats = self.action_stats
        if stats is None or isinstance(stats, ActionNormalizer):
            return stats
        return stats.get(domain_name)

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
        context: ExecutionContext | None = None,
    ) -> GroupRequest:
        """Validate and build a group request, before any model work.

        ``context`` (an :class:`~trajectory_ensemble_node.engine.context.ExecutionContext`, normalized space): the
        chunk being executed. Every candidate is guided toward it in the batched pass (``context.guidance``), and
        continuity-aware reducers select against it. ``None`` serves exactly as without this feature.

        Raises:
            InvalidSpecError: and its subclasses (count above the maximum, unknown reducer, reducer invalid for the
                action layout), or ``UnsupportedModeError`` for a mode with no action output;
                ``ExecutionContextError`` and its subclasses for a context this request cannot continue.
        """
        spec = spec or CandidateTrajectorySpec(max_count=self.max_candidates)
        if spec.count > self.max_candidates:
            # Re-validate against this model's maximum even when the spec was built with a larger one.
            CandidateTrajectorySpec(
                count=spec.count, reducer=spec.reducer, return_candidates=spec.return_candidates,
                seed_policy=spec.seed_policy, max_count=self.max_candidates,
            )
        check_action_request(self.pipe, action)
        if not isinstance(num_inference_steps, int) or num_inference_steps < 1:
            raise InvalidSpecError(f"num_inference_steps must be an int >= 1, got {num_inference_steps!r}.")
        reducer = None
        if spec.reducer != "none":
            if spec.reducer not in self.adapter.valid_reducers():
                raise ReducerLayoutError(
                    f"reducer {spec.reducer!r} is not valid for Cosmos 3 actions; valid: "
                    f"{list(self.adapter.valid_reducers())}."
                )
            reducer = get_reducer(spec.reducer)
            reducer.check_layout(int(action.raw_action_dim))
        if rollout is not None:
            if not isinstance(rollout, RolloutSpec):
                raise InvalidSpecError(f"rollout must be a RolloutSpec, got {type(rollout).__name__}.")
            rollout.check_steps(num_inference_steps)
        if context is not None:
            check_context(context, action, rollout=rollout, guidance_scale=float(guidance_scale),
                          supported=self.adapter.capabilities.context_guidance)
        if base_seed is None:
            base_seed = fresh_base_seed()
        seeds = candidate_seeds(base_seed, spec.count, spec.seed_policy)
        group = CandidateGroup.for_spec(request_id or uuid.uuid4().hex, spec)
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
            context=context,
        )
        return GroupRequest(
            group=group,
            spec=spec,
            seeds=seeds,
            payload=payload,
            reducer=reducer,
            normalizer=self.normalizer_for(action.domain_name),
            on_progress=on_progress,
            context=context,
        )

    def submit(self, **kwargs) -> GroupHandle:
        """Build a request (see :meth:`make_request`) and queue it; returns a handle to wait on or cancel."""
        return self.engine.submit(self.make_request(**kwargs))

    def generate(self, **kwargs) -> EnsembleResult:
        """Run one candidate group to completion and return its reduced action (see :meth:`make_request`).

        Returns:
            `EnsembleResult`: ``action`` ``[chunk_size, raw_action_dim]``, ``candidates``
            ``[N, chunk_size, raw_action_dim]`` (float32 CPU, when ``spec.return_candidates``), ``seeds``,
            ``candidate_ids``, ``metrics``.
        """
        handle = self.submit(**kwargs)
        if not self.engine.is_background:
            self.engine.run_until_idle()
        return handle.result()

    def run_until_idle(self) -> None:
        """Drive every submitted group to completion on the calling thread."""
        self.engine.run_until_idle()

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

        future = self.engine.run_between_groups(apply)
        if not self.engine.is_background:
            self.engine.run_until_idle()
        version = future.result(timeout)
        return WeightUpdateReport(weights_version=version, applied=plan.names, skipped=dict(plan.skipped))
