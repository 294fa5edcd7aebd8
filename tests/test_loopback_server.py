"""The doubles' loopback server: a client that goes away is no output of the test."""

from __future__ import annotations

import socket
import time

import pytest

from .doubles.http import LoopbackServer, Request


def test_a_client_gone_mid_answer_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    """socketserver prints a traceback to stderr when the answer meets a closed
    connection; a test running the CLI in-process meanwhile would read it as the
    command's own stderr."""

    def slow(request: Request) -> tuple[int, object]:
        time.sleep(0.3)
        return 200, {"padding": "x" * 4_000_000}

    server = LoopbackServer(slow).start()
    try:
        host, port = server.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as client:
            client.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(1.0)  # the answer is written to the closed connection meanwhile
    finally:
        server.stop()
    assert capfd.readouterr().err == ""
    assert server.errors == []
