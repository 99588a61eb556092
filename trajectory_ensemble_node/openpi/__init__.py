"""The OpenPI face of the service: ``trajectory-ensemble serve-openpi``, beside the node, never importing rclpy.

openpi-client's ``WebsocketClientPolicy``, vLLM-Omni's clients, RoboLab and strands talk to the same engine the node
serves, over OpenPI's msgpack websocket wire, and requests from different connections share engine batches.

- :mod:`.wire`: msgpack frames in openpi-client's numpy encoding, and the error frame;
- :mod:`.schemas`: which request keys carry the image(s), state and prompt (``toy``, ``droid``);
- :mod:`.extras`: the per-request extras (count, reducer, seed, ...), checked by the goal's rules;
- :mod:`.sessions`: ``session_id`` and ``continue_previous``, with the node's continuity machinery;
- :mod:`.policy`: one request in, one group submitted, one reply out;
- :mod:`.connections`: keys and their owner ids, the per-client connection cap, reclaiming idle slots;
- :mod:`.gate`: the request gate (concurrency and queue);
- :mod:`.server`: the websocket server (auth, limits, co-batching, shutdown);
- :mod:`.cli`: the ``serve-openpi`` command.

See docs/openpi.md.
"""

from .policy import OpenPIPolicy, build_model
from .schemas import SCHEMAS, ObservationSchema, get_schema
from .server import HEALTH_ROUTES, ROUTES, OpenPIServer, ServerLimits, ServerThread
from .wire import error_frame, pack, parse_error_frame, unpack

__all__ = [
    "HEALTH_ROUTES",
    "ROUTES",
    "SCHEMAS",
    "ObservationSchema",
    "OpenPIPolicy",
    "OpenPIServer",
    "ServerLimits",
    "ServerThread",
    "build_model",
    "error_frame",
    "get_schema",
    "pack",
    "parse_error_frame",
    "unpack",
]
