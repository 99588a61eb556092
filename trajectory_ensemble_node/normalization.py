"""Per-channel action statistics and the normalizations Cosmos 3 uses.

``quantile`` (clamped to [-1, 1]; the inverse does not clamp), ``meanstd`` and ``minmax``, every denominator at least
``EPS``. The formulas, the three shapes a statistics file may take and the lookup rule: docs/node.md, "Action
statistics".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from .errors import StatsFileError

NORMALIZATION_METHODS = ("quantile", "meanstd", "minmax")

STAT_KEYS: dict[str, tuple[str, str]] = {
    "quantile": ("q01", "q99"),
    "meanstd": ("mean", "std"),
    "minmax": ("min", "max"),
}
"""The two per-channel statistics each method reads: (offset key, range key)."""

EPS = 1e-8
"""Lower bound of every normalization denominator."""


@dataclass(frozen=True, eq=False)
class ActionNormalizer:
    """Per-channel normalization of actions ``[..., D]`` with ``D == width``.

    The constructor validates the statistics; :meth:`from_json` and :meth:`from_dict` find them in a stats file.

    Args:
        method (`str`): One of :data:`NORMALIZATION_METHODS`.
        stats (`Mapping[str, object]`): A mapping holding at least the method's two statistics (:data:`STAT_KEYS`)
            as lists of numbers or 1-D tensors; only those two are kept, as float64 ``[width]`` tensors.
        width (`int`): The embodiment's raw action width; every statistic must have this length.
        source (`str`, defaults to `"<dict>"`): Where the statistics came from (a file path), for messages.
        section (`str`, defaults to `""`): Key path of ``stats`` inside ``source`` (e.g. ``"droid_lerobot.action"``),
            for messages.
    """

    method: str
    stats: Mapping[str, torch.Tensor]
    width: int
    source: str = "<dict>"
    section: str = ""
    _offset: torch.Tensor = field(init=False, repr=False)
    _denominator: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        _check_method(self.method, self.source)
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise StatsFileError(f"{self.source}: action width must be an int >= 1, got {self.width!r}")
        if not isinstance(self.stats, Mapping):
            raise StatsFileError(f"{self.source}: statistics must be a mapping, got {type(self.stats).__name__}")
        stats, span = _validate_stats(self.stats, self.method, self.width, self.source, self.section)
        object.__setattr__(self, "stats", stats)
        object.__setattr__(self, "_offset", stats[STAT_KEYS[self.method][0]])
        object.__setattr__(self, "_denominator", span.clamp_min(EPS))

    @classmethod
    def from_dict(
        cls, data: Mapping[str, object], method: str, width: int, domain: str | None = None, *, source: str = "<dict>"
    ) -> ActionNormalizer:
        """Build from in-memory statistics laid out like a stats file (see the module docstring).

        Args:
            data (`Mapping[str, object]`): Parsed statistics.
            method (`str`): One of :data:`NORMALIZATION_METHODS`.
            width (`int`): The embodiment's raw action width; every list must have this length.
            domain (`str`, *optional*): Domain entry to read, e.g. ``"droid_lerobot"``.
            source (`str`, defaults to `"<dict>"`): Name used in error messages.

        Returns:
            `ActionNormalizer`

        Raises:
            StatsFileError: On any problem; the message names the source and the key.
        """
        _check_method(method, source)
        stats, section = _locate(data, method, domain, source)
        return cls(method, stats, width, source=source, section=section)

    @classmethod
    def from_json(
        cls, path: str | os.PathLike[str], method: str, width: int, domain: str | None = None
    ) -> ActionNormalizer:
        """Load statistics from a JSON file (shapes in the module docstring).

        Args:
            path (`str` or `os.PathLike`): The stats file.
            method (`str`): One of :data:`NORMALIZATION_METHODS`.
            width (`int`): The embodiment's raw action width (e.g. 10 for ``droid_lerobot``).
            domain (`str`, *optional*): Domain entry to read.

        Returns:
            `ActionNormalizer`

        Raises:
            StatsFileError: Missing or unreadable file, invalid JSON, missing key, non-numeric or non-finite value,
                wrong width, or a zero/negative range; the message names the file and the key (and the channel).
        """
        source = os.fspath(path)
        try:
            with open(source, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            raise StatsFileError(f"{source}: action statistics file not found") from None
        except json.JSONDecodeError as error:
            raise StatsFileError(f"{source}: not valid JSON ({error})") from None
        except (OSError, UnicodeDecodeError) as error:
            raise StatsFileError(f"{source}: cannot read action statistics ({error})") from None
        return cls.from_dict(data, method, width, domain, source=source)

    def _columns(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The method's (offset, denominator) on the actions' device and dtype, after checking the width."""
        if not isinstance(actions, torch.Tensor) or actions.ndim < 1 or actions.shape[-1] != self.width:
            shape = tuple(actions.shape) if isinstance(actions, torch.Tensor) else type(actions).__name__
            raise ValueError(f"actions must have shape [..., {self.width}] for stats from {self.source}, got {shape}")
        dtype = actions.dtype if actions.is_floating_point() else torch.float32
        return self._offset.to(actions.device, dtype), self._denominator.to(actions.device, dtype)

    def normalize(self, actions: torch.Tensor) -> torch.Tensor:
        """Map raw actions to normalized ones.

        Args:
            actions (`torch.Tensor` of shape `[..., D]`): Raw actions, ``D == width``.

        Returns:
            `torch.Tensor` of shape `[..., D]`: Normalized actions (``quantile``: clamped to [-1, 1]).

        Raises:
            ValueError: If the last dimension is not ``width``; the message quotes both shapes.
        """
        offset, denominator = self._columns(actions)
        if self.method == "meanstd":
            return (actions - offset) / denominator
        normalized = 2.0 * (actions - offset) / denominator - 1.0
        return normalized.clamp(-1.0, 1.0) if self.method == "quantile" else normalized

    def denormalize(self, actions: torch.Tensor) -> torch.Tensor:
        """Map normalized actions back to raw ones (the affine inverse; no clamping).

        Args:
            actions (`torch.Tensor` of shape `[..., D]`): Normalized actions, ``D == width``.

        Returns:
            `torch.Tensor` of shape `[..., D]`: Raw actions.

        Raises:
            ValueError: If the last dimension is not ``width``; the message quotes both shapes.
        """
        offset, denominator = self._columns(actions)
        if self.method == "meanstd":
            return actions * denominator + offset
        return (actions + 1.0) * 0.5 * denominator + offset


def _check_method(method: object, source: str) -> None:
    if method not in NORMALIZATION_METHODS:
        raise StatsFileError(f"{source}: normalization method must be one of {NORMALIZATION_METHODS}, got {method!r}")


def _locate(
    data: Mapping[str, object], method: str, domain: str | None, source: str
) -> tuple[Mapping[str, object], str]:
    """Find the mapping that holds the method's keys; returns it and its key path (``"droid_lerobot.action"``)."""
    if not isinstance(data, Mapping):
        raise StatsFileError(f"{source}: expected a JSON object at top level, got {type(data).__name__}")
    section: Mapping[str, object] = data
    path: list[str] = []
    if domain is not None:
        if domain not in data:
            raise StatsFileError(f"{source}: missing domain key {domain!r}; top-level keys: {sorted(data)}")
        section = data[domain]  # type: ignore[assignment]
        path.append(domain)
        if not isinstance(section, Mapping):
            raise StatsFileError(f"{source}: key {domain!r} must hold an object, got {type(section).__name__}")
    offset_key = STAT_KEYS[method][0]
    if offset_key not in section and isinstance(section.get("action"), Mapping):
        section = section["action"]  # type: ignore[assignment]
        path.append("action")
    return section, ".".join(path)


def _validate_stats(
    section: Mapping[str, object], method: str, width: int, source: str, path: str
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Check and convert the method's two per-channel lists (or tensors) to float64 tensors; also return the span
    (the denominator before the EPS guard)."""
    where = f"{path}." if path else ""
    stats: dict[str, torch.Tensor] = {}
    for key in STAT_KEYS[method]:
        name = f"{where}{key}"
        if key not in section:
            raise StatsFileError(
                f"{source}: missing key {name!r} for method {method!r}; keys there: {sorted(map(str, section))}"
            )
        values = _as_channels(section[key], name, source)
        if values.shape[0] != width:
            raise StatsFileError(
                f"{source}: key {name!r} has {values.shape[0]} channels, "
                f"but the embodiment's raw action width is {width}"
            )
        bad = (~torch.isfinite(values)).nonzero().flatten().tolist()
        if bad:
            raise StatsFileError(f"{source}: key {name!r} has non-finite values at channel(s) {bad}")
        stats[key] = values
    offset_key, range_key = STAT_KEYS[method]
    offset, spread = stats[offset_key], stats[range_key]
    span = spread if method == "meanstd" else spread - offset
    bad = (span <= 0).nonzero().flatten().tolist()
    if bad:
        rule = f"{range_key} > 0" if method == "meanstd" else f"{range_key} > {offset_key}"
        raise StatsFileError(f"{source}: key {where + range_key!r} violates {rule} at channel(s) {bad}")
    return stats, span


def _as_channels(value: object, name: str, source: str) -> torch.Tensor:
    """A 1-D float64 tensor from a list of numbers (or a tensor), else StatsFileError naming the key."""
    if isinstance(value, torch.Tensor):
        if value.ndim != 1 or value.numel() == 0 or value.is_complex() or value.dtype == torch.bool:
            raise StatsFileError(f"{source}: key {name!r} must be a non-empty 1-D real tensor, got {value!r}")
        return value.detach().to("cpu", torch.float64)
    if not isinstance(value, (list, tuple)) or not value:
        raise StatsFileError(f"{source}: key {name!r} must be a non-empty list of numbers, got {value!r}")
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise StatsFileError(f"{source}: key {name!r} channel {index} is not a number: {item!r}")
    try:
        return torch.tensor([float(item) for item in value], dtype=torch.float64)
    except OverflowError:
        raise StatsFileError(f"{source}: key {name!r} has a value too large for a float") from None
