"""The OpenPI face of the service: ``trajectory-ensemble serve-openpi``, beside the node, never importing rclpy.

Its modules and the wire they share with ``remote/`` and ``fleet/`` are listed in docs/development.md; the face
itself is docs/openpi.md.
"""

from .policy import OpenPIPolicy
from .server import HEALTH_ROUTES, ROUTES, OpenPIServer, ServerLimits, ServerThread
