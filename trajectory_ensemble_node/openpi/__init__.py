"""The OpenPI face of the service: ``trajectory-ensemble serve-openpi``, beside the node, never importing rclpy.

openpi-client's ``WebsocketClientPolicy``, vLLM-Omni's clients, RoboLab and strands talk to the same engine the node
serves, over OpenPI's msgpack websocket wire, and requests from different connections share engine batches. The
wire's codec and observation schemas live in the neutral :mod:`trajectory_ensemble_node.wire`, which ``remote/`` and
``fleet/`` share.

- :mod:`.extras`: the per-request extras (count, reducer, seed, ...), checked by the goal's rules;
- :mod:`.sessions`: ``session_id`` and ``continue_previous``, with the node's continuity machinery;
- :mod:`.policy`: one request in, one group submitted, one reply out;
- :mod:`.connections`: keys and their owner ids, the per-client connection cap, reclaiming idle slots;
- :mod:`.gate`: the request gate (concurrency and queue);
- :mod:`.server`: the websocket server (handshake, auth, connections, limits, shutdown);
- :mod:`.dispatch`: one request from its frame to its reply (decoding, co-batching, disconnect);
- :mod:`.cli`: the ``serve-openpi`` command.

See docs/openpi.md.
"""

from .policy import OpenPIPolicy
from .server import HEALTH_ROUTES, ROUTES, OpenPIServer, ServerLimits, ServerThread
