"""The policies that ship inside the package, served by name: where their weights lie and how they must be called.

``model: toy`` (:mod:`.toy`) and ``model: pusht`` (the lab's ``train-pusht``; its README beside the weights). A node
whose action settings differ from the policy's is told so at startup (:func:`settings_mismatch`); a policy in physical
units carries its action statistics (:func:`default_stats`). No rclpy, no model package: the catalog loads the weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

ASSETS = Path(__file__).resolve().parent / "assets"

PUSHT_INSTRUCTION = "Push the T-shaped block onto the green target."
"""The instruction every PushT demonstration carries, and so the one the PushT policy is conditioned on."""


@dataclass(frozen=True)
class BundledPolicy:
    """A policy shipped under ``assets/``.

    Args:
        name (`str`): The ``model`` parameter's value that serves it.
        directory (`Path`): Its diffusers ``save_pretrained`` folder (fp16 safetensors).
        notice (`str`): One line for logs and ``/diagnostics``.
        settings (`Mapping[str, Any]`): Node parameters it was trained with, by parameter name.
        stats_file (`str`): Action statistics inside ``directory`` (``""``: it acts in normalized units).
        stats_method (`str`): The normalization of ``stats_file``.
        rebuild (`str`): The command that writes ``directory`` when the weights are absent.
        mode_threshold (`float`, *optional*): The fixed ``mode`` cut it is served with when the node's
            ``mode_threshold`` is 0 (normalized units); ``None``: the relative rule, which both bundled policies use.
    """

    name: str
    directory: Path
    notice: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    stats_file: str = ""
    stats_method: str = ""
    rebuild: str = ""
    mode_threshold: float | None = None

    @property
    def installed(self) -> bool:
        """Whether the weights are present (``model_index.json`` at the folder's root)."""
        return (self.directory / "model_index.json").is_file()


def _toy() -> BundledPolicy:
    from .toy import ACTION_SETTINGS, TOY_NOTICE, toy_pipeline_dir

    directory = toy_pipeline_dir()
    return BundledPolicy("toy", directory, TOY_NOTICE, MappingProxyType(dict(ACTION_SETTINGS)),
                         rebuild=f"trajectory-ensemble train-toy --out {directory}")


PUSHT_SETTINGS: Mapping[str, Any] = MappingProxyType({
    "domain_name": "pusht",
    "chunk_size": 16,
    "resolution_tier": 256,
    "fps": 10.0,
    "guidance_scale": 1.0,
    "instruction": PUSHT_INSTRUCTION,
})
"""How the PushT policy must be called: ``pusht`` (width 2), chunk 16 (8 executed is a serving choice), tier 256 (the
96x96 frame padded, never scaled up), 10 fps (the env's control rate), no CFG, the demonstrations' instruction."""


def _pusht() -> BundledPolicy:
    directory = ASSETS / "pusht_policy"
    return BundledPolicy("pusht", directory, "PushT policy trained on expert demonstrations (gym-pusht)",
                         PUSHT_SETTINGS, stats_file="action_stats.json", stats_method="minmax",
                         rebuild="make pusht-demos, then trajectory-ensemble train-pusht (docs/pusht.md)")


_POLICIES = {"toy": _toy, "pusht": _pusht}
BUNDLED_NAMES = tuple(_POLICIES)
"""The ``model`` values that name a bundled policy."""


def bundled_policy(model: str) -> BundledPolicy | None:
    """The bundled policy ``model`` names, or ``None`` (``tiny`` or a directory)."""
    make = _POLICIES.get(model)
    return make() if make is not None else None


def settings_mismatch(params: Any) -> str | None:
    """For a bundled policy, the action settings of ``params`` that differ from the ones it was trained with, in
    words; ``None`` when they agree or ``params.model`` names no bundled policy."""
    policy = bundled_policy(params.model)
    if policy is None:
        return None
    differ = {k: (getattr(params, k), v) for k, v in policy.settings.items() if getattr(params, k) != v}
    if not differ:
        return None
    trained = ", ".join(f"{k}: {want!r}" for k, (_, want) in differ.items())
    return (f"the {policy.name} policy was trained with {trained}"
            + "; these parameters say " + ", ".join(f"{k}: {have!r}" for k, (have, _) in differ.items()))


def default_stats(params: Any) -> tuple[str, str] | None:
    """``(file, method)`` of the bundled policy's action statistics when ``params`` name none of their own; ``None``
    when ``action_stats_file`` is set or the policy acts in normalized units."""
    policy = bundled_policy(params.model)
    if params.action_stats_file or policy is None or not policy.stats_file:
        return None
    return str(policy.directory / policy.stats_file), policy.stats_method


def mode_threshold(params: Any) -> float | None:
    """The fixed ``mode`` cut ``params`` serve: ``mode_threshold`` when set (> 0), else the bundled policy's own
    (:attr:`BundledPolicy.mode_threshold`), else ``None`` (the relative rule)."""
    if params.mode_threshold:
        return float(params.mode_threshold)
    policy = bundled_policy(params.model)
    return None if policy is None else policy.mode_threshold
