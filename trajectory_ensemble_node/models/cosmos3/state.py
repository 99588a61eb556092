"""The robot's state as one clean conditioning latent frame: the checkpoint's declaration, its checks, the frame.

Cosmos 3's policy mode conditions on an image (latent frame 0) and the instruction; it has no proprio input. A
checkpoint trained here may declare one, the way NVIDIA's Cosmos Policy feeds proprioception to a Cosmos video model
(``replace_latent_with_proprio``): the normalized state vector, tiled to fill one whole latent frame ``C x H x W``,
written into the clip as a clean conditioning frame. Here that frame is latent frame :data:`STATE_FRAME_INDEX` (1),
the first future frame of the policy clip, made a conditioning frame like frame 0: its mask is 1, the segment
builders get ``condition_frame_indexes=[0, 1]``, so the token layout and the cost per step are unchanged (upstream's
``_prepare_vision_segment`` takes any set of conditioning frames). It is built once per group with the rest of the
conditioning (:func:`~.conditioning.encode_conditioning`), never per candidate, and the lab's trainer builds it with
the same function (:func:`build_state_frame`), exported from ``models.cosmos3``.

The declaration (one home: the checkpoint's ``action_stats.json``, beside ``model_index.json``) is a ``state`` entry
that carries ``names``, at top level or inside one domain entry::

    {"pusht": {"action": {"min": [0, 0], "max": [512, 512]},
               "state": {"names": ["agent_x", "agent_y"], "method": "minmax", "min": [0, 0], "max": [512, 512]}}}

- ``names``: the state's channels, in the order the model reads them (faces pick by name, never by position);
- ``method``: ``minmax`` or ``quantile``, the statistics as :mod:`~trajectory_ensemble_node.normalization` reads them
  (``min``/``max`` or ``q01``/``q99``, one value per name). Both map the statistics' range onto [-1, 1], the range
  the frame is trained in; ``meanstd`` has no range and is refused.

Out-of-range rule: a state value outside the statistics' range is **clipped** to it (normalized [-1, 1]), as
Cosmos 3's own ``quantile`` normalization does to actions, and the group's metrics report ``state_clipped`` (the
number of clipped channels). A robot at the edge of its training data keeps being served; a missing, wrong-width or
non-finite state is refused before any model work (:meth:`StateInput.check`).

A ``state`` entry without ``names`` is statistics only (LeRobot-style files have one); it declares nothing, and such
a checkpoint is served exactly as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import MissingObservationKeyError, NonFiniteStateError, ObservationArrayError, StatsFileError
from ...normalization import STAT_KEYS, ActionNormalizer

STATE_FRAME_INDEX = 1
"""The latent frame of the policy clip that holds the state (frame 0 is the image)."""
STATE_METHODS = ("minmax", "quantile")
"""Normalizations a state may declare: both map the statistics' range onto [-1, 1]."""
STATS_FILE = "action_stats.json"
"""The checkpoint's statistics file, beside ``model_index.json``: the home of the state declaration."""
STATE_KEY = "state"
_ATTRIBUTE = "_trajectory_ensemble_state_input"


@dataclass(frozen=True, eq=False)
class StateInput:
    """A checkpoint's declared state input: its channel names in order and their normalization.

    Args:
        names (`tuple[str, ...]`): The channels, in the order the model reads them (unique, non-empty).
        normalizer (`ActionNormalizer`): ``minmax`` or ``quantile`` statistics of width ``len(names)``.
        domain (`str`, *optional*): The ``action_stats.json`` domain entry it was declared under (``None``: top level).
    """

    names: tuple[str, ...]
    normalizer: ActionNormalizer
    domain: str | None = None

    def __post_init__(self) -> None:
        names = self.names
        if (not isinstance(names, tuple) or not names
                or any(not isinstance(n, str) or not n.strip() for n in names) or len(set(names)) != len(names)):
            raise StatsFileError(f"{self.normalizer.source}: state names must be a non-empty list of unique, "
                                 f"non-empty strings, got {names!r}")
        if self.normalizer.method not in STATE_METHODS:
            raise StatsFileError(f"{self.normalizer.source}: state method must be one of {list(STATE_METHODS)} (the "
                                 f"frame is trained in [-1, 1]), got {self.normalizer.method!r}")
        if self.normalizer.width != len(names):
            raise StatsFileError(f"{self.normalizer.source}: {len(names)} state names but statistics of width "
                                 f"{self.normalizer.width}")

    @property
    def width(self) -> int:
        return len(self.names)

    @classmethod
    def from_stats(cls, names: Sequence[str], method: str, stats: Mapping[str, Any], *, domain: str | None = None,
                   source: str = "<dict>") -> StateInput:
        """Build from names, a method and its two per-channel statistics (lists or 1-D tensors).

        Raises:
            StatsFileError: bad names, method or statistics (the message names the key).
        """
        if method not in STATE_METHODS:
            raise StatsFileError(f"{source}: state method must be one of {list(STATE_METHODS)} (the frame is "
                                 f"trained in [-1, 1]), got {method!r}")
        if isinstance(names, str) or not isinstance(names, Sequence):
            raise StatsFileError(f"{source}: state names must be a list of strings, got {names!r}")
        section = f"{domain}.{STATE_KEY}" if domain else STATE_KEY
        normalizer = ActionNormalizer(method, stats, len(names), source=source, section=section)
        return cls(tuple(names), normalizer, domain)

    def entry(self) -> dict[str, Any]:
        """The declaration as it is written into ``action_stats.json`` (``names``, ``method``, its statistics)."""
        entry: dict[str, Any] = {"names": list(self.names), "method": self.normalizer.method}
        for key in STAT_KEYS[self.normalizer.method]:
            entry[key] = [float(v) for v in self.normalizer.stats[key]]
        return entry

    def check(self, state: Any) -> tuple[float, ...]:
        """Refuse a state this model cannot take; return it as floats in the declared order (physical units).

        Args:
            state (`Sequence[float]`, `np.ndarray` or `torch.Tensor` of shape `[width]`): The robot's state, in the
                declared order and in the statistics' units.

        Raises:
            MissingObservationKeyError: ``state`` is ``None`` (the model takes a state).
            ObservationArrayError: not a flat vector of ``width`` real numbers.
            NonFiniteStateError: a NaN or Inf value (the message names the channel).
        """
        if state is None:
            raise MissingObservationKeyError(
                f"this model takes the robot's state ({self.width} values: {list(self.names)}), and the request "
                f"has none")
        try:
            values = torch.as_tensor(state, dtype=torch.float64)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ObservationArrayError(
                f"state must be {self.width} numbers {list(self.names)}, got {_quote(state)} ({error})") from None
        if values.ndim != 1 or values.shape[0] != self.width:
            raise ObservationArrayError(
                f"state must have shape [{self.width}] ({list(self.names)}), got shape {list(values.shape)}: "
                f"{_quote(state)}")
        bad = [name for name, value in zip(self.names, values.tolist()) if not math.isfinite(value)]
        if bad:
            raise NonFiniteStateError(f"state holds NaN or Inf at {bad}: {_quote(state)}")
        return tuple(values.tolist())

    def pick(self, names: Sequence[str], values: Sequence[float]) -> tuple[float, ...]:
        """The declared channels picked by name from a named message (a ``JointState``'s ``name``/``position``),
        in the declared order, then checked as :meth:`check` does. Extra names are ignored; position never counts.

        Args:
            names (`Sequence[str]`): The message's names, any order.
            values (`Sequence[float]`): One value per name.

        Raises:
            MissingObservationKeyError: a declared name is absent (the message names it).
            ObservationArrayError: ``names`` and ``values`` differ in length, or a declared name appears twice.
            NonFiniteStateError: a picked value is NaN or Inf (the message names the channel).
        """
        return self.check(pick_named(self.names, names, values))

    def normalize(self, state: Sequence[float]) -> tuple[torch.Tensor, int]:
        """The checked state in the model's units, clipped to [-1, 1] (the rule in the module docstring).

        Args:
            state (`Sequence[float]`): From :meth:`check`.

        Returns:
            `tuple`: the normalized state ``[width]`` (float32) and how many channels were clipped.
        """
        values = torch.tensor(state, dtype=torch.float64)
        low, high = (self.normalizer.stats[key] for key in STAT_KEYS[self.normalizer.method])
        clipped = int(((values < low) | (values > high)).sum())
        normalized = self.normalizer.normalize(values[None])[0]
        return normalized.clamp(-1.0, 1.0).to(torch.float32), clipped


def pick_named(declared: Sequence[str], names: Sequence[str], values: Sequence[Any]) -> list[Any]:
    """The values of the ``declared`` names, in the declared order, from a named message (any order; extra names are
    ignored, position never counts). The one rule every face picks a state by: :meth:`StateInput.pick`, and the node
    from a ``JointState`` by its model's ``capabilities.state_names``. Values are returned as given (unchecked).

    Args:
        declared (`Sequence[str]`): The names the model reads, in its order.
        names (`Sequence[str]`): The message's names, any order.
        values (`Sequence`): One value per name.

    Raises:
        MissingObservationKeyError: a declared name is absent (the message names it).
        ObservationArrayError: ``names`` and ``values`` differ in length, or a declared name appears twice.
    """
    declared, names, values = list(declared), list(names), list(values)
    if len(names) != len(values):
        raise ObservationArrayError(f"a state message needs one value per name, got {len(names)} names and "
                                    f"{len(values)} values")
    missing = [name for name in declared if name not in names]
    if missing:
        raise MissingObservationKeyError(f"the state has no {missing} (this model reads {declared}; the message "
                                         f"names {_quote(names)})")
    twice = [name for name in declared if names.count(name) > 1]
    if twice:
        raise ObservationArrayError(f"the state names {twice} more than once: {_quote(names)}")
    return [values[names.index(name)] for name in declared]


def build_state_frame(normalized: torch.Tensor, channels: int, height: int, width: int) -> torch.Tensor:
    """One latent frame ``[C, H, W]`` filled with the normalized state, tiled in C-major order.

    Flat element ``k`` of the frame holds ``normalized[k % S]``, as Cosmos Policy's ``replace_latent_with_proprio``
    fills its proprio frame. The one home of the frame: serving (``encode_conditioning``) and training both call it.

    Args:
        normalized (`torch.Tensor` of shape `[S]`): The state in the model's units (:meth:`StateInput.normalize`).
        channels (`int`), height (`int`), width (`int`): The latent frame's shape.

    Returns:
        `torch.Tensor` of shape `[channels, height, width]`, on ``normalized``'s device and dtype.

    Raises:
        ValueError: ``normalized`` is not a non-empty vector, or it is longer than the frame.
    """
    if normalized.ndim != 1 or normalized.numel() == 0:
        raise ValueError(f"normalized state must be a non-empty vector, got shape {list(normalized.shape)}")
    size = channels * height * width
    if normalized.numel() > size:
        raise ValueError(f"a state of {normalized.numel()} values does not fit a latent frame of {size} elements "
                         f"({channels}x{height}x{width})")
    repeats = -(-size // normalized.numel())
    return normalized.repeat(repeats)[:size].reshape(channels, height, width)


def read_state_input(directory: str | Path) -> StateInput | None:
    """The state input ``directory/action_stats.json`` declares, or ``None`` (no file, or no ``state`` with names).

    Raises:
        StatsFileError: the file is not JSON, declares a state in more than one entry, or the declaration is
            malformed (the message names the file and the key).
    """
    path = Path(directory) / STATS_FILE
    if not path.is_file():
        return None
    source = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise StatsFileError(f"{source}: cannot read the checkpoint's statistics ({error})") from None
    if not isinstance(data, Mapping):
        return None
    found: list[tuple[str | None, Mapping[str, Any]]] = []
    if _declares(data.get(STATE_KEY)):
        found.append((None, data[STATE_KEY]))
    for key, value in data.items():
        if isinstance(value, Mapping) and _declares(value.get(STATE_KEY)):
            found.append((str(key), value[STATE_KEY]))
    if not found:
        return None
    if len(found) > 1:
        where = [f"{d}.{STATE_KEY}" if d else STATE_KEY for d, _ in found]
        raise StatsFileError(f"{source}: a checkpoint declares one state input, this file declares {where}")
    domain, entry = found[0]
    return StateInput.from_stats(entry["names"], entry.get("method", ""), entry, domain=domain, source=source)


def write_state_input(directory: str | Path, state_input: StateInput | None) -> None:
    """Write the declaration into ``directory/action_stats.json`` (merged: the file's other entries are kept).

    ``None`` writes nothing. The entry goes under ``state_input.domain`` (top level when it has none).
    """
    if state_input is None:
        return
    path = Path(directory) / STATS_FILE
    data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    section = data.setdefault(state_input.domain, {}) if state_input.domain else data
    section[STATE_KEY] = state_input.entry()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def declare_state_input(pipe: Any, state_input: StateInput | None) -> None:
    """Record on a pipeline the state input it was loaded with (``load_directory``) or is trained with (the lab)."""
    if state_input is not None and not isinstance(state_input, StateInput):
        raise TypeError(f"state_input must be a StateInput or None, got {type(state_input).__name__}")
    object.__setattr__(pipe, _ATTRIBUTE, state_input)


def declared_state_input(pipe: Any) -> StateInput | None:
    """The state input recorded on ``pipe`` (:func:`declare_state_input`), or ``None``."""
    return pipe.__dict__.get(_ATTRIBUTE)


def _declares(entry: object) -> bool:
    return isinstance(entry, Mapping) and "names" in entry


def _quote(value: Any, limit: int = 120) -> str:
    text = repr(value.tolist() if hasattr(value, "tolist") else value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
