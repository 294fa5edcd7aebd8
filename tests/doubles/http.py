"""A tiny threaded HTTP server on loopback, the base of the API doubles."""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

Handler = Callable[["Request"], Any]
DROP = object()  # a handler's answer: close the connection without any response


class QuietServer(ThreadingHTTPServer):
    """A threaded loopback server that never writes to stderr.

    socketserver's ``handle_error`` prints a traceback to ``sys.stderr`` when a client
    goes away mid-answer (a dropped connection, a client's timeout against an injected
    delay). Its thread may do so while a later test runs the CLI in-process, whose
    stderr the test reads: the traceback then lands in that command's output. A client
    that went away is ordinary here; anything else is kept in ``errors``."""

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        super().__init__(address, handler)
        self.errors: list[BaseException] = []

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if error is not None and not isinstance(error, ConnectionError):
            self.errors.append(error)


class Request:
    def __init__(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> None:
        split = urlsplit(raw_path)
        self.method = method
        self.path = split.path
        self.query = dict(parse_qsl(split.query))
        self.headers = headers
        self.raw_body = body

    def json(self) -> Any:
        return json.loads(self.raw_body) if self.raw_body else None


class LoopbackServer:
    """Serves ``handle(request) -> (status, json body)`` on 127.0.0.1, in a thread."""

    def __init__(self, handle: Handler) -> None:
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                request = Request(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body
                )
                answer = outer.handle(request)
                if answer is DROP:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status, payload, *extra = answer
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                for name, value in (extra[0] if extra else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.handle = handle
        self._server = QuietServer(("127.0.0.1", 0), _Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def errors(self) -> list[BaseException]:
        """What went wrong in a handler other than a client going away."""
        return self._server.errors

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
