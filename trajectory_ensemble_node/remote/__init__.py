"""The node on a remote engine (``engine: openpi``): a client of the OpenPI wire, and the engine built on it.

ROS-free, like the engine layer: :class:`~.engine.RemoteEngine` is what the node's ``ModelHost`` holds instead of a
local model; :mod:`.client` speaks the wire (the server's own codec); :mod:`.groups` turns a group into request frames
and replies into its result. See docs/remote-engine.md.
"""

from .client import Connection, check_metadata, open_connection, samples_per_request
from .engine import RemoteEngine, RemoteHandle

__all__ = ["Connection", "RemoteEngine", "RemoteHandle", "check_metadata", "open_connection", "samples_per_request"]
