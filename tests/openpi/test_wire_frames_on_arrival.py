"""Frames and state checked where they arrive, on the OpenPI wire (issue 45, row 7).

Before, a frame under 16 pixels on a side, or 2x256, passed the schema and failed in the pipeline's resize as
``ENGINE_FAILURE`` (31, "internal error"), and a ragged ``observation/joint_position`` list failed in numpy, also as
31. Now the node's rule (``serving/input_limits.py``) refuses them in the schema parse: ``INVALID_FRAME`` (23) for an image
the model cannot encode, ``OBSERVATION_SCHEMA`` (25) for a ragged, non-numeric or non-finite state; nothing reaches
the engine, and the same connection serves the next request. Plain websockets and msgpack, as a hostile client.
"""

from __future__ import annotations

import numpy as np
import pytest
from _openpi_harness import serving, toy_image

from trajectory_ensemble_node.errors import ErrorCode
from trajectory_ensemble_node.models.cosmos3 import MIN_IMAGE_SIDE, min_image_side
from trajectory_ensemble_node.openpi import OpenPIPolicy
from trajectory_ensemble_node.wire.codec import parse_error_frame
from trajectory_ensemble_node.wire.schemas import get_schema

websockets_sync = pytest.importorskip("websockets.sync.client")
msgpack_numpy = pytest.importorskip("openpi_client.msgpack_numpy")

pytestmark = [
    pytest.mark.slow,
    # websockets >= 14 asks for `with connect(...)`; openpi-client 0.1.2 (and these helpers) keep the connection open.
    pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning"),
]


def connect(url: str):
    ws = websockets_sync.connect(url, compression=None, max_size=None)
    msgpack_numpy.unpackb(ws.recv())  # the metadata
    return ws


def ask(ws, request: dict):
    ws.send(msgpack_numpy.packb(request))
    reply = ws.recv()
    return parse_error_frame(reply) if isinstance(reply, str) else msgpack_numpy.unpackb(reply)


def test_the_served_models_bound_is_the_rules(toy_policy):
    assert min_image_side(toy_policy.model.pipe) == MIN_IMAGE_SIDE == toy_policy.limits.min_image_side == 16


@pytest.mark.parametrize(("height", "width"), [(1, 1), (15, 15), (2, 256), (256, 2)])
def test_an_image_the_model_cannot_encode_ends_23_and_the_connection_serves_on(toy_policy, height, width):
    with serving(toy_policy) as server:
        ws = connect(server.url)
        tiny = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
        refused = ask(ws, {"observation/image": tiny, "num_candidates": 2, "seed": 1})
        assert (refused["error"], refused["code"]) == ("INVALID_FRAME", int(ErrorCode.INVALID_FRAME)), refused
        assert f"observation/image is {width}x{height}" in refused["message"]
        assert "at least 16 pixels" in refused["message"]
        # The smallest frame the rule lets through is one the model serves, thin or not.
        for shape in ((16, 16, 3), (16, 512, 3)):
            served = ask(ws, {"observation/image": np.full(shape, 90, np.uint8), "num_candidates": 2, "seed": 1})
            assert "error" not in served, served
            assert np.asarray(served["actions"]).shape == (8, 2)
        ws.close()


def test_a_ragged_or_non_numeric_joint_position_ends_25_not_31(toy_policy):
    droid = OpenPIPolicy(toy_policy.model, toy_policy.params, notice=toy_policy.notice, schema=get_schema("droid"))
    with serving(droid) as server:
        ws = connect(server.url)
        image = toy_image()
        for joints, quoted in (([0.0] * 6 + [[1.0, 2.0]], "ragged"), (["a"] * 7, "must be numbers"),
                               ([0.0] * 6 + [float("nan")], "NaN or Inf")):
            refused = ask(ws, {"observation/image": image, "observation/joint_position": joints})
            assert refused["code"] == int(ErrorCode.OBSERVATION_SCHEMA), refused
            assert quoted in refused["message"] and "observation/joint_position" in refused["message"]
        served = ask(ws, {"observation/image": image, "observation/joint_position": [0.0] * 7, "seed": 3})
        assert "error" not in served and np.asarray(served["actions"]).shape == (8, 2)
        ws.close()
