"""The models a node or the CLI serves by name: ``tiny`` (embedded random), a bundled policy (``toy``, ``pusht``) or a
directory.

This is where the bundled policies meet the Cosmos 3 loader, so that ``models/`` never imports ``toy``: the model
package loads ``tiny`` and directories, :mod:`.bundled` says where each bundled policy lies, and this module picks by
name.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .bundled import BUNDLED_NAMES, bundled_policy
from .errors import ModelLoadError
from .models.cosmos3 import UNTRAINED_NOTICE, build_pipeline, load_directory, resolve_device, resolve_dtype

if TYPE_CHECKING:
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

EMBEDDED_MODELS = ("tiny", *BUNDLED_NAMES)
"""Model names that need no path: the random tiny test model and the bundled policies."""


def model_notice(model: str) -> str:
    """The notice :func:`load_pipeline` will return for ``model``, known before loading (for startup logs).

    Args:
        model (`str`): ``"tiny"``, a bundled policy's name or a directory.
    """
    if model == "tiny":
        return UNTRAINED_NOTICE
    policy = bundled_policy(model)
    return policy.notice if policy is not None else f"weights from {model}"


def load_pipeline(
    model: str,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    allow_pickle: bool = False,
    seed: int = 0,
) -> tuple[Cosmos3OmniPipeline, str]:
    """Load the pipeline named by ``model`` and say what it is: the one loader by name, for every face and tool.

    Args:
        model (`str`): ``"tiny"`` (random in-process test model), ``"toy"`` or ``"pusht"`` (the bundled policies,
            :mod:`.bundled`) or the path of a local diffusers-format ``Cosmos3OmniPipeline`` directory
            (``model_index.json`` at its root).
        device (`str` or `torch.device`): ``"auto"`` (cuda when available, else cpu), ``"cpu"``, ``"cuda[:N]"``.
        dtype (`str` or `torch.dtype`): Transformer dtype: ``float32``, ``bfloat16`` or ``float16``.
        allow_pickle (`bool`): Also load ``.bin``/``.pt``/``.pth``/``.ckpt`` weights that have no safetensors twin.
            Off by default: unpickling a file can run code it carries.
        seed (`int`): Seed of the random weights (``"tiny"`` only).

    Returns:
        `tuple[Cosmos3OmniPipeline, str]`: the pipeline (progress bars off) and its one-line notice for logs and
        diagnostics (:func:`model_notice`).

    Raises:
        ModelLoadError: bad device/dtype, missing directory, not a Cosmos 3 pipeline, or a bundled policy's weights
            are absent.
        PickleWeightsError: pickle-only weights and ``allow_pickle`` is False.
    """
    torch_device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    if model == "tiny":
        return build_pipeline("tiny", seed=int(seed), dtype=torch_dtype, device=torch_device), UNTRAINED_NOTICE
    policy = bundled_policy(model)
    if policy is None:
        return load_directory(Path(model).expanduser(), torch_device, torch_dtype, allow_pickle), model_notice(model)
    if not policy.installed:
        raise ModelLoadError(
            f"model {model!r}: the {model} policy weights are not installed ({policy.directory / 'model_index.json'} "
            f"is missing); use model: tiny, or build them: {policy.rebuild}"
        )
    # Bundled weights are safetensors by construction; the safety checker is off as for the toy (its guardrail model
    # cannot be downloaded, and a policy's video is never shown to people).
    return load_directory(policy.directory, torch_device, torch_dtype, False), policy.notice

