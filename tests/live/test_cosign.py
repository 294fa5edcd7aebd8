"""cosign for real (``tests/peers/cosign``, the tools image's version): the sign step's
rendered command signs what the build step pushed, and fabrique's own check of the
signature is held to ``cosign verify``'s verdict, case by case.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from fabrique.clients.registry import RegistryClient
from fabrique.decisions.signature import KEY_FILE, SIGNING_MOUNT, load_public_key, verify_signed
from fabrique.site.config import Site
from fabrique.site.errors import ProvenanceError

from ..conftest import KUSTOMIZATION, Repo, run_cli
from ..doubles.gitea import GiteaDouble
from ..manifests import rendered_step
from ..oci import push_image
from ..servers import GitDaemon, Registry
from . import controlplane
from .buildkit import Builder
from .fixtures import need_go
from .test_build import _app, _build, _checkout, _site, _verify, _writeback

IMAGE = "citation-dagster"
HTTP = ("--allow-http-registry",)  # the loopback registry speaks plain HTTP


@dataclass(frozen=True)
class KeyPair:
    key: Path  # cosign.key, encrypted with the password
    pub: Path
    password: str = field(repr=False)  # never printed, not even by a failed assert


@pytest.fixture(scope="session")
def cosign() -> str:
    need_go()
    return str(controlplane.binaries(("cosign",))["cosign"])


def _key_pair(cosign: str, folder: Path) -> KeyPair:
    folder.mkdir(parents=True)
    password = secrets.token_urlsafe(16)
    made = subprocess.run(
        [cosign, "generate-key-pair"],
        cwd=folder,
        env={"PATH": os.environ["PATH"], "COSIGN_PASSWORD": password},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    return KeyPair(folder / "cosign.key", folder / "cosign.pub", password)


@pytest.fixture(scope="session")
def keys(cosign: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[KeyPair]]:
    """The site's key pair, and another."""
    root = tmp_path_factory.mktemp("cosign")
    yield [_key_pair(cosign, root / "site"), _key_pair(cosign, root / "other")]


def _signing_site(
    tmp_path: Path, registry: Registry, pair: KeyPair, **overrides: object
) -> tuple[Path, Site]:
    return _site(
        tmp_path,
        registry,
        **{
            "signing.keySecret": {"name": "fabrique-cosign", "key": KEY_FILE},
            "signing.passwordKey": "cosign.password",
            "signing.publicKey": pair.pub.read_text(),
            **overrides,
        },
    )


def _cosign_accepts(cosign: str, pub: Path, reference: str) -> bool:
    """``cosign verify`` with the key, the air-gapped way (no transparency log). Its
    ``--allow-http-registry`` is not passed on to the registry client by v2.4.1's verify
    (``cmd/cosign/cli/verify.go``): ``--allow-insecure-registry`` is, which falls back to
    plain HTTP."""
    done = subprocess.run(
        [
            *(cosign, "verify", "--key", str(pub), "--insecure-ignore-tlog=true"),
            *("--allow-insecure-registry", reference),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


def _fabrique_accepts(registry: Registry, pub: Path, repository: str, digest: str) -> bool:
    with RegistryClient(registry.host, plain_http=True) as client:
        try:
            verify_signed(client, repository, digest, load_public_key(pub.read_text()))
        except ProvenanceError:
            return False
    return True


def _copy(registry: Registry, source: str, destination: str) -> None:
    """What someone who can push can do: copy a manifest, blobs and all, as it is."""
    subprocess.run(
        [
            *("skopeo", "copy", "-q", "--preserve-digests"),
            *("--src-tls-verify=false", "--dest-tls-verify=false"),
            *(f"docker://{registry.host}/{source}", f"docker://{registry.host}/{destination}"),
        ],
        check=True,
        timeout=60,
    )


def _sign(site: Site, values: Path, digest: str, pair: KeyPair, cosign: str) -> None:
    """The sign stage as rendered: its key where the Secret is mounted, here a file, and
    the digest its script reads from verify-digest's file."""
    container = rendered_step(site, "sign")
    assert '--digest "$(cat "$DIGEST_FILE")"' in container["command"][2]
    args = [arg.replace("{{workflow.parameters.app}}", "citation") for arg in container["args"]]
    args += ["--digest", digest]
    assert f"{SIGNING_MOUNT}/{KEY_FILE}" in args
    args[args.index(f"{SIGNING_MOUNT}/{KEY_FILE}")] = str(pair.key)
    signed = run_cli(
        "--values",
        str(values),
        *args,
        env={
            "COSIGN_PASSWORD": pair.password,
            "PATH": f"{Path(cosign).parent}:{os.environ['PATH']}",
        },
    )
    assert signed.exit_code == 0, signed.stderr
    assert pair.password not in signed.stdout + signed.stderr


def test_one_commit_built_verified_attested_signed_and_written_back_with_the_real_tools(
    tmp_path: Path,
    buildkit: Builder,
    cosign: str,
    keys: list[KeyPair],
    named_registry: Registry,
    base_image: str,
    code_repo: Repo,
    git_daemon: GitDaemon,
    gitea: GiteaDouble,
) -> None:
    """The build's whole chain on one commit, each step as rendered, with attestations,
    the registry cache and signing on: BuildKit builds and pushes the index, digest
    verify reads its provenance, cosign signs it, and the write-back checks the
    signature before it writes the index digest."""
    site_pair, _ = keys
    values, site = _signing_site(
        tmp_path,
        named_registry,
        site_pair,
        **{"build.attestations": True, "build.cache": True, "gitea.url": gitea.url},
    )
    revision = _app(code_repo, base_image)
    before = code_repo.show(KUSTOMIZATION)
    build = _build(buildkit, site, revision, _checkout(buildkit, site, git_daemon, revision))
    assert build.returncode == 0, build.output
    digest = json.loads(build.metadata.read_text())["containerimage.digest"]
    with RegistryClient(named_registry.host, plain_http=True) as client:
        assert client.manifest(IMAGE, digest).is_index

    verified = _verify(values, revision, build.metadata)
    assert verified.exit_code == 0, verified.stderr
    assert verified.stdout.strip() == digest

    # before the signature, the write-back refuses; after it, it writes the index digest
    unsigned = _writeback(values, revision, digest)
    assert unsigned.exit_code == 8, unsigned.stderr
    assert "unsigned" in unsigned.stderr and "nothing is written back" in unsigned.stderr
    assert code_repo.show(KUSTOMIZATION) == before
    _sign(site, values, digest, site_pair, cosign)
    assert _cosign_accepts(cosign, site_pair.pub, f"{named_registry.host}/{IMAGE}@{digest}")
    written = _writeback(values, revision, digest)
    assert written.exit_code == 0, written.stderr
    assert yaml.safe_load(code_repo.show(KUSTOMIZATION))["images"][-1]["digest"] == digest


def test_the_sign_step_signs_the_build_and_fabrique_judges_as_cosign_verify(
    tmp_path: Path,
    buildkit: Builder,
    cosign: str,
    keys: list[KeyPair],
    named_registry: Registry,
    base_image: str,
    code_repo: Repo,
    git_daemon: GitDaemon,
) -> None:
    site_pair, other_pair = keys
    values, site = _signing_site(tmp_path, named_registry, site_pair)
    revision = _app(code_repo, base_image)
    build = _build(buildkit, site, revision, _checkout(buildkit, site, git_daemon, revision))
    assert build.returncode == 0, build.output
    digest = json.loads(build.metadata.read_text())["containerimage.digest"]

    _sign(site, values, digest, site_pair, cosign)
    reference = f"{named_registry.host}/{IMAGE}"

    # another image of the app, unsigned; then carrying the first one's signature
    other = push_image(named_registry.url, IMAGE, f"other-{revision[:12]}", {"o": b"o"})
    cases = {
        "the site's key": (site_pair.pub, IMAGE, digest),
        "another key": (other_pair.pub, IMAGE, digest),
        "another digest, unsigned": (site_pair.pub, IMAGE, other),
    }
    verdicts = {
        case: (
            _cosign_accepts(cosign, pub, f"{named_registry.host}/{repository}@{wanted}"),
            _fabrique_accepts(named_registry, pub, repository, wanted),
        )
        for case, (pub, repository, wanted) in cases.items()
    }
    sig = digest.replace(":", "-") + ".sig"
    _copy(named_registry, f"{IMAGE}:{sig}", f"{IMAGE}:{other.replace(':', '-')}.sig")
    verdicts["a signature copied from another image"] = (
        _cosign_accepts(cosign, site_pair.pub, f"{reference}@{other}"),
        _fabrique_accepts(named_registry, site_pair.pub, IMAGE, other),
    )
    assert verdicts == {
        "the site's key": (True, True),
        "another key": (False, False),
        "another digest, unsigned": (False, False),
        "a signature copied from another image": (False, False),
    }


def test_a_signed_image_copied_to_another_app_passes_cosign_but_not_fabrique(
    tmp_path: Path,
    cosign: str,
    keys: list[KeyPair],
    named_registry: Registry,
) -> None:
    """cosign checks that the signed payload names the digest, not the repository
    (``SimpleClaimVerifier``): an app's signed image and its signature, copied into
    another app's repository, pass ``cosign verify`` there. fabrique also asks the
    payload's ``docker-reference`` to name the repository: a signed image of one app is
    not deployed as another."""
    site_pair, _ = keys
    digest = push_image(named_registry.url, "signed-app", "1", {"s": b"s"})
    signed = subprocess.run(
        [
            *(cosign, "sign", "--yes", "--key", str(site_pair.key), "--tlog-upload=false"),
            *(*HTTP, f"{named_registry.host}/signed-app@{digest}"),
        ],
        env={"PATH": os.environ["PATH"], "COSIGN_PASSWORD": site_pair.password},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert signed.returncode == 0, signed.stderr
    sig = digest.replace(":", "-") + ".sig"
    _copy(named_registry, f"signed-app@{digest}", "another-app:1")
    _copy(named_registry, f"signed-app:{sig}", f"another-app:{sig}")
    assert _cosign_accepts(cosign, site_pair.pub, f"{named_registry.host}/another-app@{digest}")
    assert not _fabrique_accepts(named_registry, site_pair.pub, "another-app", digest)
    assert _fabrique_accepts(named_registry, site_pair.pub, "signed-app", digest)
