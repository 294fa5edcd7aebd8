"""A TCP proxy that delays every byte by a fixed time, both ways. Not a network.

It puts a round-trip time in front of a real server (the git daemon) as a cluster network
would: each chunk read from one side is written to the other ``rtt / 2`` seconds later.
Chunks are queued, not held back one by one, so throughput is not cut: a large pack costs
the round trips of the protocol, not one delay per chunk.
"""

from __future__ import annotations

import queue
import socket
import threading
import time

from ..servers import free_port


class DelayProxy:
    def __init__(self, upstream_port: int, rtt: float) -> None:
        self.upstream_port = upstream_port
        self.delay = rtt / 2
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._stopped = threading.Event()

    def start(self) -> DelayProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        # shutdown wakes the thread blocked in accept(); close alone may not, and the
        # socket's number would then be reused under it
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for source, sink in ((client, upstream), (upstream, client)):
                pending: queue.Queue[tuple[float, bytes]] = queue.Queue()
                threading.Thread(target=self._read, args=(source, pending), daemon=True).start()
                threading.Thread(target=self._write, args=(sink, pending), daemon=True).start()

    def _read(self, source: socket.socket, pending: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            try:
                data = source.recv(1 << 16)
            except OSError:
                data = b""
            pending.put((time.monotonic() + self.delay, data))
            if not data:
                return

    def _write(self, sink: socket.socket, pending: queue.Queue[tuple[float, bytes]]) -> None:
        while True:
            due, data = pending.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return
