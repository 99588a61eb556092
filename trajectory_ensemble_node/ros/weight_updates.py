"""``~/update_weights``: which files a service request may make the node read.

The request's path is untrusted: off unless ``enable_weight_updates``, only files under ``weights_dir`` (symlinks
resolved first), refusals quote only the request, safetensors only. The rules in full: docs/security.md,
"``~/update_weights``". The model then validates the tensors themselves.
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Any

from ..errors import TrajectoryEnsembleError, WeightsPathError
from ..models.cosmos3 import PICKLE_SUFFIXES

DISABLED_MESSAGE = "weight updates are disabled (set enable_weight_updates)"

# Where a diffusers pipeline or transformer folder keeps its transformer weights.
_DIRECTORY_CANDIDATES = (
    "transformer/diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.safetensors",
)


def resolve_update_path(weights_dir: str, requested: str) -> Path:
    """Resolve an ``UpdateWeights`` request path to one safetensors file inside ``weights_dir``.

    Args:
        weights_dir (`str`): The only folder updates may come from.
        requested (`str`): The request's ``path``: a ``.safetensors`` file, or a folder holding
            ``transformer/diffusion_pytorch_model.safetensors`` or ``diffusion_pytorch_model.safetensors``.

    Returns:
        `Path`: the resolved file (symlinks followed), inside ``weights_dir``.

    Raises:
        WeightsPathError: on any rule above; the message says which.
    """
    if not weights_dir:
        raise WeightsPathError("weights_dir is not set; weight updates cannot read any file")
    if not requested:
        raise WeightsPathError("path is empty")
    if ".." in PurePath(requested).parts:
        raise WeightsPathError(f"path {requested!r} contains '..'; give a path inside weights_dir without '..'")
    root = Path(weights_dir).resolve(strict=True)
    candidate = Path(requested) if Path(requested).is_absolute() else root / requested
    try:
        resolved: Path | None = candidate.resolve(strict=True)
    except (OSError, RuntimeError):
        resolved = None
    if resolved is None or not resolved.is_relative_to(root):
        # One message for both: telling "missing" from "outside" would let any caller probe which paths exist, and
        # quoting the resolved target would reveal symlink destinations and the host's layout.
        raise WeightsPathError(f"path {requested!r} is refused by the rule 'an existing file inside weights_dir': "
                               f"it does not exist there, or resolves outside weights_dir (symlinks followed); the "
                               f"two are not told apart")
    if resolved.is_dir():
        for name in _DIRECTORY_CANDIDATES:
            inner = resolved / name
            if inner.is_file():
                # The file itself may be a link: check it again.
                return resolve_update_path(weights_dir, str(inner))
        raise WeightsPathError(
            f"folder {requested!r} has none of {list(_DIRECTORY_CANDIDATES)} (safetensors only; pickle is never read)"
        )
    if resolved.suffix in PICKLE_SUFFIXES:
        raise WeightsPathError(
            f"path {requested!r} is a pickle file ({resolved.suffix}); pickle can run code when loaded and is never "
            f"read; convert it to .safetensors"
        )
    if resolved.suffix != ".safetensors":
        raise WeightsPathError(f"path {requested!r} is not a .safetensors file")
    return resolved


def serve_update(model: Any, params: Any, request: Any, response: Any, logger: Any, *, timeout: float) -> Any:
    """Answer one ``UpdateWeights`` request: refuse it by these rules, or apply it between groups.

    Args:
        model (`Cosmos3ActionModel`): The served model (``update_weights``, ``weights_version``).
        params (`NodeParams`): ``enable_weight_updates`` and ``weights_dir``.
        request (`UpdateWeights.Request`): ``path`` and ``strict``.
        response (`UpdateWeights.Response`): Filled and returned; always answered, never raised through.
        logger (`Any`): The node's logger.
        timeout (`float`): Seconds to wait for the engine to apply the update between groups.
    """
    response.weights_version = int(model.weights_version)
    if not params.enable_weight_updates:
        response.success, response.message = False, DISABLED_MESSAGE
        return response
    try:
        path = resolve_update_path(params.weights_dir, request.path)
        report = model.update_weights(path, strict=bool(request.strict), timeout=timeout)
    except TrajectoryEnsembleError as error:
        response.success, response.message = False, str(error)
        logger.warning(f"update_weights refused: {error}")
        return response
    except Exception as error:  # noqa: BLE001 - a service must answer, whatever failed; logged, not hidden
        response.success, response.message = False, f"{type(error).__name__}: {error}"
        logger.error(f"update_weights failed unexpectedly: {response.message}")
        return response
    response.success = True
    response.weights_version = int(report.weights_version)
    response.message = f"loaded {len(report.applied)} tensor(s) from {path}; weights_version {report.weights_version}"
    if report.skipped:
        response.message += f"; skipped {len(report.skipped)}: {sorted(report.skipped)[:5]}"
    logger.info(response.message)
    return response
