"""What ``fabrique`` imports before it works: the start-up of every command, and most of
an idle ``fabrique reconcile`` pass (bench/RESULTS.md).

The Kubernetes client is the heaviest import: the ``kubernetes`` package, and above all
its ``CoreV1Api`` (hundreds of validated methods). A command imports the package only
once it talks to a cluster, and never ``CoreV1Api``: the core kinds are read and
written by path. Each check runs in a fresh interpreter, whose ``sys.modules`` is what
the command itself imported. No time is checked: these machines are noisy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import GITEA_TOKEN, ROOT, Repo, write_values
from .doubles.gitea import GiteaDouble
from .doubles.kube import KubeApiDouble
from .servers import Registry

CORE_V1_API = "kubernetes.client.api.core_v1_api"

# runs ``fabrique <argv>`` as the console script does, then prints the modules it loaded
_RUN = """
import json, sys
from fabrique.cli import main
sys.argv = ["fabrique", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exit:
    code = exit.code
else:
    code = 0
print(json.dumps({"exit": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _loaded(*argv: str, env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    """``fabrique argv`` in a fresh interpreter: its exit code and the modules it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _RUN, json.dumps(argv)],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    report = json.loads(done.stderr.splitlines()[-1])
    return report["exit"], set(report["modules"])


def test_help_and_the_reconcile_entry_import_no_kubernetes_client() -> None:
    code, modules = _loaded("--help")
    assert code == 0
    assert "kubernetes" not in modules
    # the modules of the reconcile command, imported but not run
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, fabrique.cli, fabrique.decisions.reconcile, fabrique.clients.kube;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'urllib3')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[]"


def test_a_reconcile_pass_imports_no_kubernetes_client(
    tmp_path: Path,
    code_repo: Repo,
    gitea: GiteaDouble,
    kube: KubeApiDouble,
    registry: Registry,
) -> None:
    """Its kubeconfig is a plain one (a server, a token): fabrique reads it itself."""
    values = write_values(
        tmp_path / "site.yaml", **{"gitea.url": gitea.url, "registry.host": registry.host}
    )
    env = {
        "KUBECONFIG": str(kube.kubeconfig(tmp_path / "kubeconfig")),
        "FABRIQUE_GITEA_TOKEN": GITEA_TOKEN,
    }
    for _ in range(2):  # without memory, then with it (written, then read)
        code, modules = _loaded("--values", str(values), "reconcile", env=env)
        assert code == 0
        assert {m for m in modules if m.split(".")[0] == "kubernetes"} == set()
    asked = {part for request in kube.requests for part in request.path.split("/")}
    assert {"configmaps", "workflows"} <= asked, "the memory and the sweep were asked"
    assert {r.headers.get("authorization") for r in kube.requests} == {"Bearer double-token"}


def test_a_kubeconfig_it_does_not_read_itself_goes_through_the_client(
    tmp_path: Path, kube: KubeApiDouble
) -> None:
    """A client certificate (or an exec plugin, ...): the Kubernetes client sets up the
    connection, and the requests still go by path (no CoreV1Api)."""
    plain = kube.kubeconfig(tmp_path / "kubeconfig").read_text()
    config = tmp_path / "with-cert"
    config.write_text(
        plain.replace("    token: double-token\n", "    token: double-token\n    username: u\n")
    )
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from fabrique.clients.kube import KubeClient, connect\n"
            "client = KubeClient(connect())\n"
            "print(client.get_configmap('fabrique', 'none'))\n"
            f"print('kubernetes.config' in sys.modules, {CORE_V1_API!r} in sys.modules)",
        ],
        env={**os.environ, "KUBECONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["None", "True", "False"]
    assert kube.requests[-1].path == "/api/v1/namespaces/fabrique/configmaps/none"


def test_in_a_pod_the_token_is_read_for_each_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fabrique.clients import kube

    (tmp_path / "token").write_text("first\n")
    (tmp_path / "ca.crt").write_bytes(_ca_pem())
    monkeypatch.setattr(kube, "SERVICE_ACCOUNT", tmp_path)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    connection = kube.connect()
    assert connection.server == "https://[fd00::1]:6443"
    assert connection.auth() == {"Authorization": "Bearer first"}
    (tmp_path / "token").write_text("renewed\n")
    assert connection.auth() == {"Authorization": "Bearer renewed"}


def _ca_pem() -> bytes:
    """A self-signed CA certificate, as a pod's ``ca.crt``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return certificate.public_bytes(serialization.Encoding.PEM)


def _roots(modules: set[str]) -> set[str]:
    return {module.split(".")[0] for module in modules}


def test_validate_imports_neither_hera_nor_the_site_config() -> None:
    """``fabrique validate`` checks a tree against the specs: Hera's models, the site's
    pydantic model and the HTTP client are no part of it (a third of a second)."""
    code, modules = _loaded("validate", str(ROOT / "manifests"), env={"PATH": "/nonexistent"})
    assert code == 0
    assert _roots(modules) & {"hera", "pydantic", "httpx"} == set()
    assert "fabrique.site.config" not in modules
