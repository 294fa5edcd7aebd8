"""HTTP proxies in front of real servers.

``FaultProxy`` forwards every request to ``upstream`` unchanged, except those for which
``fault`` returns an answer: a status (empty body), or (status, headers, body). Tests use
it to take the real registry "down" for one repository only, or to put the anonymous
bearer-token challenge of public registries in front of it (``token_gate``).

``SpecProxy`` forwards to a real Gitea and checks each request and answer against Gitea's
swagger, as the Gitea double checks its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote

import httpx

from .http import LoopbackServer, QuietServer, Request
from .swagger import SpecViolation, Swagger

Answer = int | tuple[int, dict[str, str], bytes]

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
}


class FaultProxy:
    def __init__(
        self, upstream: str, fault: Callable[[str, str, dict[str, str]], Answer | None]
    ) -> None:
        client = httpx.Client(base_url=upstream, timeout=10)
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _serve(self) -> None:
                answer = fault(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}
                )
                if answer is not None:
                    outer.faulted += 1
                    status, extra, payload = (
                        answer if isinstance(answer, tuple) else (answer, {}, b"")
                    )
                    self.send_response(status)
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"host"}
                }
                answer = client.request(self.command, self.path, content=body, headers=headers)
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in HOP_BY_HOP:
                        self.send_header(name, value)
                data = b"" if self.command == "HEAD" else answer.content
                self.send_header(
                    "Content-Length",
                    str(
                        len(data)
                        if self.command != "HEAD"
                        else answer.headers.get("content-length", 0)
                    ),
                )
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.faulted = 0
        self._client = client
        self._server = QuietServer(("127.0.0.1", 0), _Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def host(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()


def token_gate(
    token: str, service: str = "registry.test"
) -> tuple[Callable[[str, str, dict[str, str]], Answer | None], list[str]]:
    """A fault function playing a public registry's auth: no bearer token, a 401 challenge;
    ``GET /token?service=…&scope=…`` hands out ``token`` anonymously. Returns the function
    and the list of scopes asked for."""
    import json
    from urllib.parse import parse_qs, urlsplit

    scopes: list[str] = []

    def gate(method: str, path: str, headers: dict[str, str]) -> Answer | None:
        split = urlsplit(path)
        if split.path == "/token":
            query = parse_qs(split.query)
            assert query.get("service") == [service], query
            scopes.extend(query.get("scope", []))
            return 200, {"Content-Type": "application/json"}, json.dumps({"token": token}).encode()
        if headers.get("authorization") == f"Bearer {token}":
            return None
        repository = split.path.removeprefix("/v2/").split("/manifests/")[0]
        realm = f"http://{headers.get('host')}/token"
        challenge = (
            f'Bearer realm="{realm}",service="{service}",scope="repository:{repository}:pull"'
        )
        return 401, {"WWW-Authenticate": challenge}, b'{"errors":[{"code":"UNAUTHORIZED"}]}'

    return gate, scopes


class SpecProxy:
    """A proxy in front of a real Gitea that holds its traffic to Gitea's swagger, as the
    double holds its own: every request under the API's base path must be an operation
    the spec declares, and every answer valid against it (``Swagger.check_answer``). A
    violation is recorded in ``violations``; the answer is passed on, its JSON and its
    paging headers."""

    def __init__(self, upstream: str, swagger: Swagger) -> None:
        self.swagger = swagger
        self.violations: list[str] = []
        self.requests: list[str] = []  # "METHOD path" of each request passed on
        self._client = httpx.Client(base_url=upstream, timeout=60)
        self._server = LoopbackServer(self._forward)

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> SpecProxy:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
        self._client.close()

    def _forward(self, request: Request) -> tuple[int, Any, dict[str, str]]:
        headers = {
            k: v
            for k, v in request.headers.items()
            if k in ("authorization", "accept", "content-type")
        }
        self.requests.append(f"{request.method} {request.path}")
        answer = self._client.request(
            request.method,
            request.path,
            params=request.query,
            content=request.raw_body or None,
            headers=headers,
        )
        try:
            body = answer.json() if answer.content else None
        except ValueError:  # a panic's stack trace, say: passed on as an empty answer
            self.violations.append(
                f"{request.method} {request.path}: HTTP {answer.status_code}, not JSON: "
                + answer.text[:200]
            )
            return answer.status_code, None, {}
        path = unquote(request.path).removeprefix(self.swagger.base_path)
        if request.path.startswith(self.swagger.base_path + "/"):
            try:
                self.swagger.check_request(request.method, path, request.query, request.json())
                self.swagger.check_answer(request.method, path, answer.status_code, body)
            except SpecViolation as violation:
                self.violations.append(str(violation))
        kept = {
            k: v
            for k, v in answer.headers.items()
            if k.lower().startswith("x-") or k.lower() == "link"
        }
        return answer.status_code, body, kept
