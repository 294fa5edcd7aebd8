"""What an image in the registry proves about where it comes from.

A tag proves nothing: any build step can push to the registry. What the image itself
carries can be checked against the build it must come from:

- **labels** (always): the build sets ``org.opencontainers.image.revision`` and
  ``org.opencontainers.image.source`` in every image config; each image of the digest
  (each platform of an index) must name the revision and the code repository. Anyone who
  can push can forge them: they catch a wrong or hand-pushed image, not an attacker.
- **attestations** (``build.attestations: true``): BuildKit pushes an index whose
  attestation manifests (``vnd.docker.reference.type: attestation-manifest``) carry an
  in-toto provenance statement for each image; it must be about that image and name the
  revision and the repository (and an SPDX SBOM must be there with ``build.sbom``).
- **signature** (``signing``, see ``signature``): only the holder of the key can make it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fabrique.clients.registry import Manifest, RegistryClient
from fabrique.site.config import AppConfig, Site
from fabrique.site.errors import ProvenanceError

REVISION_LABEL = "org.opencontainers.image.revision"
SOURCE_LABEL = "org.opencontainers.image.source"
REFERENCE_TYPE = "vnd.docker.reference.type"
REFERENCE_DIGEST = "vnd.docker.reference.digest"
ATTESTATION_MANIFEST = "attestation-manifest"
IN_TOTO_LAYER = "application/vnd.in-toto+json"
PREDICATE_TYPE = "in-toto.io/predicate-type"
SLSA_PROVENANCE = ("https://slsa.dev/provenance/v0.2", "https://slsa.dev/provenance/v1")
SPDX = "https://spdx.dev/Document"
BUILDKIT_METADATA = "https://mobyproject.org/buildkit@v1#metadata"


@dataclass(frozen=True)
class Expected:
    """The build an image must come from."""

    image: str  # the registry repository
    digest: str  # what is about to be deployed: a manifest or an index
    revision: str
    source: str  # the code repository's URL, as the build labels it

    @property
    def reference(self) -> str:
        return f"{self.image}@{self.digest}"


def expected(site: Site, app: AppConfig, revision: str, digest: str) -> Expected:
    return Expected(app.image, digest, revision, site.gitea.repo_url(site.gitea.code_repo))


def check_built_here(
    site: Site, registry: RegistryClient, app: AppConfig, revision: str, digest: str
) -> None:
    """ProvenanceError unless the image under ``digest`` says this factory built it from
    ``revision``: its labels, and with attestations its provenance (and SBOM). What a
    gesture that writes a digest it did not build checks first (seed, rollback, promote)."""
    want = expected(site, app, revision, digest)
    check_labels(registry, want)
    if site.build.attestations:
        check_attestations(registry, want, sbom=site.build.sbom)


def images(registry: RegistryClient, want: Expected) -> tuple[Manifest, list[Manifest]]:
    """The manifest under the digest, and the image manifests it stands for (itself, or
    each platform of an index; attestation manifests are not images)."""
    top = registry.manifest(want.image, want.digest)
    if not top.is_index:
        return top, [top]
    platforms = [
        entry
        for entry in _entries(top)
        if (entry.get("annotations") or {}).get(REFERENCE_TYPE) != ATTESTATION_MANIFEST
    ]
    if not platforms:
        raise ProvenanceError(f"{top.reference}: the index holds no image")
    return top, [registry.manifest(want.image, _digest_of(entry, top)) for entry in platforms]


def check_labels(registry: RegistryClient, want: Expected) -> None:
    """Every image of the digest labels the revision and the repository it was built from."""
    _, found = images(registry, want)
    for manifest in found:
        config = (manifest.data.get("config") or {}).get("digest")
        if not isinstance(config, str):
            raise ProvenanceError(f"{manifest.reference}: the manifest names no config")
        try:
            labels = json.loads(registry.blob(want.image, config)).get("config", {}).get("Labels")
        except (ValueError, AttributeError):
            raise ProvenanceError(
                f"{manifest.reference}: its config is not an image config"
            ) from None
        labels = labels if isinstance(labels, dict) else {}
        for label, value in ((REVISION_LABEL, want.revision), (SOURCE_LABEL, want.source)):
            if labels.get(label) != value:
                raise ProvenanceError(
                    f"{manifest.reference}: label {label} is {labels.get(label)!r}, not "
                    f"{value!r}: this image was not built from that commit by fabrique"
                )


def check_attestations(registry: RegistryClient, want: Expected, *, sbom: bool) -> None:
    """The index under the digest carries, for each of its images, an attestation
    manifest whose provenance is about that image and names the revision and the
    repository (and an SPDX SBOM when ``sbom``). ProvenanceError says what is missing."""
    top = registry.manifest(want.image, want.digest)
    if not top.is_index:
        raise ProvenanceError(
            f"{top.reference}: a single manifest, without attestations (the build must run "
            "with build.attestations: true, which pushes an index); nothing is written back"
        )
    entries = list(_entries(top))
    attestations: dict[str, str] = {}
    platforms: list[str] = []
    for entry in entries:
        annotations = entry.get("annotations") or {}
        if annotations.get(REFERENCE_TYPE) == ATTESTATION_MANIFEST:
            attestations[str(annotations.get(REFERENCE_DIGEST))] = _digest_of(entry, top)
        else:
            platforms.append(_digest_of(entry, top))
    if not platforms:
        raise ProvenanceError(f"{top.reference}: the index holds no image")
    for image in platforms:
        if image not in attestations:
            raise ProvenanceError(
                f"{top.reference}: no attestation manifest for its image {image}; "
                "nothing is written back"
            )
        manifest = registry.manifest(want.image, attestations[image])
        layers = {
            str((layer.get("annotations") or {}).get(PREDICATE_TYPE)): layer
            for layer in manifest.data.get("layers") or []
            if isinstance(layer, dict) and layer.get("mediaType") == IN_TOTO_LAYER
        }
        provenance = next((layers[t] for t in SLSA_PROVENANCE if t in layers), None)
        if provenance is None:
            raise ProvenanceError(
                f"{manifest.reference}: no SLSA provenance for {image}; nothing is written back"
            )
        if sbom and SPDX not in layers:
            raise ProvenanceError(
                f"{manifest.reference}: no SPDX SBOM for {image} (build.sbom is on); "
                "nothing is written back"
            )
        statement = _statement(registry, want, manifest, provenance)
        _check_statement(statement, image, want, manifest.reference)


def _statement(
    registry: RegistryClient, want: Expected, manifest: Manifest, layer: dict[str, Any]
) -> dict[str, Any]:
    digest = layer.get("digest")
    if not isinstance(digest, str):
        raise ProvenanceError(f"{manifest.reference}: the provenance layer has no digest")
    try:
        statement = json.loads(registry.blob(want.image, digest))
    except ValueError:
        raise ProvenanceError(f"{manifest.reference}: the provenance is not JSON") from None
    if not isinstance(statement, dict):
        raise ProvenanceError(f"{manifest.reference}: the provenance is not an in-toto statement")
    return statement


def _check_statement(statement: dict[str, Any], image: str, want: Expected, where: str) -> None:
    subjects = statement.get("subject")
    if not isinstance(subjects, list):
        raise ProvenanceError(
            f"{where}: the provenance's subject is not a list; nothing is written back"
        )
    hexes = {
        found
        for subject in subjects
        if isinstance(found := _mapping(_mapping(subject).get("digest")).get("sha256"), str)
    }
    if image.removeprefix("sha256:") not in hexes:
        raise ProvenanceError(
            f"{where}: the provenance is about {sorted(h for h in hexes if h)}, not {image}; "
            "nothing is written back"
        )
    vcs = _vcs(statement)
    for field, value in (("revision", want.revision), ("source", want.source)):
        if vcs.get(field) != value:
            raise ProvenanceError(
                f"{where}: the provenance names {field} {vcs.get(field)!r}, not {value!r}; "
                "nothing is written back"
            )


def _vcs(statement: dict[str, Any]) -> dict[str, Any]:
    """BuildKit's ``vcs`` metadata (from the build's vcs:source and vcs:revision), where
    SLSA v0.2 (``metadata``) or v1 (``runDetails.metadata``) keeps it."""
    predicate = _mapping(statement.get("predicate"))
    for found in (
        _mapping(_mapping(predicate.get("metadata")).get(BUILDKIT_METADATA)),
        _mapping(
            _mapping(_mapping(predicate.get("runDetails")).get("metadata")).get("buildkit_metadata")
        ),
    ):
        vcs = _mapping(found.get("vcs"))
        if vcs:
            return vcs
    return {}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _entries(index: Manifest) -> Iterator[dict[str, Any]]:
    manifests = index.data.get("manifests")
    if not isinstance(manifests, list):
        raise ProvenanceError(f"{index.reference}: the index has no manifests list")
    for entry in manifests:
        if not isinstance(entry, dict):
            raise ProvenanceError(f"{index.reference}: an index entry is not an object")
        yield entry


def _digest_of(entry: dict[str, Any], index: Manifest) -> str:
    digest = entry.get("digest")
    if not isinstance(digest, str):
        raise ProvenanceError(f"{index.reference}: an index entry has no digest")
    return digest
