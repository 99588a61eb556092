"""The models a node or the CLI serves by name: ``tiny`` (embedded random), ``toy`` (bundled policy) or a directory.

This is where the toy package meets the Cosmos 3 loader, so that ``models/`` never imports ``toy``: the model
package loads ``tiny`` and directories, the toy package loads its own weights, and this module picks by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .errors import ModelLoadError
from .models.cosmos3 import UNTRAINED_NOTICE, build_pipeline, load_directory, resolve_device, resolve_dtype

if TYPE_CHECKING:
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

EMBEDDED_MODELS = ("tiny", "toy")
"""Model names that need no path: the random tiny test model and the bundled toy policy."""


def model_notice(model: str) -> str:
    """The notice :func:`load_pipeline` will return for ``model``, known before loading (for startup logs).

    Args:
        model (`str`): ``"tiny"``, ``"toy"`` or a directory.
    """
    if model == "tiny":
        return UNTRAINED_NOTICE
    if model == "toy":
        from .toy import TOY_NOTICE

        return TOY_NOTICE
    return f"weights from {model}"


def load_pipeline(
    model: str,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    allow_pickle: bool = False,
    seed: int = 0,
) -> tuple[Cosmos3OmniPipeline, str]:
    """Load the pipeline named by ``model`` and say what it is: the one loader by name, for every face and tool.

    Args:
        model (`str`): ``"tiny"`` (random in-process test model), ``"toy"`` (the bundled toy policy) or the path of a
            local diffusers-format ``Cosmos3OmniPipeline`` directory (``model_index.json`` at its root).
        device (`str` or `torch.device`): ``"auto"`` (cuda when available, else cpu), ``"cpu"``, ``"cuda[:N]"``.
        dtype (`str` or `torch.dtype`): Transformer dtype: ``float32``, ``bfloat16`` or ``float16``.
        allow_pickle (`bool`): Also load ``.bin``/``.pt``/``.pth``/``.ckpt`` weights that have no safetensors twin.
            Off by default: unpickling a file can run code it carries.
        seed (`int`): Seed of the random weights (``"tiny"`` only).

    Returns:
        `tuple[Cosmos3OmniPipeline, str]`: the pipeline (progress bars off) and its one-line notice for logs and
        diagnostics (:func:`model_notice`).

    Raises:
        ModelLoadError: bad device/dtype, missing directory, not a Cosmos 3 pipeline, or the toy weights are absent.
        PickleWeightsError: pickle-only weights and ``allow_pickle`` is False.
    """
    torch_device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    if model == "tiny":
        return build_pipeline("tiny", seed=int(seed), dtype=torch_dtype, device=torch_device), UNTRAINED_NOTICE
    if model != "toy":
        return load_directory(Path(model).expanduser(), torch_device, torch_dtype, allow_pickle), model_notice(model)
    from .toy import TOY_NOTICE, load_toy_pipeline, toy_pipeline_dir

    directory = toy_pipeline_dir()
    if not (directory / "model_index.json").is_file():
        raise ModelLoadError(
            f"model 'toy': the toy policy weights are not installed ({directory / 'model_index.json'} is "
            f"missing); use model: tiny, or train them with `trajectory-ensemble train-toy --out {directory}`"
        )
    return load_toy_pipeline(device=torch_device, dtype=torch_dtype), TOY_NOTICE


load_model = load_pipeline
"""The loader's old name (it returns a pipeline, not the served model); kept for its public path."""
