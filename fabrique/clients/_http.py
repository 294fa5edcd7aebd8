"""HTTP plumbing shared by the clients: timeouts and bounded retries with backoff.

A request is retried only when retrying can help: the connection failed or timed out,
or the server answered 429 or a 5xx gateway/unavailable status. Everything else is the
caller's to interpret. Request headers are never logged (they carry tokens).
"""

from __future__ import annotations

import functools
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, Self

import httpx

from fabrique.site.errors import RemoteError
from fabrique.site.retry import RetryPolicy

log = logging.getLogger("fabrique.http")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
DEFAULT_TIMEOUT = httpx.Timeout(10.0, connect=5.0)


class Unreachable(Exception):
    """Raised by ``send`` after the last attempt failed at the transport level."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"{url}: {reason}")


def send(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    retry: RetryPolicy,
    sleep: Callable[[float], None] = time.sleep,
    retry_statuses: frozenset[int] = RETRY_STATUSES,
    **kwargs: object,
) -> httpx.Response:
    """Send a request, retrying transport errors and retryable statuses.

    Returns the last response (which may still be a 5xx after the last attempt), or
    raises Unreachable when no attempt got an answer.
    """
    last_error = ""
    for attempt in range(1, retry.attempts + 1):
        try:
            response = client.request(method, url, **kwargs)  # type: ignore[arg-type]
        except httpx.TimeoutException:
            last_error = "timed out"
        except httpx.TransportError as exc:
            last_error = f"connection failed ({exc.__class__.__name__})"
        else:
            if response.status_code not in retry_statuses or attempt == retry.attempts:
                return response
            last_error = f"HTTP {response.status_code}"
        if attempt < retry.attempts:
            delay = retry.delay(attempt)
            log.warning(
                "%s %s: %s; retry %d/%d in %.1fs",
                method,
                url,
                last_error,
                attempt,
                retry.attempts - 1,
                delay,
            )
            sleep(delay)
    raise Unreachable(url, f"{last_error} after {retry.attempts} attempt(s)")


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """The TLS context every client of the process shares: httpx's default (the CA
    bundle, or SSL_CERT_FILE / SSL_CERT_DIR), loaded once rather than once per client
    (tens of ms each, three clients in a reconcile pass)."""
    return httpx.create_ssl_context()


class JsonApi:
    """Base of the HTTP clients: one httpx.Client, bounded retries, one error class.

    ``error`` is the RemoteError subclass raised for this system; ``system`` names it in
    messages ("Gitea at http://…"). Transport failures and 5xx after the last retry are
    raised as transient.
    """

    error: type[RemoteError] = RemoteError
    system = "server"

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        retry: RetryPolicy | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url
        self.retry = retry or RetryPolicy()
        self._client = httpx.Client(
            base_url=base_url,
            headers=headers,
            timeout=timeout,
            transport=transport,
            verify=_tls_context(),
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self, method: str, url: str, *, answered: frozenset[int] = frozenset(), **kwargs: Any
    ) -> httpx.Response:
        """Send with retries; raise ``error`` (transient) if no usable answer came.

        A status in ``answered`` goes back to the caller at once, retried or not by it."""
        retry_statuses = RETRY_STATUSES - answered
        try:
            response = send(
                self._client, method, url, retry=self.retry, retry_statuses=retry_statuses, **kwargs
            )
        except Unreachable as exc:
            raise self.error(f"{self.system} unreachable: {exc.reason}", transient=True) from None
        if response.status_code in retry_statuses:
            raise self.error(
                f"{self.system} answered HTTP {response.status_code} to {method} "
                f"{response.request.url.path} after {self.retry.attempts} attempt(s)",
                transient=True,
            )
        return response
