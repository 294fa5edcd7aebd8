"""OCI registry client (distribution API v2): what fabrique needs to read digests.

Only reads. The digest of a tag is what the registry says in ``Docker-Content-Digest`` on
a ``HEAD /v2/<name>/manifests/<reference>``, asked with every manifest and index media
type so that the registry never converts the manifest (which would change its digest).
If a registry leaves the header out, the manifest is fetched and hashed.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

from fabrique.site.config import Site
from fabrique.site.errors import ImageNotFound, RegistryError
from fabrique.site.names import DIGEST_RE
from fabrique.site.retry import RetryPolicy

from ._http import DEFAULT_TIMEOUT, JsonApi, Unreachable, send

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST)
INDEX_TYPES = frozenset({OCI_INDEX, DOCKER_MANIFEST_LIST})


@dataclass(frozen=True)
class ManifestDigest:
    """What the registry holds under a reference."""

    reference: str  # host/name:tag as asked
    digest: str
    media_type: str

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES


@dataclass(frozen=True)
class Manifest:
    """A manifest or index as the registry holds it: its digest, type and parsed body."""

    reference: str  # host/name@digest or host/name:tag as asked
    digest: str  # sha256 of the body as served
    media_type: str
    data: dict[str, Any]

    @property
    def is_index(self) -> bool:
        return self.media_type in INDEX_TYPES or self.data.get("mediaType") in INDEX_TYPES


MAX_MANIFEST = 4 * 1024 * 1024  # the limit Distribution itself puts on a manifest
MAX_BLOB = 16 * 1024 * 1024  # configs, provenance and signature payloads are small


class RegistryClient(JsonApi):
    """A client for one registry host, over HTTPS or, when the site says so, plain HTTP."""

    error = RegistryError

    def __init__(
        self,
        host: str,
        *,
        plain_http: bool,
        retry: RetryPolicy | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.host = host
        self.system = f"registry {host}"
        self._bearer: str | None = None
        scheme = "http" if plain_http else "https"
        super().__init__(f"{scheme}://{host}", retry=retry, timeout=timeout, transport=transport)

    @classmethod
    def for_site(cls, site: Site) -> RegistryClient:
        """The site's registry, plain HTTP or not as the site says."""
        return cls(
            site.registry.host,
            plain_http=site.registry.plain_http,
            retry=site.network.retry_policy(),
            timeout=site.network.http_timeout(),
        )

    def manifest_digest(self, repository: str, reference: str) -> ManifestDigest:
        """The digest of ``repository:reference``; ImageNotFound if the registry lacks it."""
        separator = "@" if reference.startswith("sha256:") else ":"
        shown = f"{self.host}/{repository}{separator}{reference}"
        url = f"/v2/{repository}/manifests/{reference}"
        headers = {"Accept": ", ".join(MANIFEST_TYPES)}
        response = self._get(shown, "HEAD", url, headers)
        if "Docker-Content-Digest" not in response.headers:
            response = self._get(shown, "GET", url, headers)
            digest = "sha256:" + hashlib.sha256(response.content).hexdigest()
        else:
            digest = response.headers["Docker-Content-Digest"]
        if not DIGEST_RE.fullmatch(digest):
            raise RegistryError(
                f"{shown}: registry answered a malformed digest {digest[:80]!r} "
                "(expected sha256:<64 hex>)"
            )
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        return ManifestDigest(shown, digest, media_type)

    def manifest(self, repository: str, reference: str) -> Manifest:
        """The manifest or index under ``reference``, read whole and checked.

        Asked by digest, the body must hash to that digest: a registry (or anything in
        between) cannot substitute another document under a digest."""
        by_digest = reference.startswith("sha256:")
        shown = f"{self.host}/{repository}{'@' if by_digest else ':'}{reference}"
        response = self._get(
            shown,
            "GET",
            f"/v2/{repository}/manifests/{reference}",
            {"Accept": ", ".join(MANIFEST_TYPES)},
        )
        body = response.content
        if len(body) > MAX_MANIFEST:
            raise RegistryError(f"{shown}: manifest larger than {MAX_MANIFEST} bytes")
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        if by_digest and digest != reference:
            raise RegistryError(f"{shown}: the registry served a manifest whose digest is {digest}")
        try:
            data = json.loads(body)
        except ValueError:
            raise RegistryError(f"{shown}: the manifest is not JSON") from None
        if not isinstance(data, dict):
            raise RegistryError(f"{shown}: the manifest is not a JSON object")
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        return Manifest(shown, digest, media_type, data)

    def blob(self, repository: str, digest: str, *, limit: int = MAX_BLOB) -> bytes:
        """The blob ``digest`` of ``repository``, checked against its digest."""
        shown = f"{self.host}/{repository}@{digest}"
        if not DIGEST_RE.fullmatch(digest):
            raise RegistryError(f"{shown}: not a sha256 digest")
        # Distribution redirects a blob GET when its storage is elsewhere (S3 and the like)
        response = self._get(
            shown, "GET", f"/v2/{repository}/blobs/{digest}", {}, follow_redirects=True
        )
        body = response.content
        if len(body) > limit:
            raise RegistryError(f"{shown}: blob larger than {limit} bytes")
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise RegistryError(f"{shown}: the registry served a blob of another digest")
        return body

    def _get(
        self, shown: str, method: str, url: str, headers: dict[str, str], **kwargs: Any
    ) -> httpx.Response:
        response = self._send(method, url, headers, **kwargs)
        challenge = response.headers.get("WWW-Authenticate", "")
        if response.status_code == 401 and challenge.lower().startswith("bearer "):
            # public registries: an anonymous token for this repository, then once more
            self._bearer = self._anonymous_token(shown, challenge)
            response = self._send(method, url, headers, **kwargs)
        if response.status_code == 200:
            return response
        if response.status_code == 404:
            raise ImageNotFound(
                f"{shown}: not found in the registry (was the image pushed under this tag?)"
            )
        if response.status_code in (401, 403):
            raise RegistryError(
                f"{shown}: registry refused access (HTTP {response.status_code}); "
                "check the registry credentials"
            )
        raise RegistryError(f"{shown}: registry answered HTTP {response.status_code}")

    def _send(
        self, method: str, url: str, headers: dict[str, str], **kwargs: Any
    ) -> httpx.Response:
        if self._bearer:
            headers = headers | {"Authorization": f"Bearer {self._bearer}"}
        try:
            return self.request(method, url, headers=headers, **kwargs)
        except RegistryError as exc:
            if exc.transient:
                raise RegistryError(
                    f"{exc}; check the registry address and that it is up", transient=True
                ) from None
            raise

    def _anonymous_token(self, shown: str, challenge: str) -> str:
        """The Docker registry token flow: GET <realm>?service=…&scope=… → {"token": …}."""
        fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        realm = fields.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise RegistryError(f"{shown}: registry asked for a token without a usable realm")
        try:
            response = send(self._client, "GET", realm, retry=self.retry, params=fields)
        except Unreachable as exc:
            raise RegistryError(
                f"{shown}: token service unreachable: {exc.reason}", transient=True
            ) from None
        if response.status_code != 200:
            raise RegistryError(f"{shown}: token service answered HTTP {response.status_code}")
        try:
            data = response.json()
        except ValueError:
            raise RegistryError(
                f"{shown}: token service answered something that is not JSON"
            ) from None
        token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            raise RegistryError(f"{shown}: token service answered without a token")
        return token
