"""Cosmos 3 (diffusers ``Cosmos3OmniPipeline``) adapter: N candidates in one batched denoising path.

What other packages may use is exported here, and only here; the submodules are this package's internals, and code
outside ``models/cosmos3`` imports from this module alone (``tests/test_architecture.py`` checks it).

- **Serving** (the node, the OpenPI server, the tools): :class:`Cosmos3ActionModel` and its request and result
  types, loading, the settings the node's parameters validate against.
- **Building blocks for training and probes** (the lab's ``train-toy``, ``train-grpo`` and sensitivity probes, and
  the benchmarks): the conditioning encoder, the packed forward and fan-out attention that the serving path itself
  uses, the robot-state frame (``build_state_frame`` and the checkpoint's ``StateInput``), the Flow-GRPO SDE step,
  and the tiny random configs. They are exported so that a trainer sees exactly the
  latents and forwards inference sees, never a copy of them.
"""

from .adapter import CFG_MODES, Cosmos3Adapter, Cosmos3Request
from .attention import install_fanout
from .capture import STEP_CAPTURE_MODES, StepCaptureError, check_step_capture
from .conditioning import (
    MIN_IMAGE_SIDE,
    GroupConditioning,
    encode_conditioning,
    min_image_side,
    policy_condition,
    token_counter,
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
