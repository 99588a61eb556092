"""The node's served model on a remote OpenPI server (``engine: openpi``): a client of the wire, and the model on it.

ROS-free, like the engine layer: :class:`~.model.RemoteModel` is the ``serving.request_path.ServedModel`` the node's
``ModelHost`` holds instead of a local one; :mod:`.client` speaks the wire (the neutral codec); :mod:`.groups` turns a
group into request frames and replies into its result, with the engine's own completion. See docs/remote-engine.md.
"""

from .client import Connection, check_metadata, open_connection, samples_per_request
from .model import RemoteHandle, RemoteModel

__all__ = ["Connection", "RemoteHandle", "RemoteModel", "check_metadata", "open_connection", "samples_per_request"]
