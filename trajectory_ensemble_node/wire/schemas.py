"""Observation schemas: which request keys carry the model's image, the robot state and the prompt.

The ``toy`` and ``droid`` schemas, the state key :data:`STATE_KEY` and what is refused (``OBSERVATION_SCHEMA``, 25,
naming the key; the node's image limits on every view): docs/openpi.md, "Observation schemas".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from PIL import Image

from ..errors import (
    MissingObservationKeyError,
    ObservationArrayError,
    ObservationSchemaError,
    ParameterError,
    UnknownObservationKeyError,
)
from ..quoting import quote_value
from ..serving.frames import tile_views
from ..serving.input_limits import InputLimits, check_image_dimensions, check_image_fields, state_values

IMAGE = "H×W×3 uint8"


@dataclass(frozen=True)
class ImageLayout:
    """One way a request may carry the model's frame.

    Args:
        name (`str`): ``"composite"`` or ``"views"``.
        keys (`tuple[str, ...]`): The image keys, all required for this layout.
        compose (`Callable[[list[np.ndarray]], np.ndarray]`): The views, in ``keys`` order, to one ``[H, W, 3]``.
    """

    name: str
    keys: tuple[str, ...]
    compose: Callable[[list[np.ndarray]], np.ndarray] = lambda views: views[0]


STATE_KEY = "observation/state"
"""The request key of the robot's state, for a model that takes one: ``[len(state_names)]`` numbers."""


@dataclass(frozen=True)
class StateKey:
    """A float state key: checked and reported back, and fed to the model when it names the model's channels.

    Args:
        key (`str`): The request key.
        shapes (`tuple[tuple[int, ...], ...]`): Accepted shapes (``()`` = a scalar).
        names (`tuple[str, ...]`): The model's state channels this key carries, in the model's order; empty (the
            default): an optional key, checked and not fed. With names the key is required.
    """

    key: str
    shapes: tuple[tuple[int, ...], ...]
    names: tuple[str, ...] = ()

    @property
    def fed(self) -> bool:
        """Whether the key is the model's state input (required, fed)."""
        return bool(self.names)

    def describe(self) -> str:
        shapes = " or ".join("scalar" if not s else str(list(s)) for s in self.shapes) + " float"
        return f"{shapes}, fed to the model: {', '.join(self.names)}" if self.fed else shapes


@dataclass(frozen=True)
class ParsedObservation:
    """What a request's observation keys become.

    Args:
        image (`np.ndarray` of shape `[H, W, 3]`): The frame the model is conditioned on (uint8, a copy).
        prompt (`str`): The request's prompt (``""`` = the configured instruction).
        state (`dict[str, np.ndarray]`): The state keys present, as float64 arrays.
        layout (`str`): Which :class:`ImageLayout` the request used.
        model_state (`tuple[float, ...]`, *optional*): The state the model takes (:data:`STATE_KEY`'s values, in the
            model's declared order, float64); ``None`` for a model without a state input.
    """

    image: np.ndarray
    prompt: str
    state: dict[str, np.ndarray] = field(default_factory=dict)
    layout: str = "composite"
    model_state: tuple[float, ...] | None = None


@dataclass(frozen=True)
class ObservationSchema:
    """The keys one kind of client sends.

    Args:
        name (`str`): The ``openpi_schema`` value.
        layouts (`tuple[ImageLayout, ...]`): Ways to carry the frame; a request uses exactly one.
        state (`tuple[StateKey, ...]`): Optional state keys.
        prompt_key (`str`): The prompt's key.
        server_config (`Mapping[str, Any]`): vLLM-Omni's ``policy_server_config`` fields for the metadata.
    """

    name: str
    layouts: tuple[ImageLayout, ...]
    state: tuple[StateKey, ...] = ()
    prompt_key: str = "prompt"
    server_config: Mapping[str, Any] = field(default_factory=dict)

    def keys(self) -> tuple[str, ...]:
        """Every key this schema reads."""
        images = tuple(k for layout in self.layouts for k in layout.keys)
        return images + tuple(s.key for s in self.state) + (self.prompt_key,)

    def for_model(self, state_names: Sequence[str]) -> ObservationSchema:
        """This schema for a model that reads ``state_names`` (``capabilities.state_names``): :data:`STATE_KEY`
        becomes a required key of that width, fed to the model. A model without state (no names) gets the schema as
        it is.

        Args:
            state_names (`Sequence[str]`): The model's state channels, in its order (empty: it takes no state).
        """
        names = tuple(state_names)
        if not names:
            return self
        fed = StateKey(STATE_KEY, ((len(names),),), names)
        return dataclasses.replace(self, state=(fed, *(s for s in self.state if s.key != STATE_KEY)))

    @property
    def state_names(self) -> tuple[str, ...]:
        """The model's state channels the schema feeds (empty: it feeds none)."""
        return next((s.names for s in self.state if s.fed), ())

    def expected(self) -> str:
        """The keys, in words, for error messages."""
        images = " or all of ".join(", ".join(layout.keys) for layout in self.layouts)
        state = "".join(f"; {s.key} ({s.describe()}, {'required' if s.fed else 'optional'})" for s in self.state)
        return f"{images} ({IMAGE} each){state}; {self.prompt_key} (str, optional)"

    def describe(self) -> dict[str, Any]:
        """The schema for the connection metadata."""
        return {
            "name": self.name,
            "images": {layout.name: list(layout.keys) for layout in self.layouts},
            "image_format": IMAGE,
            "state": {s.key: s.describe() for s in self.state},
            "prompt": self.prompt_key,
        }

    def parse(self, obs: Mapping[str, Any], *, extras: Iterable[str], limits: InputLimits) -> ParsedObservation:
        """Check the request against the schema and build the frame.

        Args:
            obs (`Mapping[str, Any]`): The decoded request.
            extras (`Iterable[str]`): Keys read elsewhere (the per-request extras), so not unknown.
            limits (`InputLimits`): ``max_image_bytes``, ``max_image_pixels`` and ``min_image_side`` apply to every
                view.

        Raises:
            MissingObservationKeyError, UnknownObservationKeyError, ObservationArrayError: the named check failed.
            ImageTooLargeError: a view above the image limits.
            FrameDimensionsError: a view with a side under ``limits.min_image_side`` (``INVALID_FRAME``).
        """
        try:
            return self._parse(obs, extras, limits)
        except ObservationSchemaError as error:
            if "expects" in str(error):
                raise
            # Every schema error lists the keys expected.
            raise type(error)(f"{error}; schema {quote_value(self.name)} expects {self.expected()}") from None

    def _parse(self, obs: Mapping[str, Any], extras: Iterable[str], limits: InputLimits) -> ParsedObservation:
        layout = self._layout(obs)
        unknown = sorted(set(obs) - set(self.keys()) - set(extras))
        if unknown:
            raise UnknownObservationKeyError(
                f"unknown key(s) {quote_value(unknown)}: schema {quote_value(self.name)} expects "
                f"{self.expected()}, plus the extras "
                f"{sorted(extras)}")
        views = [self._image(key, obs[key], limits) for key in layout.keys]
        if len(views) > 1 and len({v.shape for v in views}) > 1:
            raise ObservationArrayError(f"the views {list(layout.keys)} must share one shape, got "
                                        f"{[list(v.shape) for v in views]}")
        missing = [s.key for s in self.state if s.fed and s.key not in obs]
        if missing:
            raise MissingObservationKeyError(f"missing {missing}: this model takes the robot's state "
                                             f"({list(self.state_names)}); schema {quote_value(self.name)} expects "
                                             f"{self.expected()}")
        state = {s.key: self._state(s, obs[s.key]) for s in self.state if s.key in obs}
        fed = next((s.key for s in self.state if s.fed), None)
        # float64 values as Python floats: the same bits the model's own check (float64) reads.
        model_state = None if fed is None else tuple(float(v) for v in state[fed].tolist())
        prompt = obs.get(self.prompt_key, "")
        if prompt is None:
            prompt = ""
        if not isinstance(prompt, str):
            raise ObservationArrayError(f"{self.prompt_key} must be a string, got "
                                        f"{quote_value(prompt, typed=True)}")
        return ParsedObservation(np.ascontiguousarray(layout.compose(views)), prompt, state, layout.name, model_state)

    def _layout(self, obs: Mapping[str, Any]) -> ImageLayout:
        present = [layout for layout in self.layouts if any(k in obs for k in layout.keys)]
        if len(present) > 1:
            raise ObservationSchemaError(
                f"the request mixes image layouts {[layout.name for layout in present]}; send one")
        if not present or any(k not in obs for k in present[0].keys):
            wanted = present[0].keys if present else self.layouts[0].keys
            missing = [k for k in wanted if k not in obs]
            raise MissingObservationKeyError(f"missing {missing}: schema {quote_value(self.name)} expects "
                                             f"{self.expected()}; "
                                             f"the request has {quote_value(sorted(obs))}")
        return present[0]

    @staticmethod
    def _image(key: str, value: Any, limits: InputLimits) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            raise ObservationArrayError(f"{key} must be an {IMAGE} numpy array, got "
                                        f"{quote_value(value, typed=True)}")
        if value.dtype != np.uint8:
            raise ObservationArrayError(f"{key} must be uint8 ({IMAGE}), got dtype {value.dtype} "
                                        f"shape {list(value.shape)}")
        if value.ndim != 3 or value.shape[2] != 3 or value.shape[0] < 1 or value.shape[1] < 1:
            raise ObservationArrayError(f"{key} must have shape {IMAGE}, got {list(value.shape)}")
        height, width = int(value.shape[0]), int(value.shape[1])
        check_image_fields(value.size, width, height, "rgb8", limits)
        check_image_dimensions(height, width, limits.min_image_side, source=key)
        return value

    @staticmethod
    def _state(spec: StateKey, value: Any) -> np.ndarray:
        if not isinstance(value, (list, tuple, float, int, np.generic, np.ndarray)):
            raise ObservationArrayError(f"{spec.key} must be {spec.describe()}, got "
                                        f"{quote_value(value, typed=True)}")
        # The node's rule for state values: numbers only, not ragged, finite (ObservationArrayError, 25).
        state = state_values(value, what=spec.key)
        if tuple(state.shape) not in spec.shapes:
            raise ObservationArrayError(f"{spec.key} must have shape {spec.describe()}, got {list(state.shape)}: "
                                        f"{quote_value(state.tolist())}")
        return state


def compose_droid(views: Sequence[np.ndarray]) -> np.ndarray:
    """RoboLab's composite from strands' three views: the wrist view on top, the two exterior views below.

    Args:
        views (`Sequence[np.ndarray]`): ``[exterior_1, exterior_2, wrist]``, each ``[H, W, 3]`` uint8.

    Returns:
        `np.ndarray` of shape `[2H, 2W, 3]`: the wrist view resized (bilinear) to ``[H, 2W]`` over the exterior views
        side by side (their pixels untouched).
    """
    exterior_1, exterior_2, wrist = views
    below = tile_views([exterior_1, exterior_2])
    top = np.asarray(Image.fromarray(wrist).resize((below.shape[1], wrist.shape[0]), Image.BILINEAR), np.uint8)
    return np.concatenate([top, below], axis=0)


DROID_VIEWS = ("observation/exterior_image_1_left", "observation/exterior_image_2_left",
               "observation/wrist_image_left")

SCHEMAS: dict[str, ObservationSchema] = {
    "toy": ObservationSchema(
        "toy", (ImageLayout("composite", ("observation/image",)),),
        server_config={"n_external_cameras": 1, "needs_wrist_camera": False, "needs_stereo_camera": False},
    ),
    "droid": ObservationSchema(
        "droid",
        (ImageLayout("composite", ("observation/image",)), ImageLayout("views", DROID_VIEWS, compose_droid)),
        state=(StateKey("observation/joint_position", ((7,),)), StateKey("observation/gripper_position", ((1,), ()))),
        server_config={"n_external_cameras": 2, "needs_wrist_camera": True, "needs_stereo_camera": False},
    ),
}
"""The built-in schemas, by ``openpi_schema`` name."""


def get_schema(name: str) -> ObservationSchema:
    """The schema named by the ``openpi_schema`` parameter.

    Raises:
        ParameterError: no such schema.
    """
    if name not in SCHEMAS:
        raise ParameterError(f"invalid parameters:\n  openpi_schema: {quote_value(name)} is not one of "
                             f"{sorted(SCHEMAS)}")
    return SCHEMAS[name]
