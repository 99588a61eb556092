"""Load a Cosmos 3 pipeline directory, and resolve device and dtype names.

Nothing is ever downloaded: a model is a local diffusers-format directory (:func:`trajectory_ensemble_node.catalog.
load_pipeline` is the one loader by name). Pickle checkpoints are refused unless ``allow_pickle=True``; a declared
robot-state input (``state.py``) is recorded on the pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ...errors import ModelLoadError, PickleWeightsError
from .state import declare_state_input, read_state_input

if TYPE_CHECKING:
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""File suffixes of pickle-based checkpoints (loading one may execute code stored in it)."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_device(device: str | torch.device) -> torch.device:
    """Turn ``"auto"`` into ``cuda`` when a GPU is visible, else ``cpu``; check any other name.

    Args:
        device (`str` or `torch.device`): ``"auto"``, ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Raises:
        ModelLoadError: the name is not a torch device, or it names CUDA on a machine without it.
    """
    if isinstance(device, torch.device):
        resolved = device
    elif device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            resolved = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ModelLoadError(f"device {device!r} is not a torch device (use auto, cpu, cuda or cuda:N)") from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {str(resolved)!r} was asked for but CUDA is not available on this machine")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {str(resolved)!r} does not exist: {torch.cuda.device_count()} CUDA device(s) visible"
            )
    elif resolved.type != "cpu":
        raise ModelLoadError(f"device {str(resolved)!r} is not supported (use auto, cpu, cuda or cuda:N)")
    return resolved


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Map ``"float32"``, ``"bfloat16"`` or ``"float16"`` to the torch dtype.

    Raises:
        ModelLoadError: any other name.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is not supported; expected one of {list(DTYPES)}")
    return DTYPES[dtype]


def pickle_only_files(directory: str | Path) -> list[Path]:
    """Pickle checkpoint files under ``directory`` that have no ``.safetensors`` file in the same folder.

    A diffusers directory may carry both formats; then ``use_safetensors=True`` reads only the safetensors ones and
    the pickle files are never opened, so they are not reported.

    Args:
        directory (`str` or `Path`): A pipeline directory.

    Returns:
        `list[Path]`: sorted.
    """
    found: list[Path] = []
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file() and path.suffix in PICKLE_SUFFIXES:
            if not any(sibling.suffix == ".safetensors" for sibling in path.parent.iterdir()):
                found.append(path)
    return found


def load_directory(
    directory: Path, device: torch.device, dtype: torch.dtype, allow_pickle: bool = False
) -> Cosmos3OmniPipeline:
    """Load a local diffusers-format ``Cosmos3OmniPipeline`` directory (the directory case of
    :func:`trajectory_ensemble_node.catalog.load_pipeline`, the one loader by name).

    Args:
        directory (`Path`): The pipeline directory (``model_index.json`` at its root).
        device (`torch.device`): From :func:`resolve_device`.
        dtype (`torch.dtype`): Transformer dtype, from :func:`resolve_dtype`.
        allow_pickle (`bool`): Also load ``.bin``/``.pt``/``.pth``/``.ckpt`` weights that have no safetensors twin.
            Off by default: unpickling a file can run code it carries.

    Returns:
        `Cosmos3OmniPipeline`: progress bars off; the state input its ``action_stats.json`` declares, if any,
        recorded on it (:func:`~.state.declared_state_input`).

    Raises:
        ModelLoadError: missing directory, or not a Cosmos 3 pipeline.
        PickleWeightsError: pickle-only weights and ``allow_pickle`` is False.
        StatsFileError: the directory's ``action_stats.json`` is unreadable, or its state declaration malformed.
    """
    if not directory.is_dir():
        raise ModelLoadError(
            f"model {str(directory)!r} is neither 'tiny', 'toy' nor an existing directory (models are never "
            f"downloaded; give a local diffusers-format Cosmos 3 folder)"
        )
    if not (directory / "model_index.json").is_file():
        raise ModelLoadError(f"model directory {str(directory)!r} has no model_index.json (not a diffusers pipeline)")
    pickled = pickle_only_files(directory)
    if pickled and not allow_pickle:
        names = ", ".join(str(p.relative_to(directory)) for p in pickled[:5])
        raise PickleWeightsError(
            f"model directory {str(directory)!r} holds pickle weights with no safetensors alongside ({names}); "
            f"pickle can execute code when loaded, so it is refused. Convert them to safetensors, or set "
            f"allow_pickle_weights: true if you trust the files."
        )
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import Cosmos3OmniPipeline

    try:
        pipe = Cosmos3OmniPipeline.from_pretrained(
            str(directory),
            # Only fall back to pickle when the operator allowed it and pickle is all there is.
            use_safetensors=not (allow_pickle and pickled),
            enable_safety_checker=False,
            # ``dtype`` is diffusers 0.42's name for what older releases called ``torch_dtype`` (now deprecated).
            dtype=dtype,
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ModelLoadError(f"could not load a Cosmos 3 pipeline from {str(directory)!r}: {exc}") from exc
    if not isinstance(pipe, Cosmos3OmniPipeline):
        raise ModelLoadError(f"{str(directory)!r} is a {type(pipe).__name__}, not a Cosmos3OmniPipeline")
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    declare_state_input(pipe, read_state_input(directory))
    return pipe
