"""Who a connection is, and whether there is room for it: keys, owners, per-client caps and reclaiming idle slots.

:class:`KeyRing` turns a key into an owner id (an HMAC under a start-up secret; a key is never stored or logged) and
:class:`ConnectionTable` decides whether a connection may open, reclaiming one that never sent a request before any
handshake is refused: docs/security.md, "Keys and owners" and "Connection fairness". Used from the event loop only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CapacityError
from .sessions import Caller

ANONYMOUS = "anonymous"
"""The owner part of a client's identity on a server without a key."""


class KeyRing:
    """The server's keys and their owner ids.

    Args:
        keys (`Sequence[str]`): The keys a connection may carry (empty: no key required).
    """

    def __init__(self, keys: Sequence[str]) -> None:
        self._keys = tuple(k.encode() for k in keys if k)
        secret = os.urandom(32)
        self._owners = tuple("key-" + hmac.new(secret, k, hashlib.sha256).hexdigest()[:16] for k in self._keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, header: str | None) -> str | None:
        """The owner id of the key an ``Authorization`` header carries (``Api-Key <key>`` or ``Bearer <key>``).

        Every key is compared (``hmac.compare_digest``), whichever matches, so the time taken says nothing about
        which key, or how much of one, the header holds.

        Returns:
            `str | None`: ``key-<id>``, or ``None`` for a missing or wrong key.
        """
        scheme, _, token = (header or "").strip().partition(" ")
        token_bytes = token.strip().encode()
        owner = None
        for key, key_owner in zip(self._keys, self._owners):
            if hmac.compare_digest(token_bytes, key) and owner is None:
                owner = key_owner
        return owner if scheme.lower() in ("api-key", "bearer") else None


@dataclass
class ConnectionState:
    """One accepted connection, from its handshake to its close.

    Args:
        connection (`Any`): The websockets connection (closed to reclaim its slot).
        owner (`str`): ``key-<id>``, or ``None`` -> the connection's own id once numbered.
        peer (`str`): The peer's address.
        opened (`float`): ``time.monotonic()`` at the handshake.
    """

    connection: Any
    owner: str | None
    peer: str
    opened: float = field(default_factory=time.monotonic)
    number: int = 0
    requests: int = 0
    started: bool = False
    reclaimed: bool = False

    @property
    def client(self) -> tuple[str, str]:
        """Who the per-client cap counts: the owner (or anonymous) and the peer's address."""
        return (self.owner or ANONYMOUS, self.peer)

    def caller(self) -> Caller:
        """Whom this connection's sessions belong to."""
        if self.owner is None:
            return Caller.anonymous(self.number)
        return Caller(self.owner, self.number, keyed=True)


@dataclass
class Reclaim:
    """A connection to close to make room, and the close reason (at most 123 bytes, as websockets requires)."""

    state: ConnectionState
    reason: str


class ConnectionTable:
    """The open connections and the rules of who may open another.

    Args:
        max_connections (`int`): ``openpi_max_connections``.
        max_per_client (`int`): ``openpi_max_connections_per_client`` (0 = no per-client cap).
        handshake_idle_s (`float`): ``openpi_handshake_idle_s``: how long a connection without a request holds its
            slot against others once the server is full.
    """

    def __init__(self, max_connections: int, max_per_client: int, handshake_idle_s: float) -> None:
        self.max_connections, self.max_per_client = int(max_connections), int(max_per_client)
        self.handshake_idle_s = float(handshake_idle_s)
        self._states: dict[Any, ConnectionState] = {}

    def __len__(self) -> int:
        return len(self._live())

    def get(self, connection: Any) -> ConnectionState | None:
        return self._states.get(connection)

    def _live(self) -> list[ConnectionState]:
        return [s for s in self._states.values() if not s.reclaimed]

    def admit(self, connection: Any, owner: str | None, peer: str, *, is_closed: Any) -> list[Reclaim]:
        """Register a handshake, or refuse it; the connections to close to make room come back.

        Args:
            connection (`Any`): The new connection.
            owner (`str`, *optional*): Its key's owner id (``None`` on a server without a key).
            peer (`str`): Its peer's address.
            is_closed (`Callable[[Any], bool]`): Whether a registered connection is already gone (a handshake that
                failed after it was admitted never reaches the handler that would unregister it).

        Raises:
            CapacityError: no room, and nothing that may be reclaimed; the message names the limit.
        """
        for stale in [c for c, s in self._states.items() if not s.started and is_closed(c)]:
            del self._states[stale]
        state = ConnectionState(connection, owner, peer)
        reclaims: list[Reclaim] = []
        mine = [s for s in self._live() if s.client == state.client]
        if self.max_per_client and len(mine) >= self.max_per_client:
            # Its own connection: no grace period, the client is the one asking for one more.
            victim = self._oldest_unused(mine, min_age_s=0.0)
            if victim is None:
                raise CapacityError(f"this client ({self._describe(state)}) already has {len(mine)} connections that "
                                    f"have each sent a request (openpi_max_connections_per_client="
                                    f"{self.max_per_client}); close one or retry later")
            reclaims.append(self._reclaim(victim, f"reclaimed: no request yet, and this client opened more than "
                                                  f"openpi_max_connections_per_client={self.max_per_client}"))
        live = self._live()
        if len(live) >= self.max_connections:
            victim = self._oldest_unused(live, min_age_s=self.handshake_idle_s)
            if victim is None:
                raise CapacityError(f"{len(live)} connections already open (openpi_max_connections="
                                    f"{self.max_connections}) and none has waited "
                                    f"{self.handshake_idle_s:g} s without a request "
                                    f"(openpi_handshake_idle_s); retry later")
            reclaims.append(self._reclaim(victim, f"reclaimed: no request within {self.handshake_idle_s:g} s and "
                                                  f"the server is full (openpi_max_connections)"))
        self._states[connection] = state
        return reclaims

    def start(self, connection: Any, number: int) -> ConnectionState:
        """The handler has started: number the connection (it may be reclaimed from now on)."""
        state = self._states.get(connection)
        if state is None:  # not admitted through the handshake hook (cannot happen with the server's hook)
            state = self._states[connection] = ConnectionState(connection, None, "?")
        state.number, state.started = number, True
        return state

    def close(self, connection: Any) -> None:
        """The connection's handler ended."""
        self._states.pop(connection, None)

    @staticmethod
    def _describe(state: ConnectionState) -> str:
        owner = "no key" if state.owner is None else f"key {state.owner}"
        return f"peer {state.peer}, {owner}"

    @staticmethod
    def _oldest_unused(states: list[ConnectionState], *, min_age_s: float) -> ConnectionState | None:
        now = time.monotonic()
        unused = [s for s in states if s.started and not s.requests and now - s.opened >= min_age_s]
        return min(unused, key=lambda s: s.opened, default=None)

    @staticmethod
    def _reclaim(state: ConnectionState, reason: str) -> Reclaim:
        state.reclaimed = True
        return Reclaim(state, reason.encode()[:123].decode(errors="ignore"))
