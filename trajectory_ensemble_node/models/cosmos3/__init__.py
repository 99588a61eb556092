"""Cosmos 3 (diffusers ``Cosmos3OmniPipeline``) adapter: N candidates in one batched denoising path.

What other packages may use is imported here, and only here; code outside ``models/cosmos3`` imports from this module
alone (``tests/test_architecture.py`` checks it). Besides serving (:class:`Cosmos3ActionModel`, loading, settings) it
exports the building blocks the lab's trainers and probes use, so that a trainer sees exactly the latents and forwards
inference sees, never a copy of them.
"""

from .adapter import CFG_MODES, Cosmos3Adapter, Cosmos3Request
from .attention import install_fanout
from .capture import STEP_CAPTURE_MODES, StepCaptureError, check_step_capture
from .conditioning import (
    MIN_IMAGE_SIDE,
    GroupConditioning,
    encode_clips,
    encode_conditioning,
    min_image_side,
    policy_condition,
    token_counter,
    tokenize_action_prompt,
)
from .embedding import DEFAULT_EMBEDDING_GRID, EMBEDDING_NAME, embedding_dim, observation_embedding
from .embodiments import RESOLUTION_TIERS, VIEW_POINTS, embodiment_widths
from .loading import PICKLE_SUFFIXES, load_directory, resolve_device, resolve_dtype
from .model import Cosmos3ActionModel, WeightUpdateReport
from .packing import Branch, PackItem, forward_items
from .prefix_cache import PrefixKVCache
from .rollout import (
    SIGMA_ONE_ATOL,
    RolloutError,
    RolloutResult,
    RolloutSpec,
    gaussian_log_prob,
    read_record,
    sde_transition,
)
from .state import (
    STATE_FRAME_INDEX,
    STATE_METHODS,
    StateInput,
    build_state_frame,
    declare_state_input,
    declared_state_input,
    pick_named,
    read_state_input,
    write_state_input,
)
from .tiny import CONFIGS, UNTRAINED_NOTICE, TinyCosmos3Config, build_pipeline, build_tokenizer, randomize_zero_initialized
