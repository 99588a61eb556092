"""Small Cosmos 3 pipelines built in-process from the real diffusers classes, with random weights.

There is no model hub on a robot's build machine or in CI, so tests, the demo and the benchmark build their models
here: the same ``Cosmos3OmniTransformer``, ``AutoencoderKLWan`` and ``UniPCMultistepScheduler`` classes as the
published checkpoints, only narrower and shallower. Weights are a pure function of ``seed``; nothing is downloaded.

Configs:
    - ``tiny``: a few hundred thousand parameters; the upstream pipeline runs a policy call in about a second on CPU.
    - ``bench``: about 50M transformer parameters, so that compute, not Python overhead, dominates on CPU.
    - ``large``: about 0.9B transformer parameters, for GPU benchmarks (hidden 2048, 16 layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler
from diffusers.models.transformers.transformer_cosmos3 import Cosmos3OmniTransformer
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

UNTRAINED_NOTICE = "untrained demo weights"

# ChatML, as the Qwen-family tokenizers that ship with Cosmos 3 use; only its shape matters for the tiny models.
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>")


@dataclass(frozen=True)
class TinyCosmos3Config:
    """Shape of a random-weight Cosmos 3 pipeline.

    Args:
        hidden_size (`int`): Transformer width.
        num_layers (`int`): Number of Mixture-of-Transformers decoder layers.
        num_heads (`int`): Query heads; ``head_dim = hidden_size // num_heads``.
        num_kv_heads (`int`): Key/value heads (grouped-query attention).
        intermediate_size (`int`): MLP width.
        rope_axes_dim (`tuple[int, int, int]`): mRoPE split of ``head_dim // 2`` over (t, h, w).
        action_dim (`int`): Padded action width of the action head (the real models use 64).
        vae_base_dim (`int`): Wan VAE base channel count.
        vae_z_dim (`int`): Latent channels; also the transformer's ``latent_channel``.
        vae_dim_mult (`tuple[int, ...]`): Wan VAE channel multipliers (three downsamples for ``len == 4``).
        vae_num_res_blocks (`int`): Residual blocks per VAE stage.
        extra (`dict`): Further ``Cosmos3OmniTransformer`` keyword arguments, e.g. ``{"qk_norm_for_text": False,
            "use_und_k_norm_for_gen": True}`` for the variant whose generation pathway norms the text keys itself.
    """

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    rope_axes_dim: tuple[int, int, int] = (4, 2, 2)
    action_dim: int = 64
    vae_base_dim: int = 8
    vae_z_dim: int = 4
    vae_dim_mult: tuple[int, ...] = (1, 2, 2, 2)
    vae_num_res_blocks: int = 1
    flow_shift: float = 5.0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


CONFIGS: dict[str, TinyCosmos3Config] = {
    "tiny": TinyCosmos3Config(),
    "bench": TinyCosmos3Config(
        hidden_size=512,
        num_layers=8,
        num_heads=8,
        num_kv_heads=2,
        intermediate_size=1536,
        rope_axes_dim=(12, 10, 10),
        action_dim=64,
        vae_base_dim=16,
        vae_z_dim=16,
        vae_dim_mult=(1, 2, 2, 2),
        vae_num_res_blocks=1,
    ),
    "large": TinyCosmos3Config(
        hidden_size=2048,
        num_layers=16,
        num_heads=16,
        num_kv_heads=4,
        intermediate_size=6144,
        rope_axes_dim=(24, 20, 20),
        action_dim=64,
        vae_base_dim=32,
        vae_z_dim=16,
        vae_dim_mult=(1, 2, 4, 4),
        vae_num_res_blocks=2,
    ),
}


def build_tokenizer(captions: Sequence[str] = (), merges: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer: every string tokenizes, deterministically.

    With no ``merges`` it has none (a 260-token vocab): a string is one token per byte, so upstream's caption template
    alone is about 400 tokens. With ``merges``, up to that many are learned from ``captions`` (the captions a policy
    is called with), as any BPE vocabulary is learned from its corpus: a fixed caption then tokenizes to a handful
    of tokens, and every other string still tokenizes, from its bytes.

    Args:
        captions (`Sequence[str]`): Texts the merges are learned from (special tokens in them stay whole).
        merges (`int`): Most merges to learn; 0 for none.

    Raises:
        ValueError: ``merges`` is negative, or positive with no caption.
    """
    if merges < 0 or (merges and not captions):
        raise ValueError(f"merges must be >= 0 and need captions to learn from, got merges={merges!r} with "
                         f"{len(captions)} captions")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    if merges:
        tokenizer = Tokenizer(models.BPE())
    else:
        tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(_SPECIAL_TOKENS))
    if merges:
        trainer = trainers.BpeTrainer(vocab_size=len(_SPECIAL_TOKENS) + len(alphabet) + merges, min_frequency=0,
                                      initial_alphabet=alphabet, special_tokens=list(_SPECIAL_TOKENS),
                                      show_progress=False)
        tokenizer.train_from_iterator(list(captions), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=_CHAT_TEMPLATE,
    )


def build_pipeline(
    config: str | TinyCosmos3Config = "tiny",
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tokenizer: PreTrainedTokenizerFast | None = None,
) -> Cosmos3OmniPipeline:
    """Build a random-weight ``Cosmos3OmniPipeline`` whose weights depend only on ``config`` and ``seed``.

    Args:
        config (`str` or `TinyCosmos3Config`): ``"tiny"``, ``"bench"``, ``"large"`` or an explicit config.
        seed (`int`): Seed of the CPU generator used for every weight; the global RNG is left untouched.
        dtype (`torch.dtype`): Transformer dtype. The VAE stays in float32, as upstream recommends.
        device (`str` or `torch.device`): Where to place the modules.
        tokenizer (`PreTrainedTokenizerFast`, *optional*): The text tokenizer (its size sets the vocabulary);
            default :func:`build_tokenizer` with no merges.

    Returns:
        `Cosmos3OmniPipeline`: with ``enable_safety_checker=False`` (the guardrail model cannot be downloaded here).
    """
    if isinstance(config, str):
        if config not in CONFIGS:
            raise ValueError(f"Unknown tiny Cosmos 3 config {config!r}; expected one of {sorted(CONFIGS)}.")
        config = CONFIGS[config]
    if sum(config.rope_axes_dim) * 2 != config.head_dim:
        raise ValueError(
            f"rope_axes_dim {config.rope_axes_dim} must sum to head_dim // 2 = {config.head_dim // 2}."
        )
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    # fork_rng keeps the caller's global RNG stream intact, so building a model never shifts anyone's noise.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = Cosmos3OmniTransformer(
            head_dim=config.head_dim,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_kv_heads,
            num_hidden_layers=config.num_layers,
            latent_channel=config.vae_z_dim,
            latent_patch_size=2,
            patch_latent_dim=config.vae_z_dim * 4,
            vocab_size=len(tokenizer),
            action_gen=True,
            action_dim=config.action_dim,
            num_embodiment_domains=32,
            rope_axes_dim=list(config.rope_axes_dim),
            dtype="float32",
            **config.extra,
        )
        randomize_zero_initialized(transformer)
        vae = AutoencoderKLWan(
            base_dim=config.vae_base_dim,
            z_dim=config.vae_z_dim,
            dim_mult=list(config.vae_dim_mult),
            num_res_blocks=config.vae_num_res_blocks,
            is_residual=True,
            patch_size=2,
            in_channels=12,
            out_channels=12,
            scale_factor_spatial=16,
            latents_mean=[0.0] * config.vae_z_dim,
            latents_std=[1.0] * config.vae_z_dim,
        )
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=config.flow_shift
    )
    transformer = transformer.to(device=device)
    if dtype != torch.float32:
        _cast_keeping_fp32_modules(transformer, dtype)
    pipe = Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=tokenizer,
        vae=vae.to(device=device),
        scheduler=scheduler,
        enable_safety_checker=False,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _cast_keeping_fp32_modules(transformer: Cosmos3OmniTransformer, dtype: torch.dtype) -> None:
    # What from_pretrained(torch_dtype=...) does for a checkpoint: cast, but keep the modules the class pins to
    # float32 (the timestep embedder) in float32.
    keep = tuple(getattr(transformer, "_keep_in_fp32_modules", None) or ())
    for name, module in transformer.named_modules():
        if any(name == k or name.startswith(k + ".") for k in keep):
            continue
        for param in module.parameters(recurse=False):
            param.data = param.data.to(dtype)
        for buf_name, buf in module.named_buffers(recurse=False):
            if buf.is_floating_point():
                setattr(module, buf_name, buf.to(dtype))


def randomize_zero_initialized(transformer: Cosmos3OmniTransformer) -> None:
    # Modality embeddings start at zero in the real class; with random weights that would hide any packing bug that
    # confuses action tokens with vision tokens, so give them values too.
    with torch.no_grad():
        if getattr(transformer, "action_modality_embed", None) is not None:
            transformer.action_modality_embed.normal_(std=0.02)
