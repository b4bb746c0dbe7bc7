"""Object stores that misbehave, on loopback: a server that takes requests and never
answers, and a proxy to a real (moto) S3 server that stalls after a number of uploads. The
tests of store faults and of signals during store calls share them."""

from __future__ import annotations

import re
import socket
import threading

HOLD_SECONDS = 300.0  # how long a stalled connection is held open at most (the tests end sooner)


class LoopbackServer:
    """A TCP server on 127.0.0.1 (``port``) that hands each connection to :meth:`serve` on a
    thread of its own; :meth:`close` ends it and every connection it holds."""

    def __init__(self) -> None:
        self.closed = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.sockets.append(client)
            self.serve(client)

    def serve(self, client: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.closed.set()
        for each in [self.server, *self.sockets]:
            each.close()


class SilentServer(LoopbackServer):
    """Accepts connections and reads requests but never answers (a store behind a dead
    network path); ``requested`` is set once a request came."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        super().__init__()

    def serve(self, client: socket.socket) -> None:
        threading.Thread(target=self._read, args=(client,), daemon=True).start()

    def _read(self, client: socket.socket) -> None:
        try:
            while client.recv(1 << 16):
                self.requested.set()
        except OSError:
            pass


class StallingProxy(LoopbackServer):
    """A proxy to the S3 server at ``upstream`` that passes ``allowed`` upload requests for
    a ``.parquet`` key (a multipart upload is three: start, part, complete) and then stalls:
    from the next one on it reads and answers nothing, on any connection (a store that hangs
    mid-run). Its threads end when it is closed."""

    UPLOAD = re.compile(rb"(PUT|POST) /[^ ?]*\.parquet")

    def __init__(self, upstream: tuple[str, int], allowed: int) -> None:
        self.upstream, self.allowed = upstream, allowed
        self.stalled = threading.Event()
        super().__init__()

    def serve(self, client: socket.socket) -> None:
        if self.stalled.is_set():
            return  # accepted, never answered
        server = socket.create_connection(self.upstream)
        self.sockets.append(server)
        threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        try:
            while not self.stalled.is_set() and (data := source.recv(1 << 16)):
                if requests:
                    self.allowed -= len(self.UPLOAD.findall(data))
                    if self.allowed < 0:
                        self.stalled.set()
                        break
                sink.sendall(data)
        except OSError:
            pass
        self.closed.wait(HOLD_SECONDS)  # stalled: hold the connection open, silent
