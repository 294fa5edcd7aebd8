"""The site config: defaults, values file, FABRIQUE_* overrides, and one-line errors."""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fabrique.site.config import (
    ENV_RESERVED,
    apply_env_override,
    default_values,
    load_site,
)
from fabrique.site.errors import ConfigError
from fabrique.site.names import MAX_APP_NAME_LEN, workflow_name

from .conftest import ROOT, run_cli, write_values

REV = "0123456789abcdef0123456789abcdef01234567"
# what a site that still gives build.storageClassName is told
RETIRED_STORAGE_CLASS = (
    "retired: the build's workspace is an emptyDir of its pod, not a claim, so no "
    "StorageClass applies (build.workspaceSize bounds it)"
)


def _app(**fields: object) -> dict[str, object]:
    app: dict[str, object] = {
        "name": "citation",
        "image": "citation-dagster",
        "context": "dataops/citation-dagster",
        "writeback": {"repo": "atlas/atlas", "path": "deploy/kustomization.yaml"},
    }
    app.update(fields)
    return app


def test_default_site_is_the_generic_one() -> None:
    site = load_site(env={})
    assert site.gitea.code_repo == "atlas/atlas"
    assert site.gitea.apps_repo == "cluster/apps"
    assert site.registry.host == "registry:80"
    assert site.images.buildkit == "moby/buildkit:v0.32.2-rootless"
    app = site.app("citation")
    assert (app.image, app.context) == ("citation-dagster", "dataops/citation-dagster")
    assert app.writeback.kind == "kustomize-images"
    assert app.writeback.path == "dataops/citation-dagster/deploy/overlays/prod/kustomization.yaml"


def test_values_file_and_env_layer_over_defaults(tmp_path: Path) -> None:
    values = write_values(tmp_path / "site.yaml", **{"registry.host": "registry.example:5000"})
    site = load_site(
        values, env={"FABRIQUE_BUILD__RETRIES": "5", "FABRIQUE_REGISTRY__PLAIN_HTTP": "false"}
    )
    assert site.registry.host == "registry.example:5000"
    assert site.registry.plain_http is False
    assert site.build.retries == 5
    # untouched defaults stay
    assert site.gitea.code_repo == "atlas/atlas"


def test_env_names_the_values_file(tmp_path: Path) -> None:
    values = write_values(tmp_path / "site.yaml", **{"gitea.branch": "release"})
    assert load_site(env={"FABRIQUE_VALUES": str(values)}).gitea.branch == "release"


def test_env_override_indexes_into_lists() -> None:
    site = load_site(env={"FABRIQUE_APPS__0__DOCKERFILE": "docker/Dockerfile.prod"})
    assert site.apps[0].dockerfile == "docker/Dockerfile.prod"


def test_app_name_limit_keeps_workflow_name_within_63() -> None:
    longest = "a" * MAX_APP_NAME_LEN
    site = load_site(env={"FABRIQUE_APPS__0__NAME": longest})
    assert len(workflow_name(site.apps[0].name, REV)) == 63
    with pytest.raises(ConfigError, match=r"^apps\[0\]\.name: must be at most 41 characters"):
        load_site(env={"FABRIQUE_APPS__0__NAME": longest + "a"})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (
            {"apps": [_app(), _app(name="Bad_Name", image="other")]},
            r"^apps\[1\]\.name: must be a DNS-1123 label",
        ),
        ({"apps": [_app(context="/abs/path")]}, r"^apps\[0\]\.context: must be a relative path"),
        ({"apps": [_app(context="a/../../b")]}, r"^apps\[0\]\.context: must be a relative path"),
        (
            {"apps": [_app(dockerfile="../Dockerfile")]},
            r"^apps\[0\]\.dockerfile: must be a relative path",
        ),
        (
            {"apps": [_app(image="Citation")]},
            r"^apps\[0\]\.image: must be a registry repository name",
        ),
        ({"apps": [_app(buildArgs={"BAD-KEY": "x"})]}, r"^apps\[0\]\.buildArgs: .*BAD-KEY"),
        (
            {"apps": [_app(buildArgs={"K": "two\nlines"})]},
            r"^apps\[0\]\.buildArgs: value of K must be a single line",
        ),
        (
            {"apps": [_app(writeback={"repo": "atlas", "path": "k.yaml"})]},
            r"^apps\[0\]\.writeback\.repo: must be owner/name",
        ),
        (
            {"apps": [_app(writeback={"repo": "a/b", "path": "k.yaml", "kind": "helm"})]},
            r"^apps\[0\]\.writeback\.kind: ",
        ),
        ({"apps": [_app(), _app()]}, r"^apps\[1\]\.name: duplicate app name 'citation'"),
        (
            {"apps": [_app(), _app(name="other")]},
            r"^apps\[1\]\.image: 'citation-dagster' is already the image of app",
        ),
        ({"apps": []}, r"^apps: List should have at least 1 item"),
        ({"apps": [_app(contxt="x")]}, r"^apps\[0\]\.contxt: unknown field"),
        ({"gitea": {"url": "ftp://gitea"}}, r"^gitea\.url: must be an http"),
        ({"gitea": {"url": "https://user:pw@gitea"}}, r"^gitea\.url: must be an http"),
        ({"gitea": {"branch": "refs/heads/main"}}, r"^gitea\.branch: must be a plain branch name"),
        (
            {"registry": {"host": "http://registry:80"}},
            r"^registry\.host: must be host or host:port",
        ),
        ({"namespaces": {"build": "fabrique"}}, r"^namespaces\.build: must differ from control"),
        ({"images": {"git": "alpine/git"}}, r"^images\.git: must carry a tag or a digest"),
        (
            {"images": {"buildkit": "moby/buildkit:v0.32.2"}},
            r"^images\.buildkit: must be a -rootless BuildKit image",
        ),
        (
            {"images": {"tools": "registry:80/tools@sha256:abc"}},
            r"^images\.tools: must be an image reference",
        ),
        ({"build": {"retries": 99}}, r"^build\.retries: Input should be less than or equal to 10"),
        ({"build": {"workspaceSize": "2G"}}, r"^build\.workspaceSize: must be a size such as 2Gi"),
        ({"registy": {}}, r"^registy: unknown field"),
    ],
)
def test_bad_values_name_the_field(
    tmp_path: Path, values: dict[str, object], expected: str
) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(ConfigError, match=expected) as caught:
        load_site(path, env={})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [("storageClassName", "fast-ssd"), ("storageClassName", None), ("storage_class_name", "x")],
)
def test_a_retired_setting_in_a_values_file_is_refused_with_why(
    tmp_path: Path, key: str, value: Any
) -> None:
    """The build's workspace is an emptyDir now: a values file that still names a
    StorageClass for it is told so, not quietly built without it (nor told of a typo)."""
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"build": {key: value}}))
    with pytest.raises(ConfigError) as caught:
        load_site(path, env={})
    assert str(caught.value) == f"build.{key}: {RETIRED_STORAGE_CLASS}; remove it"


def test_image_digests_are_accepted() -> None:
    pinned = "moby/buildkit:v0.32.2-rootless@sha256:" + "a" * 64
    assert load_site(env={"FABRIQUE_IMAGES__BUILDKIT": pinned}).images.buildkit == pinned


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("FABRIQUE_REGISTRY_HOST", r"unknown setting 'registry_host' \(nested settings use '__'"),
        ("FABRIQUE_REGISTRY__HOSTNAME", r"unknown setting 'hostname'"),
        ("FABRIQUE_APPS__7__NAME", r"apps has no item '7'"),
        (
            "FABRIQUE_BUILD__STORAGE_CLASS_NAME",
            "^FABRIQUE_BUILD__STORAGE_CLASS_NAME: build.storageClassName is "
            + re.escape(RETIRED_STORAGE_CLASS + "; unset it")
            + "$",
        ),
    ],
)
def test_bad_env_names_are_errors(name: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_site(env={name: "x"})


def test_reserved_variables_are_not_overrides() -> None:
    site = load_site(env={"FABRIQUE_GITEA_TOKEN": "secret", "FABRIQUE_KUBECONTEXT": "prod"})
    assert "secret" not in yaml.safe_dump(site.to_values())


# what the project is made of: where a FABRIQUE_* variable may be read or documented
SOURCES = ("fabrique", "tests", "bench", "pipelines", "eventsources", "docs")
SOURCE_FILES = ("Makefile", "README.md")
# FABRIQUE_* names the project writes only to show that they are refused
REFUSED_EXAMPLES = {
    "FABRIQUE_A__B__0__C": "unknown setting 'a'",
    "FABRIQUE_BUILD__STORAGE_CLASS_NAME": "build.storageClassName is retired",
    "FABRIQUE_BUILD__RETRIS": "unknown setting 'retris'",
    "FABRIQUE_REGISTRY_HOST": "unknown setting 'registry_host'",
    "FABRIQUE_REGISTRY__HOSTNAME": "unknown setting 'hostname'",
    "FABRIQUE_X": "unknown setting 'x'",
}


def _env_names_in_the_project() -> dict[str, set[str]]:
    """Every FABRIQUE_* name the project's source spells, and the files that spell it."""
    files = [ROOT / name for name in SOURCE_FILES]
    files += [path for folder in SOURCES for path in sorted((ROOT / folder).rglob("*"))]
    found: dict[str, set[str]] = {}
    for path in files:
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        for name in re.findall(rb"FABRIQUE_[A-Z0-9_]*[A-Z0-9]", path.read_bytes()):
            found.setdefault(name.decode(), set()).add(str(path.relative_to(ROOT)))
    return found


@functools.cache
def _defaults() -> dict[str, Any]:
    return default_values()


def _is_a_setting(name: str) -> bool:
    """Whether ``name`` is a config path (``FABRIQUE_APPS__7__NAME`` is, with 8 apps)."""
    try:
        apply_env_override(copy.deepcopy(_defaults()), name, "x")
    except ConfigError as err:
        return not any(refused in str(err) for refused in ("unknown setting", " is retired"))
    return True


def test_every_fabrique_variable_the_project_reads_is_set_aside() -> None:
    """A FABRIQUE_* variable that fabrique, its tests, its bench or its README reads, and
    that is no config path, must be set aside by the config reader: exported as the README
    says (FABRIQUE_NATS_CLIENT_AUTH for the bus, FABRIQUE_LIVE_DIR for make up), it would
    otherwise stop every later command as an "unknown setting"."""
    found = _env_names_in_the_project()
    assert "tests/peers/build.py" in found.get("FABRIQUE_PEERS_CACHE", set()), "the scan reads"
    unknown = {
        name: sorted(files)
        for name, files in found.items()
        if name not in ENV_RESERVED and name not in REFUSED_EXAMPLES and not _is_a_setting(name)
    }
    assert not unknown, f"read but not in config.ENV_RESERVED: {unknown}"
    for name, refusal in REFUSED_EXAMPLES.items():
        with pytest.raises(ConfigError, match=re.escape(f"{name}: {refusal}")):
            load_site(env={name: "x"})
    for name, reader in ENV_RESERVED.items():
        assert not _is_a_setting(name), f"{name} is set aside, yet it names a setting"
        elsewhere = found.get(name, set()) - {"fabrique/site/config.py"}
        assert elsewhere or reader.startswith("retired"), f"{name}: nothing reads it"


def test_the_variables_set_aside_do_not_stop_a_command(tmp_path: Path) -> None:
    exported = {name: "x" for name in ENV_RESERVED} | {"FABRIQUE_VALUES": ""}
    assert load_site(env=exported).gitea.branch == "main"
    values = write_values(tmp_path / "site.yaml", **{"gitea.branch": "release"})
    shell = {
        "FABRIQUE_NATS_CLIENT_AUTH": "token: s3cret\n",
        "FABRIQUE_LIVE_DIR": str(tmp_path / "live"),
        "FABRIQUE_PEERS_CACHE": str(tmp_path / "peers"),
    }
    result = run_cli("--values", str(values), "config", "show", env=shell)
    assert result.exit_code == 0, result.stderr
    assert "s3cret" not in result.stdout


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("apps: [\n", r"line 2: (expected the|did not find expected) node content"),
        ("- a\n- b\n", r"must be a mapping at the top level"),
    ],
)
def test_unreadable_values_file(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "site.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=expected):
        load_site(path, env={})


def test_cli_reports_config_errors_on_one_line(tmp_path: Path) -> None:
    path = write_values(tmp_path / "site.yaml", **{"registry.host": "http://x"})
    result = run_cli("--values", str(path), "config", "show")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: registry.host: must be host or host:port, without a scheme (got 'http://x')"
    ]
    missing = run_cli("--values", str(tmp_path / "nope.yaml"), "config", "show")
    assert missing.exit_code == 2
    assert "values file" in missing.stderr and "not found" in missing.stderr


def test_config_show_prints_the_effective_site(tmp_path: Path) -> None:
    path = write_values(tmp_path / "site.yaml", **{"gitea.branch": "release"})
    result = run_cli("--values", str(path), "config", "show")
    assert result.exit_code == 0
    assert yaml.safe_load(result.stdout)["gitea"]["branch"] == "release"


@pytest.mark.parametrize(
    "url",
    [
        "https://fabrique:s3cr3t-token@gitea.example.org",
        "https://s3cr3t-token@gitea.example.org",
        "http://user:s3cr3t-token@gitea:3000",
        "git://s3cr3t-token@gitea",
        "ssh://git:s3cr3t-token@gitea-ssh:22",
        "https://gitea.example.org/?token=s3cr3t-token",
    ],
)
def test_credentials_in_the_git_url_are_refused_and_never_shown(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^writeback\.gitUrl: must not carry") as caught:
        load_site(env={"FABRIQUE_WRITEBACK__GIT_URL": url})
    assert "s3cr3t-token" not in str(caught.value)


@pytest.mark.parametrize(
    "url", ["ssh://git@gitea-ssh.gitea:22", "https://gitea.example.org/git", "git://gitea:9418"]
)
def test_a_git_url_may_name_an_ssh_user(url: str) -> None:
    assert load_site(env={"FABRIQUE_WRITEBACK__GIT_URL": url}).writeback.git_url == url


def test_a_git_remote_never_prints_the_credentials_of_its_url(tmp_path: Path) -> None:
    from fabrique.clients.git import GitRemote
    from fabrique.site.errors import GitError
    from fabrique.site.retry import RetryPolicy

    from .servers import closed_port

    url = f"http://fabrique:s3cr3t-token@127.0.0.1:{closed_port()}/atlas/atlas.git"
    remote = GitRemote(url, "main", tmp_path / "w", retry=RetryPolicy(attempts=1), timeout=10)
    with pytest.raises(GitError) as caught:
        remote.fetch_tip()
    assert "s3cr3t-token" not in str(caught.value)
    assert "http://***@127.0.0.1:" in str(caught.value), "the remote is still named"


# ---------------------------------------------------------------- validation gaps


def _load(tmp_path: Path, values: dict[str, object]) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(values))
    with pytest.raises(ConfigError) as caught:
        load_site(path, env={})
    assert "\n" not in str(caught.value)
    return str(caught.value)


_SECRET = {"app": "citation", "from": "postgres/pg-role", "to": "dagster/pg-auth"}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        # $ lets a final newline through; fullmatch does not
        ({"apps": [_app(name="citation\n")]}, r"^apps\[0\]\.name: must be a DNS-1123 label"),
        (
            {"apps": [_app(image="citation-dagster\n")]},
            r"^apps\[0\]\.image: must be a registry repository name",
        ),
        ({"namespaces": {"control": "fabrique\n"}}, r"^namespaces\.control: must be a DNS"),
        (
            {"images": {"tools": "registry:80/tools:0.1.0\n"}},
            r"^images\.tools: must be an image reference",
        ),
        ({"registry": {"host": "registry:0"}}, r"^registry\.host: port 0 is outside 1-65535"),
        ({"registry": {"host": "registry:70000"}}, r"^registry\.host: port 70000 is outside"),
        ({"gitea": {"url": "http://gitea:99999"}}, r"^gitea\.url: port 99999 is outside"),
        ({"gitea": {"url": "http://gitea:port"}}, r"^gitea\.url: must be an http"),
        (
            {"netpol": {"dns": {"podLabels": {"bad key": "x"}}}},
            r"^netpol\.dns\.podLabels: label key 'bad key' must be \[prefix/\]name",
        ),
        (
            {"netpol": {"gitea": {"podLabels": {"Example.org/name": "gitea"}}}},
            r"^netpol\.gitea\.podLabels: label key 'Example\.org/name'",
        ),
        (
            {"netpol": {"registry": {"podLabels": {"app": "-registry"}}}},
            r"^netpol\.registry\.podLabels: label app: value '-registry' is not a valid",
        ),
        (
            {"mirrorSync": {"giteaPodLabels": {"a" * 64: "gitea"}}},
            r"^mirrorSync\.giteaPodLabels: label key 'a{64}'",
        ),
        (
            {"derivedSecrets": [_SECRET | {"keys": {"a/b": "password"}}]},
            r"^derivedSecrets\[0\]\.keys: key 'a/b' must be letters",
        ),
        (
            {"derivedSecrets": [_SECRET | {"keys": {"password": "../password"}}]},
            r"^derivedSecrets\[0\]\.keys: key '\.\./password' must be",
        ),
        (
            {"derivedSecrets": [_SECRET | {"keys": {"..data": "password"}}]},
            r"^derivedSecrets\[0\]\.keys: key '\.\.data' must be .* not start with '\.\.'",
        ),
        ({"gitea": {"tokenSecret": {"key": "."}}}, r"^gitea\.tokenSecret\.key: key '\.' is not"),
    ],
)
def test_validation_gaps_are_closed(
    tmp_path: Path, values: dict[str, object], expected: str
) -> None:
    assert re.search(expected, _load(tmp_path, values))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("https://github.com/example/atlas.git?token=s3cr3t-token", "must not carry a query"),
        ("https://bot:s3cr3t-token@github.com/example/atlas.git", "must not carry credentials"),
        ("https://s3cr3t-token@github.com/example/atlas.git", "must not carry credentials"),
        ("https://github.com/example/atlas.git#main", "must not carry a query"),
        ("http://github.com/example/atlas.git", "must be an https:// URL"),
        ("https://github.com:0/example/atlas.git", "port 0 is outside 1-65535"),
    ],
)
def test_a_mirror_source_carries_no_credentials(tmp_path: Path, source: str, expected: str) -> None:
    mirror = {"repo": "atlas/atlas", "source": source, "interval": "10m"}
    message = _load(tmp_path, {"mirrors": [mirror]})
    assert message.startswith(f"mirrors[0].source: {expected}"), message
    assert "s3cr3t-token" not in message


@pytest.mark.parametrize("interval", ["5m", "9m"])
def test_a_mirror_interval_under_gitea_s_minimum_is_refused(tmp_path: Path, interval: str) -> None:
    """Gitea answers 500 to a migration below [mirror] MIN_INTERVAL (10m) and leaves an
    empty mirror behind: the config says so before anything is asked."""
    mirror = {"repo": "atlas/atlas", "source": "https://github.com/example/atlas.git"}
    message = _load(tmp_path, {"mirrors": [mirror | {"interval": interval}]})
    assert message.startswith("mirrors[0].interval: must be at least 10m"), message
    assert (
        load_site(write_values(tmp_path / "ok.yaml", mirrors=[mirror | {"interval": "1h"}]), env={})
        .mirrors[0]
        .interval
        == "1h"
    )


def test_label_keys_and_secret_keys_that_kubernetes_takes_are_accepted(tmp_path: Path) -> None:
    values = {
        "netpol": {"dns": {"podLabels": {"app.kubernetes.io/name": "kube-dns", "k8s-app": ""}}},
        "derivedSecrets": [_SECRET | {"keys": {"pg.password": "password", "user_name": "u-1"}}],
    }
    site = load_site(write_values(tmp_path / "site.yaml", **_dotted(values)), env={})
    assert site.derived_secrets[0].keys == {"pg.password": "password", "user_name": "u-1"}


def _dotted(values: dict[str, object]) -> dict[str, object]:
    return {
        "netpol.dns.podLabels": values["netpol"]["dns"]["podLabels"],  # type: ignore[index]
        "derivedSecrets": values["derivedSecrets"],
    }


def test_a_key_that_is_a_mapping_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "site.yaml"
    path.write_text("gitea:\n  branch: main\n? {owner: data}\n: team\n")
    with pytest.raises(ConfigError, match=r"^values file .*: line 3: a key that is a mapping"):
        load_site(path, env={})
    result = run_cli("--values", str(path), "config", "show")
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1


# ------------------------------------------------------------ environments' targets

_PROD = {"repo": "atlas/atlas", "path": "deploy/kustomization.yaml"}


def _two_environments(first: dict[str, object], prod: dict[str, object]) -> dict[str, object]:
    return {
        "targets": {"bench": {"context": "bench"}, "prod": {"context": "prod"}},
        "apps": [
            _app(
                writeback=first,
                environments=[
                    {"name": "bench", "target": "bench"},
                    {"name": "prod", "target": "prod", "writeback": prod},
                ],
            )
        ],
    }


@pytest.mark.parametrize(
    ("first", "prod"),
    [
        (_PROD, _PROD | {"branch": "main"}),  # the site's branch, said or not
        (_PROD | {"branch": "main"}, _PROD),
    ],
    ids=["prod-says-main", "build-says-main"],
)
def test_a_target_is_one_file_whatever_says_its_branch(
    tmp_path: Path, first: dict[str, object], prod: dict[str, object]
) -> None:
    """A branch left out is the site's (gitea.branch): prod's target on `main` and the
    build's with none are one file, and every build would write straight into prod."""
    assert _load(tmp_path, _two_environments(first, prod)) == (
        "apps[0].environments[1].writeback: atlas/atlas:deploy/kustomization.yaml is "
        "already another environment's target (bench's on branch main, where the build "
        "writes)"
    )


def test_the_same_path_on_another_branch_is_another_target(tmp_path: Path) -> None:
    values = _two_environments(_PROD, _PROD | {"branch": "release"})
    site = load_site(write_values(tmp_path / "site.yaml", **values), env={})
    assert [env.name for env in site.apps[0].environments] == ["bench", "prod"]
