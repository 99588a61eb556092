"""Sessions: the closed loop over the wire, with the node's own continuity machinery.

Each session has one :class:`~trajectory_ensemble_node.serving.continuity.ChunkMemory`, decided exactly as a goal's;
sessions are kept least recently used first, at most :data:`MAX_SESSIONS` and :data:`MAX_SESSIONS_PER_OWNER` per
owner, and a :class:`SessionKey` confines a name to its owner (docs/openpi.md; docs/security.md, "Sessions belong to
their owner").
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import GoalRequestError
from ..quoting import quote_value
from ..serving.continuity import ChunkMemory

MAX_SESSIONS = 1024
"""Sessions remembered at once; the least recently used one is forgotten first."""
MAX_SESSIONS_PER_OWNER = 256
"""Sessions one owner may hold; past it, that owner's least recently used one is forgotten, nobody else's."""


class SessionKey(NamedTuple):
    """Where a session lives.

    Args:
        owner (`str`): Who owns it: ``key-<id>`` (an HMAC of the connection's key, never the key) or
            ``connection-<n>`` when the server has no key.
        connection (`int`, *optional*): The connection it is private to; ``None`` for a session shared by every
            connection of the owner (``session_scope: "key"``).
        name (`str`, *optional*): The request's ``session_id``; ``None`` for the connection's own session.
    """

    owner: str
    connection: int | None
    name: str | None


@dataclass(frozen=True)
class Caller:
    """Who sent a request: what its sessions are keyed by.

    Args:
        owner (`str`): ``key-<id>`` (the key's owner id) or ``connection-<n>`` (no key: the connection owns).
        connection (`int`): The connection's number.
        keyed (`bool`): Whether the owner is a key (only then can a session be shared across connections).
    """

    owner: str
    connection: int
    keyed: bool = False

    @classmethod
    def anonymous(cls, connection: int) -> Caller:
        """A connection to a server without a key: it owns its sessions alone."""
        return cls(f"connection-{connection}", connection, keyed=False)


def session_key(caller: Caller, session_id: str | None, scope: str) -> SessionKey:
    """The session a request names, in its caller's namespace.

    Args:
        caller (`Caller`): Who asks.
        session_id (`str`, *optional*): The request's ``session_id``; ``None`` = the connection's own session.
        scope (`str`): ``"connection"`` (private to the connection) or ``"key"`` (shared by the key's connections).

    Raises:
        GoalRequestError: ``"key"`` scope without a ``session_id``, or on a server without a key.
    """
    if scope != "key":
        return SessionKey(caller.owner, caller.connection, session_id)
    if session_id is None:
        raise GoalRequestError("session_scope 'key' needs a session_id: a connection's own session is never shared")
    if not caller.keyed:
        raise GoalRequestError(f"session_scope 'key' needs a server key (--api-key): without one every client is "
                               f"anonymous, so session {quote_value(session_id)} can only be private to this "
                               "connection")
    return SessionKey(caller.owner, None, session_id)


class SessionStore:
    """One :class:`ChunkMemory` per :class:`SessionKey`, least recently used out. Thread-safe.

    Args:
        max_sessions (`int`): Most sessions kept.
        max_per_owner (`int`): Most sessions one owner keeps.
    """

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_per_owner: int = MAX_SESSIONS_PER_OWNER) -> None:
        self.max_sessions, self.max_per_owner = int(max_sessions), int(max_per_owner)
        self._lock = threading.Lock()
        self._memories: collections.OrderedDict[SessionKey, ChunkMemory] = collections.OrderedDict()
        self._owned: collections.Counter[str] = collections.Counter()

    def __len__(self) -> int:
        with self._lock:
            return len(self._memories)

    def memory(self, key: SessionKey) -> ChunkMemory:
        """The session's memory (a new, empty one the first time)."""
        with self._lock:
            memory = self._memories.get(key)
            if memory is None:
                memory = self._memories[key] = ChunkMemory()
                self._owned[key.owner] += 1
                if self._owned[key.owner] > self.max_per_owner:
                    self._drop(next(k for k in self._memories if k.owner == key.owner))
                while len(self._memories) > self.max_sessions:
                    self._drop(next(iter(self._memories)))
            self._memories.move_to_end(key)
            return memory

    def _drop(self, key: SessionKey) -> None:
        del self._memories[key]
        self._owned[key.owner] -= 1
        if not self._owned[key.owner]:
            del self._owned[key.owner]

    def reset(self, key: SessionKey) -> bool:
        """Forget the session's chunk; True when it had one (False for a session never used, or not this owner's)."""
        with self._lock:
            memory = self._memories.get(key)
        return memory.drop() if memory is not None else False

    def forget_connection(self, owner: str, connection: int) -> None:
        """Drop every session private to a connection (when it closes); its owner's shared sessions stay."""
        with self._lock:
            for key in [k for k in self._memories if k.owner == owner and k.connection == connection]:
                self._drop(key)
