"""What the benchmark runs: the pipelines, one observation, and the two ways of drawing N candidates from it.

- :class:`UpstreamRunner` calls the unmodified ``Cosmos3OmniPipeline.__call__`` once per candidate seed, on its OWN
  pipeline object (our fan-out processor is never installed on it). It counts physical transformer forwards with a
  forward pre-hook and times the conditioning work of each call (``tokenize_prompt`` + ``prepare_latents``, which
  holds the VAE encode of the ``chunk + 1`` frame clip).
- :class:`BatchedRunner` draws the N candidates through ``Cosmos3ActionModel.generate`` in one batched path.

Both sides run with autograd off: upstream ``__call__`` is decorated ``@torch.no_grad()``, and the bench wraps
``generate`` in ``torch.no_grad()`` so the comparison is like for like (see ``probe_grad_mode``).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline, CosmosActionCondition

from trajectory_ensemble_node.contract import CandidateTrajectorySpec, EnsembleResult
from trajectory_ensemble_node.models.cosmos3 import Cosmos3ActionModel, build_pipeline

PROMPT = "put the red block in the bowl"
DOMAIN = "droid_lerobot"
FPS = 15.0
BASE_SEED = 1234
# Weights seed of the random-weight configs; both pipeline objects use it, so their weights are identical.
WEIGHTS_SEED = 0
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def synchronize(device: torch.device) -> None:
    """Wait for queued device work, so wall-clock timings include it (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def observation(seed: int = 1, height: int = 240, width: int = 320) -> np.ndarray:
    """A deterministic uint8 RGB camera frame ``[H, W, 3]``; 4:3 like the DROID cameras, so a non-square bin."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (height, width, 3), dtype=torch.uint8, generator=generator).numpy()


@dataclass(frozen=True)
class PipelineSource:
    """Where pipelines come from: a named random-weight config, or a checkpoint directory.

    Args:
        config (`str`): ``"tiny"``, ``"bench"`` or ``"large"`` (see ``models/cosmos3/tiny.py``); ignored with a path.
        model_path (`str`, *optional*): A ``Cosmos3OmniPipeline`` checkpoint directory (safetensors).
    """

    config: str = "bench"
    model_path: str | None = None

    @property
    def label(self) -> str:
        return self.model_path if self.model_path else self.config

    def build(self, dtype: torch.dtype, device: torch.device) -> Cosmos3OmniPipeline:
        """Build a fresh pipeline object; two calls give two objects with identical weights."""
        if self.model_path:
            pipe = Cosmos3OmniPipeline.from_pretrained(
                self.model_path, use_safetensors=True, enable_safety_checker=False, torch_dtype=dtype
            )
            # As build_pipeline does: the VAE stays float32 (upstream casts the encode input to the VAE dtype).
            pipe.vae.to(dtype=torch.float32)
            pipe = pipe.to(device)
            pipe.set_progress_bar_config(disable=True)
            return pipe
        return build_pipeline(self.config, seed=WEIGHTS_SEED, dtype=dtype, device=device)


@dataclass(frozen=True)
class Workload:
    """One observation and the call parameters shared by both sides.

    Args:
        steps (`int`): Denoising steps.
        chunk (`int`): Action chunk size (the video has ``chunk + 1`` frames).
        tier (`int`): Resolution tier of the conditioning canvas.
        guidance (`float`): Classifier-free guidance scale; ``> 1`` runs two branches per step.
        base_seed (`int`): Candidate ``i`` uses ``candidate_seeds(base_seed, N)[i]``.
        prompt_cache (`str`): ``"cold"``: nothing is retained from earlier groups (every prefix retained so far is
            forgotten before each call), as for the first goal after start or after a weight update: the upper
            bound. A new instruction alone would still reuse the negative prompt's prefix in separate-branch N=1
            groups; measured, that was within the noise. ``"warm"``: the same instruction as the group before, as
            when a robot sends one instruction goal after goal (its prefixes are reused). Upstream has no such
            cache and recomputes the text every call either way.
        row_blocks (`str`): ``"auto"``: the engine's default row blocking of decoder layers (on CPU, token-wise
            work in candidate-sized row ranges; see ``models/cosmos3/layers.py``); ``"off"``: whole layers, to
            measure what blocking gives.
    """

    steps: int
    chunk: int
    tier: int
    guidance: float
    base_seed: int = BASE_SEED
    prompt_cache: str = "cold"
    row_blocks: str = "auto"
    image: np.ndarray = field(default_factory=observation, repr=False, compare=False)

    def action(self) -> CosmosActionCondition:
        return CosmosActionCondition(
            mode="policy", chunk_size=self.chunk, domain_name=DOMAIN, resolution_tier=self.tier, image=self.image
        )


class ForwardCounter:
    """Counts physical forwards of a transformer with a forward pre-hook (and records the autograd mode)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        self.grad_enabled: set[bool] = set()
        self._handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.count += 1
        self.grad_enabled.add(torch.is_grad_enabled())

    def remove(self) -> None:
        self._handle.remove()


def _timed(fn: Callable[..., Any], on_done: Callable[[float], None]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            on_done((time.perf_counter() - started) * 1e3)

    return wrapper


@dataclass(frozen=True)
class UpstreamCall:
    """One measured upstream call.

    Args:
        seed (`int`): The candidate seed of its generator.
        latency_s (`float`): Wall time of ``__call__``.
        cpu_s (`float`): CPU time of this process during the call (all its threads; see ``Stats`` in the runner).
        encode_ms (`float`): ``tokenize_prompt`` + ``prepare_latents`` (prompt + VAE encode of ``chunk + 1`` frames).
        forwards (`int`): Physical transformer forwards counted by the pre-hook.
        action (`torch.Tensor` of shape `[chunk, raw_action_dim]`): ``out.action[0]``, float32 CPU.
    """

    seed: int
    latency_s: float
    cpu_s: float
    encode_ms: float
    forwards: int
    action: torch.Tensor


class UpstreamRunner:
    """The sequential reference: the untouched upstream pipeline, one call per candidate seed.

    Args:
        pipe (`Cosmos3OmniPipeline`): A pipeline object nobody else uses (no fan-out processor installed).
        workload (`Workload`): What to run.
    """

    def __init__(self, pipe: Cosmos3OmniPipeline, workload: Workload) -> None:
        self.pipe = pipe
        self.workload = workload
        self.device = pipe._get_execution_device()
        self.counter = ForwardCounter(pipe.transformer)
        self._encode_ms = 0.0
        # Instance-level wrappers only add a stopwatch around the same bound methods; the computation is unchanged.
        pipe.tokenize_prompt = _timed(pipe.tokenize_prompt, self._add_encode)
        pipe.prepare_latents = _timed(pipe.prepare_latents, self._add_encode)

    def _add_encode(self, elapsed_ms: float) -> None:
        self._encode_ms += elapsed_ms

    def call(self, seed: int, *, steps: int | None = None) -> UpstreamCall:
        """Run ``pipe(..., generator=torch.Generator().manual_seed(seed), output_type="latent")`` once, timed."""
        workload = self.workload
        forwards_before = self.counter.count
        self._encode_ms = 0.0
        synchronize(self.device)
        started, cpu_started = time.perf_counter(), time.process_time()
        out = self.pipe(
            prompt=PROMPT,
            action=workload.action(),
            num_inference_steps=steps or workload.steps,
            guidance_scale=workload.guidance,
            fps=FPS,
            generator=torch.Generator().manual_seed(seed),
            output_type="latent",
            enable_safety_check=False,
        )
        synchronize(self.device)
        latency, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        return UpstreamCall(
            seed=seed,
            latency_s=latency,
            cpu_s=cpu,
            encode_ms=self._encode_ms,
            forwards=self.counter.count - forwards_before,
            action=out.action[0].detach().to("cpu", torch.float32),
        )


@dataclass(frozen=True)
class BatchedCall:
    """One measured batched group.

    Args:
        count (`int`): N.
        latency_s (`float`): Wall time of ``generate``.
        cpu_s (`float`): CPU time of this process during ``generate``.
        result (`EnsembleResult`): Its ``candidates`` ``[N, chunk, raw_action_dim]`` and ``metrics``.
    """

    count: int
    latency_s: float
    cpu_s: float
    result: EnsembleResult


class BatchedRunner:
    """N candidates in one batched path through ``Cosmos3ActionModel.generate``.

    Args:
        pipe (`Cosmos3OmniPipeline`): The pipeline the model wraps (may be shared by several topologies).
        workload (`Workload`): What to run.
        cfg_mode (`str`): ``"fused"`` (both CFG branches in one forward) or ``"separate"`` (two forwards).
        max_count (`int`): Largest N; the engine capacity is set to it so no group is split into microbatches.
    """

    def __init__(self, pipe: Cosmos3OmniPipeline, workload: Workload, cfg_mode: str, max_count: int) -> None:
        self.workload = workload
        self.cfg_mode = cfg_mode
        capacity = max(16, int(max_count))
        # CPU generators, like the upstream reference's `torch.Generator()`: on CUDA the default (execution-device
        # generators) would draw different noise, and parity with the reference would be meaningless. One forward
        # thread: the reference runs on torch's intra-op threads alone, and the comparison is like for like.
        self.model = Cosmos3ActionModel(
            pipe, cfg_mode=cfg_mode, max_batch_candidates=capacity, max_candidates=capacity, generator_device="cpu",
            row_block_rows="auto" if workload.row_blocks == "auto" else None, forward_threads=1,
        )
        self.device = self.model.device

    def spec(self, count: int) -> CandidateTrajectorySpec:
        return CandidateTrajectorySpec(
            count=count,
            reducer="mean" if count > 1 else "none",
            return_candidates=True,
            max_count=self.model.max_candidates,
        )

    def call(self, count: int, *, steps: int | None = None, grad: bool = False,
             step_capture: str | None = None) -> BatchedCall:
        """Run one group of ``count`` candidates, timed.

        Args:
            count (`int`): N.
            steps (`int`, *optional*): Overrides the workload's steps (memory and grad probes).
            grad (`bool`): Leave autograd as the engine leaves it (only for :func:`probe_grad_mode`).
            step_capture (`str`, *optional*): The group's ``step_capture`` (``None``: the model's own).
        """
        workload = self.workload
        cache = self.model.adapter.prefix_cache
        if workload.prompt_cache == "cold" and cache is not None:
            cache.clear()  # between groups: only what earlier groups retained goes
        synchronize(self.device)
        started, cpu_started = time.perf_counter(), time.process_time()
        with contextlib.nullcontext() if grad else torch.no_grad():
            result = self.model.generate(
                prompt=PROMPT,
                action=workload.action(),
                num_inference_steps=steps or workload.steps,
                guidance_scale=workload.guidance,
                fps=FPS,
                spec=self.spec(count),
                base_seed=workload.base_seed,
                step_capture=step_capture,
            )
        synchronize(self.device)
        return BatchedCall(count=count, latency_s=time.perf_counter() - started,
                           cpu_s=time.process_time() - cpu_started, result=result)


def probe_grad_mode(runner: BatchedRunner) -> bool:
    """Whether the engine runs transformer forwards with autograd enabled when the caller does not disable it.

    Runs one 1-step, 1-candidate group with the caller's grad mode left on; a forward pre-hook reads
    ``torch.is_grad_enabled()``. ``True`` means serving builds an autograd graph (memory grows with every step).
    """
    counter = ForwardCounter(runner.model.pipe.transformer)
    try:
        with torch.enable_grad():
            runner.call(1, steps=1, grad=True)
    finally:
        counter.remove()
    return True in counter.grad_enabled


def module_parameters(module: torch.nn.Module) -> int:
    """Number of parameters of ``module``."""
    return sum(p.numel() for p in module.parameters())


def module_bytes(module: torch.nn.Module) -> int:
    """Bytes held by the parameters and buffers of ``module``."""
    tensors = list(module.parameters()) + list(module.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)
