"""A websocket server written for the remote-engine tests: ``serve-openpi``'s handshake and metadata, then whatever
the test makes it do with each request (freeze, send a 100 MB frame, trickle bytes, lie about shapes, ...).

It speaks the websocket protocol through the library's own sans-I/O :class:`websockets.server.ServerProtocol` over
plain threads and sockets, so a behaviour can do what no well-behaved server does: stop reading (a frozen process
never answers a close handshake), or write a frame header and then one byte at a time.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
from websockets.frames import Opcode
from websockets.server import ServerProtocol

from trajectory_ensemble_node.wire import codec
from trajectory_ensemble_node.seeding import candidate_seeds


class FakeConnection:
    """One accepted connection after its handshake and metadata: read requests, write anything."""

    def __init__(self, sock: socket.socket, protocol: ServerProtocol, stop: threading.Event) -> None:
        self.sock, self.protocol, self.stop = sock, protocol, stop

    def _flush(self) -> None:
        self.sock.sendall(b"".join(self.protocol.data_to_send()))

    def next_request(self) -> dict[str, Any] | None:
        """The next request, decoded; ``None`` once the client has gone."""
        while True:
            for event in self.protocol.events_received():
                if getattr(event, "opcode", None) == Opcode.BINARY:
                    return codec.unpack(event.data)
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                return None
            if not data:
                return None
            self.protocol.receive_data(data)
            self._flush()  # pongs, close frames

    def send_binary(self, payload: bytes) -> None:
        self.protocol.send_binary(payload)
        self._flush()

    def send_text(self, text: str) -> None:
        self.protocol.send_text(text.encode())
        self._flush()

    def send_raw(self, data: bytes) -> bool:
        """Bytes as they are (a frame header, part of a payload); False once the client is gone."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False


Behaviour = Callable[[FakeConnection], None]


def good_reply(request: dict[str, Any], shape: tuple[int, int], **overrides: Any) -> bytes:
    """A reply a well-behaved server could send for ``request``: its seeds, a zero action of ``shape``."""
    count = int(request.get("num_candidates", 1) or 1)
    reply: dict[str, Any] = {"actions": np.zeros(shape, np.float32),
                             "seeds": list(candidate_seeds(int(request["seed"]), count))}
    if request.get("return_candidates"):
        reply["candidates"] = np.zeros((count, *shape), np.float32)
        reply["valid"] = np.ones(count, bool)
    reply.update(overrides)
    return codec.pack(reply)


class FakeServer:
    """Listens on a free loopback port; each connection gets the metadata, then ``behaviour`` (settable).

    Args:
        metadata (`dict[str, Any]`): What ``serve-openpi`` would send first (the toy policy's).
        behaviour (`Behaviour`): What to do with each connection once its metadata is sent.
    """

    def __init__(self, metadata: dict[str, Any], behaviour: Behaviour, port: int = 0) -> None:
        self.metadata, self.behaviour = codec.pack(metadata), behaviour
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.requests = 0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        protocol = ServerProtocol(max_size=None)
        try:
            while True:
                data = sock.recv(1 << 16)
                if not data:
                    return
                protocol.receive_data(data)
                events = protocol.events_received()
                if events:
                    break
            protocol.send_response(protocol.accept(events[0]))
            protocol.send_binary(self.metadata)
            sock.sendall(b"".join(protocol.data_to_send()))
            self.behaviour(FakeConnection(sock, protocol, self.stop))
        except OSError:
            pass  # the client aborted: what the tests expect of it

    def count_request(self) -> None:
        with self._lock:
            self.requests += 1

    def close(self) -> None:
        """Stop listening and drop every connection (a frozen behaviour wakes on ``stop``)."""
        self.stop.set()
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() in flight, which holds the socket open
        except OSError:
            pass
        self.listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
