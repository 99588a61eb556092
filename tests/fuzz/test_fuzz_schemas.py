"""Fuzz the OpenPI observation schemas (``wire/schemas.py``): ``get_schema(name).parse`` for every schema.

Requests are generated the way the wire hands them over (numpy arrays of the accepted dtypes, numpy scalars, plain
msgpack values): the right keys with wrong types, dtypes and shapes, NaN/Inf state, ragged lists, tiny, thin and
over-limit images, mixed layouts and unknown keys. Each must parse to an observation the model can take (a uint8
``[H, W, 3]`` image whose views are within the limits, finite float64 state, a string prompt) or be refused with a
named observation error.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
from _fuzz import TIMEOUT_S, check_named, fuzz_settings, large_bytes, large_text, record
from hypothesis import event, example, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.openpi.extras import EXTRA_KEYS
from trajectory_ensemble_node.wire.schemas import SCHEMAS, ParsedObservation, get_schema
from trajectory_ensemble_node.serving.input_limits import InputLimits

pytestmark = pytest.mark.timeout(TIMEOUT_S)

LIMITS = InputLimits(max_instruction_chars=64, max_instruction_tokens=0, max_image_bytes=24 * 24 * 3,
                     max_image_pixels=22 * 22)
"""Small limits, so that generated images cross them often without being large."""
MIN_SIDE = getattr(LIMITS, "min_image_side", 1)
"""The fewest pixels a side may have (16 for Cosmos 3, once the schemas check it)."""
SCHEMA_CODES = {ErrorCode.OBSERVATION_SCHEMA, ErrorCode.IMAGE_TOO_LARGE, ErrorCode.INVALID_FRAME,
                ErrorCode.INVALID_MESSAGE, ErrorCode.INSTRUCTION_TOO_LONG}

WIRE_DTYPES = ["|u1", "|i1", "<i2", "<u2", "<i4", "<i8", "<u8", "<f2", "<f4", "<f8", ">f4", "|b1"]

good_images = hnp.arrays(np.uint8, st.tuples(st.integers(16, 22), st.integers(16, 22), st.just(3)))
"""Images the limits accept: most requests carry them, so the checks after the image's run too."""
hostile_images = st.one_of(
    hnp.arrays(np.uint8, st.tuples(st.integers(0, 30), st.integers(0, 30), st.sampled_from([3, 1, 4, 0]))),
    hnp.arrays(st.sampled_from(WIRE_DTYPES).map(np.dtype), hnp.array_shapes(min_dims=0, max_dims=4, max_side=6)),
    st.sampled_from([(1, 400), (400, 1), (1, 1), (16, 30), (15, 16), (23, 22), (22, 22), (0, 5)]).map(
        lambda s: np.zeros((*s, 3), np.uint8)),
    st.lists(st.integers(0, 255), max_size=12), st.binary(max_size=12), st.text(max_size=4), st.none(),
)
images = st.one_of(good_images, good_images, hostile_images)
states = st.one_of(
    hnp.arrays(st.sampled_from(WIRE_DTYPES).map(np.dtype), st.sampled_from([(7,), (1,), (), (6,), (8,), (7, 1), (0,)])),
    hnp.arrays(np.float64, st.sampled_from([(7,), (1,), ()])),  # NaN and Inf included by default
    st.lists(st.floats(), min_size=7, max_size=7), st.lists(st.integers(-(2**70), 2**70), min_size=1, max_size=7),
    st.lists(st.one_of(st.floats(), st.integers(-(2**70), 2**70), st.booleans(), st.none(), st.text(max_size=3)),
             max_size=9),
    st.lists(st.lists(st.floats(), max_size=3), min_size=1, max_size=4),  # ragged
    st.lists(st.one_of(st.floats(), st.lists(st.floats(), max_size=2)), min_size=1, max_size=7),  # ragged, mixed
    st.floats(), st.integers(-(2**70), 2**70), st.booleans(), st.none(), st.text(max_size=4), st.binary(max_size=8),
    st.floats(width=32).map(np.float32), st.integers(-(2**63), 2**63 - 1).map(np.int64), st.just(np.bool_(True)),
)
prompts = st.one_of(st.text(max_size=80), st.none(), st.integers(), st.binary(max_size=8), st.lists(st.text(),
                                                                                                   max_size=2))
junk = st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=8), st.binary(max_size=8), images, states,
                 large_text, large_bytes)  # megabytes a refusal quotes, briefly (check_named checks its frame)


@st.composite
def requests(draw: st.DrawFn, schema_name: str) -> dict[str, Any]:
    schema = SCHEMAS[schema_name]
    obs: dict[str, Any] = {}
    # Usually one whole layout; sometimes part of one, none, or two mixed.
    layouts = [draw(st.sampled_from(schema.layouts))]
    if not draw(st.integers(0, 5)):
        layouts = draw(st.lists(st.sampled_from(schema.layouts), max_size=2, unique_by=lambda layout: layout.name))
    for layout in layouts:
        keys = layout.keys if draw(st.integers(0, 5)) else draw(st.lists(st.sampled_from(layout.keys), unique=True))
        shared = draw(images)
        for key in keys:
            # Views usually share one frame's shape; sometimes each has its own.
            obs[key] = copy.copy(shared) if draw(st.integers(0, 3)) else draw(images)
    for state in schema.state:
        if draw(st.booleans()):
            obs[state.key] = draw(states)
    if draw(st.booleans()):
        obs[schema.prompt_key] = draw(prompts)
    for key in draw(st.lists(st.one_of(st.text(max_size=12), large_text, st.sampled_from(schema.keys() + EXTRA_KEYS)),
                             max_size=2)) if not draw(st.integers(0, 3)) else ():
        obs.setdefault(key, draw(junk))
    return obs


def _check(schema_name: str, obs: dict[str, Any]) -> None:
    schema = get_schema(schema_name)
    try:
        parsed = schema.parse(obs, extras=EXTRA_KEYS, limits=LIMITS)
    except Exception as error:  # noqa: BLE001 - the property: only named errors
        event(f"refused: {ErrorCode(check_named(error, SCHEMA_CODES)).name}")
        return
    event(f"parsed: {parsed.layout}")
    assert isinstance(parsed, ParsedObservation)
    image = parsed.image
    assert isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
    assert image.flags.c_contiguous and image.shape[0] >= 1 and image.shape[1] >= 1
    views = 3 if parsed.layout == "views" else 1
    # Each view within the limits (the views layout composes three views into [2H, 2W, 3]).
    view_pixels = image.shape[0] * image.shape[1] // (4 if views == 3 else 1)
    assert view_pixels <= LIMITS.max_image_pixels and view_pixels * 3 <= LIMITS.max_image_bytes, image.shape
    assert min(image.shape[:2]) >= MIN_SIDE * (2 if views == 3 else 1), image.shape
    assert isinstance(parsed.prompt, str)
    for key, value in parsed.state.items():
        assert key in obs and value.dtype == np.float64 and np.isfinite(value).all(), (key, value)


@pytest.mark.parametrize("schema_name", sorted(SCHEMAS))
@fuzz_settings("schemas")
@given(data=st.data())
def test_any_request_parses_to_a_usable_observation_or_a_named_refusal(schema_name: str, data: st.DataObject) -> None:
    record("schemas")
    _check(schema_name, data.draw(requests(schema_name)))
