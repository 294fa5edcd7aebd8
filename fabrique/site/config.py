"""The site config: one typed, validated model of a fabrique site.

Three layers, each over the one before:

1. the embedded default site (``site.default.yaml``: generic values only);
2. a values file (``--values site.yaml`` or ``FABRIQUE_VALUES``), merged key by key,
   lists replaced whole; its apps may go on in files beside it that its ``appsFrom``
   lists (``[{file: site-2.yaml, sha256: …}]``), as ``fabrique render`` writes a site
   too large for one ConfigMap;
3. ``FABRIQUE_<PATH>`` environment variables, the path in upper snake case with ``__``
   between levels and list indexes as numbers: ``FABRIQUE_REGISTRY__HOST=registry:5000``,
   ``FABRIQUE_APPS__0__CONTEXT=src/app``.

The result is validated once, here. A bad value raises ConfigError with one line that
names the field path and the reason: ``apps[1].context: must be a relative path``.
Tokens are never part of the config; it only names the Secrets that hold them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib import resources
from itertools import combinations
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .allowlist import too_wide
from .errors import ConfigError, InputError
from .freeze import Frozen, Window, frozen_at, parse_duration, parse_span, recurrence, zone
from .names import (
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    MAX_APP_NAME_LEN,
    MAX_BRANCH_LEN,
    REPOSITORY_RE,
    ImageRef,
    push_branch,
    redact_urls,
)
from .retry import RetryPolicy

if TYPE_CHECKING:
    import httpx

ENV_PREFIX = "FABRIQUE_"
# The FABRIQUE_* variables that are not config overrides, and what reads each: every one
# the project reads (fabrique, its tests and bench, the Makefile, the README's examples),
# so that one exported as the README says does not stop every later command as an
# "unknown setting". tests/test_config.py checks the project's source against it.
ENV_RESERVED: Mapping[str, str] = MappingProxyType(
    {
        "FABRIQUE_VALUES": "the values file (--values)",
        "FABRIQUE_GITEA_TOKEN": "the Gitea token",
        "FABRIQUE_KUBECONTEXT": "the kube context (--context)",
        "FABRIQUE_WEBHOOK_TOKEN": "the EventSource's bearer token (seed-webhook)",
        "FABRIQUE_WRITEBACK_SIGNING_KEY": "the SSH key file that signs write-back commits",
        "FABRIQUE_NATS_CLIENT_AUTH": "the EventBus Secret's client-auth (doctor eventbus)",
        "FABRIQUE_NATS_TOKEN": "a bare NATS token (doctor eventbus)",
        "FABRIQUE_SPECS": "the upstream specs directory (--specs)",
        "FABRIQUE_LIVE_DIR": "the live tier's state folder (make up, tests/live)",
        "FABRIQUE_PEERS_CACHE": "where the Go peers are built (tests/peers)",
        "FABRIQUE_IMAGES_CACHE": "where the real node's images are made (tests/live/images.py)",
        "FABRIQUE_WEBHOOK_SECRET": "retired: webhook #2 has no HMAC secret; an old export "
        "must not stop a command",
    }
)
# Settings that are gone, by their path, and why. A values file or a FABRIQUE_* variable
# that still gives one is refused with the reason: ignored, it would let a site believe
# it still applies; called an unknown field, it would read as a typo.
RETIRED: Mapping[str, str] = MappingProxyType(
    {
        "build.storageClassName": "the build's workspace is an emptyDir of its pod, not a "
        "claim, so no StorageClass applies (build.workspaceSize bounds it)",
    }
)


def _dns_label(value: str) -> str:
    if len(value) > 63 or not DNS_LABEL_RE.fullmatch(value):
        raise ValueError("must be a DNS-1123 label (lowercase letters, digits, '-', at most 63)")
    return value


def _app_name(value: str) -> str:
    _dns_label(value)
    if len(value) > MAX_APP_NAME_LEN:
        raise ValueError(
            f"must be at most {MAX_APP_NAME_LEN} characters so that "
            "fabrique-<app>-<sha12> fits in 63"
        )
    return value


def _relative_path(value: str) -> str:
    """``value`` without its trailing slashes, if it is a relative path already in the
    form pathlib would give it (no empty, ``.`` or ``..`` part). Said on strings: every
    app has four paths, and pathlib's objects took most of validating 10 000 apps."""
    path = value.rstrip("/")
    if (
        not path
        or "\\" in value
        or value.startswith("/")
        or not {"", ".", ".."}.isdisjoint(path.split("/"))
    ):
        raise ValueError("must be a relative path inside the repository, without '..'")
    return path


def _repo_slug(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", value) or value.endswith(".git"):
        raise ValueError("must be owner/name")
    return value


def _branch(value: str) -> str:
    bad = (
        not value
        or value.startswith(("-", "/", "refs/"))
        or value.endswith(("/", ".lock", "."))
        or ".." in value
        or "@{" in value
        or re.search(r"[\s~^:?*\[\\\x00-\x1f\x7f]", value)
    )
    if bad:
        raise ValueError("must be a plain branch name such as main (no refs/heads/ prefix)")
    return value


def _port(port: str | None) -> None:
    if port is not None and not 1 <= int(port) <= 65535:
        raise ValueError(f"port {port} is outside 1-65535")


def _url(value: str) -> str:
    match = re.fullmatch(r"https?://[^\s/?#@:]+(?::(\d+))?(/[^\s?#]*)?", value)
    if not match:
        raise ValueError("must be an http:// or https:// URL without credentials")
    _port(match[1])
    return value.rstrip("/")


def _git_url(value: str) -> str:
    """A git server's base URL, without credentials: they belong in a Secret or an ssh
    key, never in the config (which is rendered into a ConfigMap and printed)."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError("must be an https://, http://, ssh:// or git:// URL") from None
    if (
        parts.scheme not in ("https", "http", "ssh", "git")
        or not parts.hostname
        or re.search(r"\s", value)
    ):
        raise ValueError("must be an https://, http://, ssh:// or git:// URL")
    if parts.password is not None or (parts.username is not None and parts.scheme != "ssh"):
        raise ValueError(
            "must not carry credentials (only an ssh:// URL may name a user, such as "
            "ssh://git@host); the token comes from FABRIQUE_GITEA_TOKEN or its Secret"
        )
    if parts.query or parts.fragment:
        raise ValueError("must not carry a query or a fragment (a ?token= is a credential)")
    return value.rstrip("/")


def _registry_host(value: str) -> str:
    match = re.fullmatch(r"(?:[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::(\d{1,5}))?", value)
    if not match:
        raise ValueError("must be host or host:port, without a scheme")
    _port(match[1])
    return value


def _image_ref(value: str) -> str:
    try:
        ref = ImageRef.parse(value)
    except InputError:
        raise ValueError("must be an image reference [host/]name:tag[@sha256:…]") from None
    if ref.tag is None and ref.digest is None:
        raise ValueError("must carry a tag or a digest (no implicit :latest)")
    return value


def _repository(value: str) -> str:
    if not REPOSITORY_RE.fullmatch(value):
        raise ValueError("must be a registry repository name such as citation-dagster")
    return value


def _quantity(value: str) -> str:
    if not re.fullmatch(r"[1-9][0-9]*(Ki|Mi|Gi|Ti)", value):
        raise ValueError("must be a size such as 2Gi")
    return value


_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def add_sizes(*sizes: str) -> str:
    """The sum of sizes such as 20Gi and 512Mi, in the largest unit that holds it whole."""
    total = sum(int(size[:-2]) * _UNITS[size[-2:]] for size in sizes)
    for unit, factor in sorted(_UNITS.items(), key=lambda item: -item[1]):
        if total % factor == 0:
            return f"{total // factor}{unit}"
    raise ValueError(f"sizes {sizes}: not a whole number of Ki")  # pragma: no cover


def _build_args(value: dict[str, str]) -> dict[str, str]:
    for key, arg in value.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"key {key!r} must be a build-arg name ([A-Za-z_][A-Za-z0-9_]*)")
        if "\n" in arg or "\r" in arg:
            raise ValueError(f"value of {key} must be a single line")
    return value


_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"


def _labels(value: dict[str, str]) -> dict[str, str]:
    """Kubernetes label keys (``[prefix/]name``) and values, as the API server checks them."""
    for key, label in value.items():
        prefix, _, name = key.rpartition("/")
        if (
            not re.fullmatch(_LABEL_NAME, name)
            or len(prefix) > 253
            or (prefix and not DNS_SUBDOMAIN_RE.fullmatch(prefix))
        ):
            raise ValueError(
                f"label key {key!r} must be [prefix/]name: a name of at most 63 letters, "
                "digits, '-', '_' or '.', a prefix a DNS subdomain"
            )
        if label and not re.fullmatch(_LABEL_NAME, label):
            raise ValueError(f"label {key}: value {label!r} is not a valid label value")
    return value


def _secret_key(value: str) -> str:
    """A key of a Secret's data: it becomes a file name when the Secret is mounted."""
    if not re.fullmatch(r"[-._a-zA-Z0-9]{1,253}", value) or value.startswith(".."):
        raise ValueError(
            f"key {value!r} must be letters, digits, '-', '_' or '.', and not start with '..'"
        )
    if value == ".":
        raise ValueError("key '.' is not a Secret key")
    return value


def _secret_keys(value: dict[str, str]) -> dict[str, str]:
    for target, source in value.items():
        _secret_key(target)
        _secret_key(source)
    return value


def _mirror_source(value: str) -> str:
    """An upstream repository's https:// URL, without credentials: a Gitea mirror keeps
    its address, and shows it to everyone who can read the repository."""
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        raise ValueError("must be an https:// URL with a valid port") from None
    if parts.scheme != "https" or not parts.hostname or re.search(r"\s", value):
        raise ValueError("must be an https:// URL such as https://github.com/org/repo.git")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials (user:token@); Gitea would show them")
    if parts.query or parts.fragment:
        raise ValueError("must not carry a query or a fragment (a ?token= is a credential)")
    if port is not None:
        _port(str(port))
    if parts.path.strip("/") == "":
        raise ValueError("must name a repository (https://host/owner/name)")
    return value


def _one_or_three(value: int) -> int:
    if value not in (1, 3):
        raise ValueError("must be 1 or 3 (a JetStream cluster needs a majority)")
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
RelativePath = Annotated[str, AfterValidator(_relative_path)]
RepoSlug = Annotated[str, AfterValidator(_repo_slug)]
ImageReference = Annotated[str, AfterValidator(_image_ref)]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=True,
        strict=False,
    )


class SecretKeyRef(_Model):
    """A key in a Kubernetes Secret of the namespace that uses it."""

    # the Secret's name
    name: DnsLabel
    # the key of its data
    key: Annotated[str, AfterValidator(_secret_key)]


class GiteaConfig(_Model):
    # Gitea's base URL, as the cluster's pods reach it
    url: Annotated[str, AfterValidator(_url)]
    # the code repository, owner/name: its pushes are built
    code_repo: RepoSlug
    # the branch built and, unless a target says otherwise, written back to
    branch: Annotated[str, AfterValidator(_branch)]
    # the repository of Argo CD's Applications (fabrique seed writes there)
    apps_repo: RepoSlug
    # the Secret holding fabrique's Gitea token (scope write:repository)
    token_secret: SecretKeyRef

    def repo_url(self, repo: str) -> str:
        return f"{self.url}/{repo}.git"


class ArgoServerConfig(_Model):
    """The Argo Workflows UI, for the links on commit statuses (``argoServer.url``)."""

    url: Annotated[str, AfterValidator(_url)] | None = None

    def workflow_url(self, namespace: str, workflow: str) -> str | None:
        """The page of one Workflow in the UI, or None when the site names no UI."""
        return f"{self.url}/workflows/{namespace}/{workflow}" if self.url else None


class RegistryConfig(_Model):
    """The registry the builds push to and the nodes pull from (``registry``)."""

    # the registry's host[:port], as the nodes pull from it (registry:80)
    host: Annotated[str, AfterValidator(_registry_host)]
    # true: the registry speaks HTTP, not HTTPS
    plain_http: bool


class Namespaces(_Model):
    """The namespaces fabrique's objects go into (``namespaces``)."""

    # fabrique's own: the event path, the safety net, the site's ConfigMap
    control: DnsLabel
    # the builds' Workflows and pods (the only privileged one)
    build: DnsLabel
    # where Gitea runs (its pods' NetworkPolicy)
    gitea: DnsLabel

    @model_validator(mode="after")
    def _distinct(self) -> Namespaces:
        if self.build == self.control:
            raise ValueError(
                "build: must differ from control (the builder namespace is the only privileged one)"
            )
        return self


class Images(_Model):
    """The images the build's steps run (``images``), each pinned by digest."""

    # the rootless BuildKit image (moby/buildkit:<v>-rootless), by digest
    buildkit: ImageReference
    # the image of the checkout step (git)
    git: ImageReference
    # fabrique's tools image (the Dockerfile): plan, verify, sign, write back
    tools: ImageReference
    sbom_scanner: ImageReference | None = None  # BuildKit's SBOM generator (build.sbom)

    @model_validator(mode="after")
    def _rootless(self) -> Images:
        tag = ImageRef.parse(self.buildkit).tag or ""
        if not tag.endswith("-rootless"):
            raise ValueError(
                "buildkit: must be a -rootless BuildKit image (moby/buildkit:<v>-rootless)"
            )
        return self


class BuildConfig(_Model):
    """The build Workflow (``build``): what it pushes, its limits and retries."""

    # true: BuildKit pushes an index with provenance, and its digest is deployed
    attestations: bool
    sbom: bool = False
    # true: each build imports and exports a registry cache (<image>:buildcache)
    cache: bool
    # a build Workflow's whole time, retries included
    active_deadline_seconds: Annotated[int, Field(ge=60, le=86400)]
    # how many times a step is tried again when a later attempt may pass
    retries: Annotated[int, Field(ge=0, le=10)]
    # the workspace emptyDir's sizeLimit (the checkout, which the build reads): past it
    # the build pod is evicted
    workspace_size: Annotated[str, AfterValidator(_quantity)]
    # the BuildKit state emptyDir's sizeLimit: past it the build pod is evicted
    state_size: Annotated[str, AfterValidator(_quantity)] = "20Gi"
    # the build container's own writable layer and logs, beside the state volume and the
    # workspace; its ephemeral-storage limit is the three added (see ephemeral_limit)
    scratch_size: Annotated[str, AfterValidator(_quantity)] = "2Gi"

    @property
    def ephemeral_limit(self) -> str:
        """The build container's ephemeral-storage limit, the only one of the build's
        pod. The kubelet evicts a pod whose ephemeral use (its containers' writable layers
        and logs, and its emptyDirs) passes the sum of its containers' limits
        (``podEphemeralStorageLimitEviction``), so the limit holds the pod's two large
        volumes whole, BuildKit's state and the workspace, plus the container's own
        scratch (which the other stages' small files share)."""
        return add_sizes(add_sizes(self.state_size, self.workspace_size), self.scratch_size)


class NetworkConfig(_Model):
    """Timeouts and retries of every call fabrique makes to Gitea, the registry, the API."""

    # one request's timeout
    timeout_seconds: Annotated[float, Field(gt=0, le=300)]
    # attempts of a request that may pass later (unreachable, 429, 5xx)
    attempts: Annotated[int, Field(ge=1, le=10)]
    # the first pause between attempts, doubled each time, jittered
    backoff_seconds: Annotated[float, Field(gt=0, le=60)]

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            attempts=self.attempts,
            base_delay=self.backoff_seconds,
            max_delay=max(self.backoff_seconds, 8 * self.backoff_seconds),
        )

    def http_timeout(self) -> httpx.Timeout:
        import httpx  # only a command that talks HTTP pays for the client

        return httpx.Timeout(self.timeout_seconds, connect=min(5.0, self.timeout_seconds))


class JetStreamConfig(_Model):
    """The EventBus's NATS JetStream (``events.jetstream``)."""

    # None: the version of the JetStream image set in vendor/lock.yaml; either way it must
    # be one the vendored Argo Events controller config lists (checked at render)
    version: Annotated[str, Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+(-[a-z0-9]+)?$")] | None = None
    # the EventBus's NATS servers: 1 or 3
    replicas: Annotated[int, AfterValidator(_one_or_three)]
    # how long the bus keeps an event (e.g. 72h)
    max_age: Annotated[str, Field(pattern=r"^[1-9][0-9]*(m|h)$")]
    # each NATS server's volume
    storage_size: Annotated[str, AfterValidator(_quantity)]
    # its StorageClass (null: the cluster's default)
    storage_class_name: DnsLabel | None = None


class EventsConfig(_Model):
    """The event path: Gitea webhook -> EventSource -> EventBus -> Sensor (``events``)."""

    webhook_secret: SecretKeyRef  # the bearer token Gitea sends, checked by the EventSource
    # the largest webhook payload the EventSource takes, in bytes
    max_payload_size: Annotated[int, Field(ge=1024, le=64 * 1024 * 1024)]
    # the Sensor's rate limit on the Workflows it creates
    triggers_per_second: Annotated[int, Field(ge=1, le=1000)]
    jetstream: JetStreamConfig


class ReconcileConfig(_Model):
    """The safety net (``reconcile``): the CronWorkflow and ``fabrique reconcile``."""

    # the safety net's cron schedule
    schedule: Annotated[str, Field(pattern=r"^\S+ \S+ \S+ \S+ \S+$")]
    # the time zone of the schedule
    timezone: Annotated[str, Field(pattern=r"^[A-Za-z_]+(/[A-Za-z_+-]+)*$")]
    # apps checked at once in a pass
    concurrency: Annotated[int, Field(ge=1, le=64)]
    # a pass that could not start this long after its time is skipped
    starting_deadline_seconds: Annotated[int, Field(ge=10, le=3600)]

    def period_seconds(self) -> int:
        """The period of a ``*/N`` minute schedule, else an hour: a bound (the pass's
        deadline, how far ahead a freeze is seen), not a promise."""
        minute = self.schedule.split()[0]
        if minute.startswith("*/") and minute[2:].isdigit():
            return int(minute[2:]) * 60
        return 3600


# a Prometheus range: a whole number of minutes, hours or days (what a rule's window or
# `for` is written in here)
PromRange = Annotated[str, Field(pattern=r"^[1-9][0-9]*(m|h|d)$")]


def _alert_labels(value: dict[str, str]) -> dict[str, str]:
    """Prometheus label names (``[a-zA-Z_][a-zA-Z0-9_]*``, none of Prometheus' own
    ``__``), ``severity`` left to each alert."""
    for key in value:
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", key) or key.startswith("__"):
            raise ValueError(
                f"label {key!r} must be a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, "
                "not starting with __)"
            )
        if key == "severity":
            raise ValueError("label 'severity': each alert sets its own; remove it")
    return value


class AlertThresholds(_Model):
    """When each of the factory's alerts fires (``monitoring.alerts``); the rules are
    ``fabrique alerts``' (docs/operate/watching.md)."""

    # the span every count below is taken over (builds, lost events, write-backs)
    window: PromRange = "1h"
    # failed builds of one app in the window, none of them a success, that page
    build_failures: Annotated[int, Field(ge=1, le=1000)] = 3
    # builds of any app that ended in Error (the infrastructure's kind) in the window
    build_errors: Annotated[int, Field(ge=1, le=1000)] = 3
    # the share of all builds in the window that did not succeed, that says "all apps"
    failing_share: Annotated[float, Field(gt=0, le=1)] = 0.5
    # builds the safety net submitted or wrote back itself in the window (lost events)
    lost_events: Annotated[int, Field(ge=1, le=10000)] = 3
    # reconcile periods with no pass counted before the safety net is said down
    missed_passes: Annotated[int, Field(ge=2, le=100)] = 3
    # write-backs of one app refused (failed) or rejected (a closed pull request)
    writeback_refusals: Annotated[int, Field(ge=1, le=1000)] = 1
    # verifications failed after a deploy (passes' verdicts) in the window
    verify_failures: Annotated[int, Field(ge=1, le=1000)] = 1
    # how long some app must have been held at every pass before a hold is called forgotten
    held_for: PromRange = "7d"


class MonitoringConfig(_Model):
    """The factory's alerts (``fabrique alerts``; a PrometheusRule with ``prometheusRule``)."""

    # true: render writes the alerts as a PrometheusRule (monitoring/), which needs the
    # Prometheus Operator's CRD; false: `fabrique alerts` prints them as a rules file
    prometheus_rule: bool = False
    # labels of the PrometheusRule object, such as the ones the operator's ruleSelector picks
    rule_labels: Annotated[dict[str, str], AfterValidator(_labels)] = Field(default_factory=dict)
    # labels every alert carries besides its severity (a team, a route)
    labels: Annotated[dict[str, str], AfterValidator(_alert_labels)] = Field(default_factory=dict)
    # where this site's copy of the documentation is served: each alert's runbook_url is
    # <docsUrl>operate/troubleshooting/#<the alert, lowercase>
    docs_url: Annotated[str, Field(pattern=r"^https?://[^\s/]+(/[^\s#?]*)?/$")] = (
        "https://fabrique.invalid/"
    )
    alerts: AlertThresholds = Field(default_factory=AlertThresholds)


def _cidr(value: str) -> str:
    try:
        network = ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise ValueError("must be a CIDR such as 203.0.113.0/24") from None
    if network.prefixlen == 0:
        raise ValueError("must not be a /0: no wide nets (list the destinations)")
    return str(network)


def _fqdn(value: str) -> str:
    if not re.fullmatch(r"(\*\.)?([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z]{2,63}", value):
        raise ValueError("must be a host name such as pypi.org (or *.example.org)")
    return value


Cidr = Annotated[str, AfterValidator(_cidr)]
Fqdn = Annotated[str, AfterValidator(_fqdn)]


# the site's peers an app may name in apps[].egress (netpol.gitea, netpol.registry, the
# API server of netpol.apiServerCidrs and apiServerPorts)
EGRESS_PEERS = ("gitea", "registry", "apiServer")


def allowlist_entry(name: str) -> str:
    """An entry of the build's allowlist as the site holds it: a CIDR normalised."""
    try:
        return str(ipaddress.ip_network(name, strict=False))
    except ValueError:
        return name


class PeerSelector(_Model):
    """What a policy lets pods reach, on one port: pods in-cluster (a namespace and pod
    labels), or what runs outside the pod network by its addresses (``cidrs``): a
    registry outside the cluster, a node-local DNS cache, a service on the nodes' own
    network. A selector matches pods only: a peer that is not a pod is never matched
    by one, and every packet to it is dropped."""

    # the peer's pods' namespace
    namespace: DnsLabel | None = None
    # the labels its pods carry
    pod_labels: Annotated[dict[str, str], Field(min_length=1), AfterValidator(_labels)] | None = (
        None
    )
    # or the peer's addresses, when it is no pod
    cidrs: Annotated[list[Cidr], Field(min_length=1)] | None = None
    # the one port it is reached on
    port: Annotated[int, Field(ge=1, le=65535)]

    @model_validator(mode="after")
    def _pods_or_addresses(self) -> PeerSelector:
        pods = self.namespace is not None or self.pod_labels is not None
        if self.cidrs is not None and pods:
            raise ValueError("give either namespace and podLabels, or cidrs, not both")
        if self.cidrs is None and (self.namespace is None or self.pod_labels is None):
            raise ValueError("needs namespace and podLabels (pods), or cidrs (addresses)")
        return self


class PodSelector(_Model):
    """Pods that reach fabrique's own: a namespace and pod labels."""

    # the pods' namespace
    namespace: DnsLabel
    # the labels they carry
    pod_labels: Annotated[dict[str, str], Field(min_length=1), AfterValidator(_labels)]


class WidestPrefix(_Model):
    """The widest block an allowlist of CIDRs may open (``netpol.widestPrefix``)."""

    # the widest IPv4 block an allowlist may open (/8 by default)
    ipv4: Annotated[int, Field(ge=1, le=32)] = 8
    # the widest IPv6 block (/32 by default)
    ipv6: Annotated[int, Field(ge=1, le=128)] = 32


class NetpolConfig(_Model):
    """The NetworkPolicies (``netpol``). No wide net can be asked for: a /0 is refused,
    and so is any allowlist that opens a block wider than ``widestPrefix``."""

    # kubernetes (NetworkPolicy, CIDRs) or cilium (CiliumNetworkPolicy, host names)
    flavor: Literal["kubernetes", "cilium"]
    widest_prefix: WidestPrefix = Field(default_factory=WidestPrefix)
    # the cluster's DNS: every pod of fabrique's reaches it
    dns: PeerSelector
    gitea: PeerSelector  # namespace: the Gitea namespace
    # the registry, as the build and the safety net reach it
    registry: PeerSelector
    # the API server's own addresses (its endpoints, after kube-proxy's DNAT)
    api_server_cidrs: Annotated[list[Cidr], Field(min_length=1)]
    # the API server's own ports (6443 on most clusters)
    api_server_ports: Annotated[list[Annotated[int, Field(ge=1, le=65535)]], Field(min_length=1)]
    # what the Gitea pods reach in the cluster besides DNS and the EventSource (their
    # database, a cache): their egress policy allows nothing else
    gitea_peers: list[PeerSelector] = Field(default_factory=list)
    # who scrapes the EventSource's and the Sensor's metrics (Argo Events serves them on
    # 7777): the Sensor's count of the events it gave up on is there
    metrics_scrapers: list[PodSelector] = Field(default_factory=list)
    egress_cidrs: list[Cidr]  # TCP 443 for the build, flavor kubernetes
    egress_fqdns: list[Fqdn]  # TCP 443 for the build, flavor cilium


def _object_ref(value: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?", value):
        raise ValueError("must be namespace/name")
    return value


ObjectRef = Annotated[str, AfterValidator(_object_ref)]


class Target(_Model):
    """A cluster (``targets.<name>``): the kube context an operator's gesture must be in
    (``seed``, ``promote``)."""

    # the kube context a gesture on this cluster must be run in
    context: Annotated[str, Field(min_length=1)]
    # fabrique runs in this cluster: the safety net reads it with its own account (the
    # Application of an environment that promotes into a ``promote: auto`` one)
    in_cluster: bool = False
    # where Gitea tells this cluster's Argo CD of each push to a repository holding a
    # write-back target (the hooks ``fabrique seed`` keeps); null: its server's Service,
    # http://argocd-server.<the Applications' namespace>.svc.cluster.local/api/webhook,
    # for an Argo CD in Gitea's cluster that serves plain HTTP there (server.insecure)
    argo_cd_webhook: Annotated[str, AfterValidator(_url)] | None = None


class DerivedSecret(_Model):
    """A Secret made from keys of another (``derivedSecrets[]``), never by hand."""

    app: Annotated[str, AfterValidator(_app_name)] | None = None  # seeded with this app
    # the Secret read, namespace/name
    from_: Annotated[ObjectRef, Field(alias="from")]
    # the Secret written, namespace/name
    to: ObjectRef
    # target key: source key
    keys: Annotated[dict[str, str], Field(min_length=1), AfterValidator(_secret_keys)]


# Gitea's [mirror] MIN_INTERVAL: a migration asking for less answers 500, and leaves
# behind the repository it had just made, an empty mirror with no interval
MIRROR_MIN_MINUTES = 10


def _mirror_interval(value: str) -> str:
    minutes = int(value[:-1]) * (60 if value.endswith("h") else 1)
    if minutes < MIRROR_MIN_MINUTES:
        raise ValueError(
            f"must be at least {MIRROR_MIN_MINUTES}m, Gitea's [mirror] MIN_INTERVAL: a "
            "shorter one fails the migration, and Gitea leaves an empty mirror behind"
        )
    return value


class Mirror(_Model):
    """A Gitea pull mirror of an upstream repository (``mirrors[]``)."""

    # the mirror in Gitea, owner/name
    repo: RepoSlug
    # the upstream repository's URL
    source: Annotated[str, AfterValidator(_mirror_source)]
    # how often Gitea pulls it (at least 10m, Gitea's minimum)
    interval: Annotated[str, Field(pattern=r"^[1-9][0-9]*(m|h)$"), AfterValidator(_mirror_interval)]


class MirrorSync(_Model):
    """The mirror sync CronWorkflow and the Gitea pods' egress (``mirrorSync``)."""

    # the mirror sync's cron schedule
    schedule: Annotated[str, Field(pattern=r"^\S+ \S+ \S+ \S+ \S+$")]
    github_cidrs: Annotated[list[Cidr], Field(min_length=1)]
    # the labels of Gitea's pods (their egress policy)
    gitea_pod_labels: Annotated[dict[str, str], Field(min_length=1), AfterValidator(_labels)]


class ApplicationConfig(_Model):
    """The Argo CD Application of an app, kept in the apps repository (``apps[].application``)."""

    path: RelativePath  # in gitea.appsRepo, such as apps/citation.yaml
    namespace: DnsLabel  # where the app runs
    project: DnsLabel = "default"  # its Argo CD project
    source_path: RelativePath  # the overlay in the code repository


# a path of mapping keys in a Helm values file: image.tag
ValuesPath = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")]


class HelmPaths(_Model):
    """Where a ``helm-values`` target holds the image (``apps[].writeback.helm``), as
    paths of keys: the repository, tag and digest apart (by default ``image.repository``,
    ``image.tag`` and ``image.digest``, as most charts name them), or ``image``: one
    string holding all three (``registry:80/<app>:<sha12>@sha256:…``). Each path is a key
    of its own: one key for two roles, or one path inside another, is refused."""

    # the path of the image's repository (default image.repository)
    repository: ValuesPath | None = None
    # the path of its tag (default image.tag)
    tag: ValuesPath | None = None
    # the path of its digest (default image.digest)
    digest: ValuesPath | None = None
    # or one path holding the whole reference, registry:80/<app>:<sha12>@sha256:…
    image: ValuesPath | None = None
    # an Application's: its helm.valuesObject's keys, or its helm.parameters' entries
    # named by the paths (Argo CD passes those to `helm template --set`)
    via: Literal["valuesObject", "parameters"] = "valuesObject"

    @model_validator(mode="after")
    def _one_form(self) -> HelmPaths:
        apart = [name for name in ("repository", "tag", "digest") if getattr(self, name)]
        if self.image is not None and apart:
            raise ValueError(
                f"image: one string holds the repository, tag and digest; leave "
                f"{', '.join(apart)} out"
            )
        # one key for two roles (`digest: image.tag`) would write one over the other (an
        # image reference nothing can pull); a key over another cannot hold a value
        for (role, path), (other, elsewhere) in combinations(self.leaves().items(), 2):
            if getattr(self, other) is not None and getattr(self, role) is None:
                (role, path), (other, elsewhere) = (other, elsewhere), (role, path)
            theirs = f"the {other}'s path" + (
                " (by default)" if getattr(self, other) is None else ""
            )
            if path == elsewhere:
                raise ValueError(
                    f"{role}: {path} is {theirs} too: one would be written over the other; "
                    "give each its own key"
                )
            if elsewhere.startswith(path + ".") or path.startswith(elsewhere + "."):
                raise ValueError(
                    f"{role}: {path} and {theirs}, {elsewhere}, are one inside the other: a "
                    "key holds a value or keys, not both; give each its own key"
                )
        return self

    def leaves(self) -> dict[str, str]:
        """Each path written, by what it holds: repository, tag, digest, or image."""
        if self.image is not None:
            return {"image": self.image}
        return {
            "repository": self.repository or "image.repository",
            "tag": self.tag or "image.tag",
            "digest": self.digest or "image.digest",
        }


WriteBackMode = Literal["commit", "pull-request"]
# Gitea's merge styles (MergePullRequestForm.Do), as the site may choose one
MergeStyle = Literal["merge", "rebase", "rebase-merge", "squash", "fast-forward-only"]


class WriteBackTarget(_Model):
    """The file an app's digest is written into (``apps[].writeback``)."""

    # the file's kind: kustomize-images, argocd-application or helm-values
    kind: Literal["kustomize-images", "argocd-application", "helm-values"] = "kustomize-images"
    # the repository holding it, owner/name
    repo: RepoSlug
    # its path in the repository
    path: RelativePath
    branch: Annotated[str, AfterValidator(_branch)] | None = None  # default: gitea.branch
    create: bool = False  # create the file if it is missing (kustomize-images only)
    source_index: Annotated[int, Field(ge=0)] | None = None  # which spec.sources[] entry
    # where the image is in the values: a helm-values file, or (given) an Application's
    # helm.valuesObject
    helm: HelmPaths | None = None
    # commit: straight into the branch; pull-request: through a pull request into it
    # (default: writeback.mode)
    mode: WriteBackMode | None = None

    @model_validator(mode="after")
    def _helm_paths(self) -> WriteBackTarget:
        if self.helm is not None and self.kind == "kustomize-images":
            raise ValueError(
                "helm: for kind helm-values, or argocd-application (its helm.valuesObject); "
                "this target is kustomize-images"
            )
        if (
            self.helm is not None
            and self.helm.via != "valuesObject"
            and self.kind != ("argocd-application")
        ):
            raise ValueError(
                f"helm.via: {self.helm.via} is an Application's; a values file has keys"
            )
        return self

    @property
    def helm_paths(self) -> HelmPaths | None:
        """Where a helm-values target (or an Application's helm.valuesObject) holds the
        image: the default paths unless given; None for the kustomize forms."""
        return (self.helm or HelmPaths()) if self.kind == "helm-values" else self.helm


class Person(_Model):
    """Who a write-back commit is authored by (``writeback.author``)."""

    # the name a write-back commit is authored by
    name: Annotated[str, Field(min_length=1, pattern=r"^[^<>\n]+$")]
    # its email
    email: Annotated[str, Field(pattern=r"^[^@\s<>]+@[^@\s<>]+$")]


class PullRequests(_Model):
    """How a ``pull-request`` write-back proposes (``writeback.pullRequest``): one branch
    per app and target, ``<branchPrefix><app>`` (``<branchPrefix><app>.<env>`` for a later
    environment), one open pull request from it into the target's branch."""

    branch_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9][-._/A-Za-z0-9]*$")] = "fabrique/"
    # ask Gitea to merge once the branch's required checks pass (merge_when_checks_succeed)
    auto_merge: bool = False
    merge_style: MergeStyle = "merge"

    @model_validator(mode="after")
    def _prefix_is_a_branch(self) -> PullRequests:
        _branch(self.branch_prefix + "app")
        return self


def _seconds(value: str) -> str:
    seconds_of(value)
    return value


def seconds_of(text: str) -> float:
    """``2s``, ``500ms``, ``5m``: seconds; ValueError, saying the form, otherwise."""
    found = re.fullmatch(r"(\d+)(ms|s|m)", text)
    if found is None:
        raise ValueError(f"{text!r}: a wait is a whole number of ms, s or m, as 2s or 5m")
    return int(found[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[found[2]]


class Batch(_Model):
    """How the write-backs of one push meet (``writeback.batch``): the builds of a push
    that write into one repository and branch land as one commit, written by the push's
    own Workflow once every build of it has ended, and never later than ``maxWait`` after
    the first ended; builds still running then land together, ``window`` after the last
    of them ends unless another ends meanwhile."""

    # false: each build writes its own commit, as a single-app push does
    enabled: bool = True
    window: Annotated[str, Field(max_length=12), AfterValidator(_seconds)] = "2s"
    max_wait: Annotated[str, Field(max_length=12), AfterValidator(_seconds)] = "5m"

    @model_validator(mode="after")
    def _window_within(self) -> Batch:
        if seconds_of(self.window) > seconds_of(self.max_wait):
            raise ValueError(f"window: {self.window} is longer than maxWait ({self.max_wait})")
        return self


class CommitSigning(_Model):
    """Signed write-back commits (``writeback.signing``): an SSH private key (no
    passphrase) in a Secret, with which every commit the git transport makes is signed."""

    key_secret: SecretKeyRef


class WriteBackConfig(_Model):
    """How digests are written into Git (``writeback``), for every app of the site."""

    transport: Literal["gitea", "git"]
    git_url: Annotated[str, AfterValidator(_git_url)] | None = None
    author: Person
    attempts: Annotated[int, Field(ge=1, le=100)]
    signing: CommitSigning | None = None
    mode: WriteBackMode = "commit"  # each target's, unless it says (apps[].writeback.mode)
    pull_request: PullRequests = Field(default_factory=PullRequests)
    batch: Batch = Field(default_factory=Batch)

    @model_validator(mode="after")
    def _signed_over_git(self) -> WriteBackConfig:
        if self.signing is not None and self.transport != "git":
            raise ValueError(
                "signing: signs the commits the git transport makes (transport: git); "
                "the Contents API's commits are Gitea's own: sign them with Gitea's "
                "[repository.signing] (docs/operate/write-back.md, Signed write-back commits)"
            )
        return self

    def mode_of(self, target: WriteBackTarget) -> WriteBackMode:
        return target.mode or self.mode

    def repo_url(self, site_url: str, repo: str) -> str:
        """Where the git transport fetches ``repo``: ``<gitUrl or gitea.url>/<repo>.git``."""
        return f"{(self.git_url or site_url).rstrip('/')}/{repo}.git"


PUBLIC_KEY_RE = re.compile(
    r"-----BEGIN PUBLIC KEY-----\n[A-Za-z0-9+/=\n]+-----END PUBLIC KEY-----\n?"
)


def _readable_public_key(pem: str) -> None:
    """ValueError unless ``pem`` holds a key the write-back can verify with: the PEM shape
    alone lets a truncated key through, which would then refuse every digest."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

    try:
        key = serialization.load_pem_public_key(pem.strip().encode() + b"\n")
    except ValueError:
        raise ValueError(
            "publicKey: not a readable PEM public key (paste cosign.pub whole, as "
            "`cosign generate-key-pair` wrote it)"
        ) from None
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey):
        raise ValueError("publicKey: must be an ECDSA, RSA or Ed25519 key")


class SigningConfig(_Model):
    """Signing (``signing``): the build signs the verified digest with cosign, the key from
    a Secret (no keyless flow: the factory is air-gapped); every write-back verifies it."""

    key_secret: SecretKeyRef | None = None
    password_key: Annotated[str, Field(pattern=r"^[-._a-zA-Z0-9]+$")] | None = None
    public_key: str | None = None

    @property
    def enabled(self) -> bool:
        return self.key_secret is not None

    @model_validator(mode="after")
    def _key_pair(self) -> SigningConfig:
        if self.key_secret is not None and self.public_key is None:
            raise ValueError(
                "publicKey: required with keySecret (the write-back verifies against it)"
            )
        if self.public_key is not None and not PUBLIC_KEY_RE.fullmatch(
            self.public_key.strip() + "\n"
        ):
            raise ValueError("publicKey: must be a PEM public key (-----BEGIN PUBLIC KEY-----)")
        if self.public_key is not None:
            _readable_public_key(self.public_key)
        if self.public_key is not None and self.key_secret is None:
            raise ValueError("keySecret: required with publicKey (nothing would sign)")
        return self


def _span(value: str) -> str:
    parse_span(value)
    return value


class VerifyConfig(_Model):
    """What verifies a digest written into an environment, and what a failure does
    (``verify``, and ``environments[].verify`` field by field over it)."""

    # from the first look, how long it has to be Synced, Healthy and on the digest
    timeout: Annotated[str, Field(min_length=2, max_length=20), AfterValidator(_duration)] = "10m"
    # how long its pods then stay Ready with no restart (0m: none)
    soak: Annotated[str, Field(min_length=2, max_length=20), AfterValidator(_span)] = "0m"
    # commit statuses on the built commit that must be success (a test job's)
    checks: list[
        Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f]+$")]
    ] = Field(default_factory=list)
    # rollback (the last verified digest, held), hold, or none; default: rollback after
    # the first environment, hold in the first
    on_failure: Literal["rollback", "hold", "none"] | None = None

    def verdict_within(self) -> timedelta:
        """How long a verdict may take from the first look: the timeout, then the soak."""
        return parse_duration(self.timeout) + parse_span(self.soak)

    def over(self, own: VerifyConfig | None) -> VerifyConfig:
        """This, with the fields ``own`` sets."""
        if own is None:
            return self
        return self.model_copy(update={f: getattr(own, f) for f in own.model_fields_set})


def _duration(value: str) -> str:
    parse_duration(value)
    return value


def _time_zone(value: str) -> str:
    zone(value)
    return value


class FreezeWindow(_Model):
    """A window during which nothing is written back or promoted (``freeze[]`` of the
    site or of an environment): it opens at ``start`` and at each occurrence of
    ``rrule`` after it, for ``duration``. A rollback is still written in one."""

    # when the first window opens, with its offset (2026-12-24T18:00:00+01:00, or Z)
    start: AwareDatetime
    # how it recurs, an RFC 5545 RRULE (FREQ=WEEKLY;BYDAY=FR); none: once
    rrule: Annotated[str, Field(min_length=6, max_length=500)] | None = None
    # how long each window lasts: 30m, 64h, 3d, 1d12h
    duration: Annotated[str, Field(min_length=2, max_length=20), AfterValidator(_duration)]
    # the IANA time zone the recurrence keeps its clock time in across daylight saving
    # (Europe/Paris); none: start's offset
    timezone: Annotated[str, Field(max_length=64), AfterValidator(_time_zone)] | None = None
    # why, in the statuses and logs (one line)
    reason: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f]+$")]

    @model_validator(mode="after")
    def _rule(self) -> FreezeWindow:
        if self.rrule is not None:
            try:
                recurrence(self.rrule, self.start, self.timezone)
            except ValueError as refused:
                raise ValueError(f"rrule: {refused}") from None
        return self

    def window(self) -> Window:
        return Window(
            self.start, parse_duration(self.duration), self.reason, self.rrule, self.timezone
        )


class Environment(_Model):
    """One stage of an app's way to production (``apps[].environments[]``), in promotion
    order. The first is where the build writes back (its target is ``apps[].writeback``);
    each next one is written by ``fabrique promote`` alone, with the digest that passed
    the one before: never a rebuild."""

    # the environment's name (a DNS label)
    name: DnsLabel
    # a key of ``targets``: the kube context of the cluster whose Argo CD deploys it
    target: DnsLabel
    # its Argo CD Application there, namespace/name (default argocd/<app>)
    application: ObjectRef | None = None
    # the write-back target; the first environment's is apps[].writeback
    writeback: WriteBackTarget | None = None
    # what passing here means beyond Synced and Healthy: commit statuses on the built
    # commit that must be ``success`` before its digest goes further (bench/scenario-34)
    checks: list[
        Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[^\x00-\x1f]+$")]
    ] = Field(default_factory=list)
    # auto: the safety net promotes into it what passed in the one before
    promote: Literal["manual", "auto"] = "manual"
    # where the app runs in it (default apps[].application.namespace): two environments
    # in one cluster run in two namespaces
    namespace: DnsLabel | None = None
    # windows during which nothing is written back or promoted into it (the site's
    # freeze[] too)
    freeze: list[FreezeWindow] = Field(default_factory=list)
    # its verification after a deploy, field by field over the site's verify
    verify: VerifyConfig | None = None

    def application_ref(self, app: str) -> tuple[str, str]:
        namespace, _, name = (self.application or f"argocd/{app}").partition("/")
        return namespace, name


@dataclass(frozen=True)
class Deployment:
    """An Argo CD Application that deploys an app (or one environment of it): its file
    in the apps repository, its namespace and name, its project, the overlay it deploys,
    the namespace it deploys into, and where the overlay is read: the repository and the
    branch (None: the code repository, the site's branch)."""

    path: str
    namespace: str
    name: str
    project: str
    source_path: str
    destination: str
    repo: str | None = None
    branch: str | None = None


class AppConfig(_Model):
    # the app's name (a DNS label): in Workflow names, labels, statuses
    name: Annotated[str, AfterValidator(_app_name)]
    # its image's repository in the registry
    image: Annotated[str, AfterValidator(_repository)]
    # its build context, a folder of the code repository: a change there builds it
    context: RelativePath
    # its Dockerfile, relative to the context
    dockerfile: RelativePath = "Dockerfile"
    # build arguments, passed to BuildKit as is (never secrets)
    build_args: Annotated[dict[str, str], AfterValidator(_build_args)] = Field(default_factory=dict)
    # where its digest is written
    writeback: WriteBackTarget
    # the Argo CD Application that fabrique seed keeps for it
    application: ApplicationConfig | None = None
    # its environments in promotion order (bench, then prod)
    environments: list[Environment] = Field(default_factory=list)
    # what its pods may reach outside the cluster besides DNS, by name: a peer of the
    # site (``EGRESS_PEERS``) or an entry of the build's allowlist (netpol.egressCidrs,
    # named by its CIDR; netpol.egressFqdns, by host name, with flavor cilium)
    egress: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _promotion_order(self) -> AppConfig:
        seen: set[str] = set()
        for index, env in enumerate(self.environments):
            at = f"environments[{index}]"
            if env.name in seen:
                raise ValueError(f"{at}.name: duplicate environment {env.name!r}")
            seen.add(env.name)
            if index == 0:
                if env.writeback is not None:
                    raise ValueError(
                        f"{at}.writeback: the first environment's target is the app's "
                        "writeback (the build writes there); leave it out"
                    )
                if env.promote == "auto":
                    raise ValueError(f"{at}.promote: nothing comes before the first environment")
                continue
            if env.writeback is None:
                raise ValueError(f"{at}.writeback: required (where promote writes {env.name})")
        return self

    def environment(
        self, name: str, option: str = "--to"
    ) -> tuple[Environment, Environment | None]:
        """The environment ``name`` and the one before it (None for the first)."""
        for index, env in enumerate(self.environments):
            if env.name == name:
                return env, self.environments[index - 1] if index else None
        known = ", ".join(env.name for env in self.environments) or "none"
        raise InputError(f"{option} {name!r}: not an environment of {self.name} (its: {known})")

    def deployment(self, env: Environment | None = None) -> Deployment | None:
        """The Argo CD Application that ``fabrique seed`` keeps for ``env`` (None: the
        app's, without environments) in the apps repository; None when the site names
        none (``apps[].application``) or the environment's target is an Application
        already (kind argocd-application). A later environment's deploys its target's
        folder, where promote writes it: that repository, that branch."""
        config = self.application
        if config is None:
            return None
        first = env is None or env == self.environments[0]
        namespace, name = env.application_ref(self.name) if env else ("argocd", self.name)
        destination = (env.namespace if env else None) or config.namespace
        if first:
            return Deployment(config.path, namespace, name, config.project,
                              config.source_path, destination)  # fmt: skip
        assert env is not None and env.writeback is not None
        if env.writeback.kind != "kustomize-images":
            return None
        path = PurePosixPath(config.path)
        return Deployment(
            str(path.with_name(f"{path.stem}-{env.name}{path.suffix}")),
            *(namespace, name, config.project),
            str(PurePosixPath(env.writeback.path).parent),
            destination,
            env.writeback.repo,
            env.writeback.branch,
        )

    def auto_promotions(self) -> list[tuple[Environment, Environment]]:
        """Each ``promote: auto`` environment, with the one before it."""
        return [
            (env, self.environments[index - 1])
            for index, env in enumerate(self.environments)
            if index and env.promote == "auto"
        ]

    def at(self, env: Environment) -> AppConfig:
        """This app as written in ``env``: its target is the environment's."""
        if env.writeback is None:
            return self
        return self.model_copy(update={"writeback": env.writeback})


# the apps an error names, of a site that does not hold the one asked for: a line to read
KNOWN_APPS_SHOWN = 10


class Site(_Model):
    gitea: GiteaConfig
    argo_server: ArgoServerConfig = Field(default_factory=ArgoServerConfig)
    registry: RegistryConfig
    namespaces: Namespaces
    images: Images
    build: BuildConfig
    network: NetworkConfig
    writeback: WriteBackConfig
    signing: SigningConfig = Field(default_factory=SigningConfig)
    events: EventsConfig
    reconcile: ReconcileConfig
    netpol: NetpolConfig
    targets: dict[Annotated[str, AfterValidator(_dns_label)], Target]
    derived_secrets: list[DerivedSecret] = Field(default_factory=list)
    # windows during which nothing is written back or promoted into any environment
    freeze: list[FreezeWindow] = Field(default_factory=list)
    # how every environment verifies a digest after a deploy, unless it says otherwise
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    mirrors: list[Mirror] = Field(default_factory=list)
    mirror_sync: MirrorSync
    # what the platform team is paged for (docs/operate/watching.md)
    monitoring: MonitoringConfig = Field(default_factory=MonitoringConfig)
    # the apps fabrique builds, at least one
    apps: Annotated[list[AppConfig], Field(min_length=1)]

    @model_validator(mode="after")
    def _push_branches(self) -> Site:
        """A push's proposal branch (``<branchPrefix>push.<commit12>.<base>``) must be a
        name Gitea takes: at most 100 characters (its new_branch)."""
        prefix = self.writeback.pull_request.branch_prefix
        for index, app in enumerate(self.apps):
            target = app.writeback
            if self.writeback.mode_of(target) != "pull-request":
                continue
            base = self.branch_of(target)
            branch = push_branch(prefix, "0" * 40, base)
            if len(branch) > MAX_BRANCH_LEN:
                field = f"apps[{index}].writeback.branch" if target.branch else "gitea.branch"
                raise ValueError(
                    f"{field}: {base!r} is too long for a push's proposal branch "
                    f"({len(branch)} characters; Gitea takes {MAX_BRANCH_LEN} at most); "
                    "shorten it or writeback.pullRequest.branchPrefix"
                )
        return self

    @model_validator(mode="after")
    def _creatable_targets(self) -> Site:
        for index, app in enumerate(self.apps):
            if app.writeback.create and app.writeback.kind != "kustomize-images":
                raise ValueError(
                    f"apps[{index}].writeback.create: only a kustomize-images target can be "
                    "created; an Argo CD Application needs a source and a destination, a "
                    "values file the chart's other values"
                )
        return self

    @model_validator(mode="after")
    def _narrow_allowlists(self) -> Site:
        bound = self.netpol.widest_prefix
        peers = {
            "netpol.dns": self.netpol.dns,
            "netpol.gitea": self.netpol.gitea,
            "netpol.registry": self.netpol.registry,
            **{f"netpol.giteaPeers[{i}]": p for i, p in enumerate(self.netpol.gitea_peers)},
        }
        for field, cidrs in (
            ("netpol.apiServerCidrs", self.netpol.api_server_cidrs),
            ("netpol.egressCidrs", self.netpol.egress_cidrs),
            ("mirrorSync.githubCidrs", self.mirror_sync.github_cidrs),
            *((f"{name}.cidrs", peer.cidrs) for name, peer in peers.items() if peer.cidrs),
        ):
            wide = too_wide(cidrs, bound.ipv4, bound.ipv6)
            if wide:
                index, why = wide
                raise ValueError(f"{field}{'' if index is None else f'[{index}]'}: {why}")
        return self

    @model_validator(mode="after")
    def _named_egress(self) -> Site:
        cilium = self.netpol.flavor == "cilium"
        flavor_list = "egressFqdns" if cilium else "egressCidrs"
        listed = self.netpol.egress_fqdns if cilium else self.netpol.egress_cidrs
        for index, app in enumerate(self.apps):
            for position, name in enumerate(app.egress):
                if name in EGRESS_PEERS or allowlist_entry(name) in listed:
                    continue
                raise ValueError(
                    f"apps[{index}].egress[{position}]: {name!r} names nothing the site lists: "
                    f"a peer ({', '.join(EGRESS_PEERS)}) or an entry of netpol.{flavor_list} "
                    f"({', '.join(listed) or 'none'})"
                )
        return self

    @model_validator(mode="after")
    def _environment_targets(self) -> Site:
        for index, app in enumerate(self.apps):
            # each environment's file, its branch as written to (a branch left out is the
            # site's): two environments on one file would deploy each other's digests
            files: dict[tuple[str, str, str], str] = {}
            for position, env in enumerate(app.environments):
                target = app.at(env).writeback
                file = (target.repo, self.branch_of(target), target.path)
                if file in files:
                    build = (
                        ", where the build writes"
                        if files[file] == app.environments[0].name
                        else ""
                    )
                    raise ValueError(
                        f"apps[{index}].environments[{position}].writeback: {target.repo}:"
                        f"{target.path} is already another environment's target "
                        f"({files[file]}'s on branch {file[1]}{build})"
                    )
                files[file] = env.name
                if env.target not in self.targets:
                    known = ", ".join(self.targets) or "none"
                    raise ValueError(
                        f"apps[{index}].environments[{position}].target: {env.target!r} is "
                        f"not a key of targets (its: {known})"
                    )
                context = self.targets[env.target].context
                for other in app.environments[:position]:
                    if self.targets[other.target].context != context:
                        continue
                    if other.application_ref(app.name) == env.application_ref(app.name):
                        raise ValueError(
                            f"apps[{index}].environments[{position}].application: "
                            f"{'/'.join(env.application_ref(app.name))} is already "
                            f"{other.name}'s, in the same cluster (context {context}): name another"
                        )
                    mine, theirs = app.deployment(env), app.deployment(other)
                    if mine and theirs and mine.destination == theirs.destination:
                        raise ValueError(
                            f"apps[{index}].environments[{position}].namespace: "
                            f"{mine.destination} is already where {other.name} runs, in the "
                            f"same cluster (context {context}): name another"
                        )
                previous = app.environments[position - 1] if position else None
                if (
                    env.promote == "auto"
                    and previous is not None
                    and not self.targets[previous.target].in_cluster
                ):
                    # said, not ignored: a promotion the site asks for must be one the
                    # safety net can check
                    raise ValueError(
                        f"apps[{index}].environments[{position}].promote: auto needs "
                        f"targets.{previous.target}.inCluster: true: the safety net reads "
                        f"{previous.name}'s Application in the cluster it runs in (elsewhere, "
                        "promote with `fabrique promote`)"
                    )
        return self

    @model_validator(mode="after")
    def _cilium_dns_pods(self) -> Site:
        if self.netpol.flavor == "cilium" and self.netpol.dns.cidrs is not None:
            raise ValueError(
                "netpol.dns.cidrs: flavor cilium learns the build's host names through its "
                "DNS proxy, which needs the DNS pods: give namespace and podLabels"
            )
        return self

    @model_validator(mode="after")
    def _sbom(self) -> Site:
        if self.build.sbom and not self.build.attestations:
            raise ValueError(
                "build.sbom: needs build.attestations: true (the SBOM is an attestation)"
            )
        if self.build.sbom and self.images.sbom_scanner is None:
            raise ValueError(
                "images.sbomScanner: required with build.sbom (the factory is air-gapped: "
                "mirror docker/buildkit-syft-scanner and name it here)"
            )
        return self

    @model_validator(mode="after")
    def _unique_apps(self) -> Site:
        seen_names: set[str] = set()
        seen_images: dict[str, str] = {}
        for index, app in enumerate(self.apps):
            if app.name in seen_names:
                raise ValueError(f"apps[{index}].name: duplicate app name {app.name!r}")
            if app.image in seen_images:
                raise ValueError(
                    f"apps[{index}].image: {app.image!r} is already the image of app "
                    f"{seen_images[app.image]!r}; two apps would overwrite each other's tags"
                )
            seen_names.add(app.name)
            seen_images[app.image] = app.name
        return self

    def app(self, name: str) -> AppConfig:
        found = self._apps_by_name().get(name)
        if found is not None:
            return found
        known = ", ".join(app.name for app in self.apps[:KNOWN_APPS_SHOWN])
        if len(self.apps) > KNOWN_APPS_SHOWN:
            known += f" and {len(self.apps) - KNOWN_APPS_SHOWN} more"
        raise InputError(f"app {name!r}: not in the site config (known apps: {known})")

    def _apps_by_name(self) -> dict[str, AppConfig]:
        """The apps by name, made once a Site: a pass looks up every app. Kept beside
        the list it indexes (no field: out of equality and dumps), and made again for a
        copy that has another list (``model_copy(update=...)`` copies it too)."""
        indexed, index = self.__dict__.get("_apps_index", (None, {}))
        if indexed is not self.apps:
            index = {app.name: app for app in self.apps}
            self.__dict__["_apps_index"] = (self.apps, index)
        return index

    def frozen(
        self, app: AppConfig, env: Environment | None, moment: datetime | None = None
    ) -> Frozen | None:
        """The freeze ``app``'s environment ``env`` (None: where the build writes, its
        first) lies in at ``moment`` (default now): the site's windows and the
        environment's."""
        windows = self._windows(app, env)
        return frozen_at(windows, moment or datetime.now(UTC)) if windows else None

    def _windows(self, app: AppConfig, env: Environment | None) -> list[Window]:
        """The site's freeze windows and ``env``'s (None: the first environment's)."""
        env = env if env is not None or not app.environments else app.environments[0]
        return [w.window() for w in (*self.freeze, *(env.freeze if env else ()))]

    def frozen_soon(
        self, app: AppConfig, env: Environment | None, moment: datetime | None = None
    ) -> Frozen | None:
        """The freeze ``env`` is in at ``moment``, or the first that opens before the
        next pass (``reconcile.schedule``'s period): what a merge Gitea is to make on
        its own must not fall into."""
        moment = moment or datetime.now(UTC)
        windows = self._windows(app, env)
        if not windows:
            return None
        found = frozen_at(windows, moment)
        if found is not None:
            return found
        ahead = moment + timedelta(seconds=self.reconcile.period_seconds())
        opening = sorted(start for w in windows for start in w.opened(moment, ahead))
        return frozen_at(windows, opening[0]) if opening else None

    def built_in_cluster(self) -> list[tuple[AppConfig, Environment]]:
        """Every app's first environment whose Argo CD runs in fabrique's cluster
        (``targets.<name>.inCluster``): what a build's Workflow looks at after its
        write-back (its ``verify-deploy`` step)."""
        return [
            (app, app.environments[0])
            for app in self.apps
            if app.environments and self.targets[app.environments[0].target].in_cluster
        ]

    def promoted_in_cluster(self) -> list[tuple[AppConfig, Environment]]:
        """Every environment after an app's first whose Argo CD runs in fabrique's
        cluster (``targets.<name>.inCluster``): what a promotion's Workflow looks at
        (``fabrique-verify``)."""
        return [
            (app, env)
            for app in self.apps
            for env in app.environments[1:]
            if self.targets[env.target].in_cluster
        ]

    def grouped_in_cluster(self) -> list[tuple[AppConfig, Environment]]:
        """Every app's first environment a push's write-back may write into
        (``writeback.batch``) whose Argo CD runs in fabrique's cluster: what the push's
        Workflow starts a ``fabrique-verify`` look at, in place of the build's own."""
        return self.built_in_cluster() if self.writeback.batch.enabled else []

    def looked_by_workflow(self) -> list[tuple[AppConfig, Environment]]:
        """What a ``fabrique-verify`` Workflow may look at: the environments a promotion
        writes into, and those a push's write-back writes into."""
        return self.grouped_in_cluster() + self.promoted_in_cluster()

    def verify_of(self, app: AppConfig, env: Environment) -> VerifyConfig:
        """How ``env`` of ``app`` verifies: its own fields over the site's, and what a
        failure does there when neither says (rollback, hold in the first)."""
        found = self.verify.over(env.verify)
        if found.on_failure is None:
            first = bool(app.environments) and app.environments[0].name == env.name
            found = found.model_copy(update={"on_failure": "hold" if first else "rollback"})
        return found

    def branch_of(self, target: WriteBackTarget) -> str:
        """The branch ``target`` is written to: its own, else the site's."""
        return target.branch or self.gitea.branch

    def image_ref(self, app: AppConfig, tag: str) -> str:
        """``<registry>/<image>:<tag>``: where the build pushes."""
        return f"{self.registry.host}/{app.image}:{tag}"

    def to_values(self) -> dict[str, Any]:
        """The config as a values document (camelCase), as a values file would say it."""
        return self.model_dump(mode="json", by_alias=True)


# ---------------------------------------------------------------------------- loading


def default_values() -> dict[str, Any]:
    resource = resources.files(__package__).joinpath("site.default.yaml")
    data = _parse_yaml(Path(str(resource)), resource.read_text("utf-8"))
    assert isinstance(data, dict)
    return data


def load_site(values: str | Path | None = None, env: Mapping[str, str] | None = None) -> Site:
    """Build the Site from defaults, a values file and ``FABRIQUE_*`` variables.

    ``values`` falls back to ``$FABRIQUE_VALUES``; ``env`` defaults to ``os.environ``.
    """
    env = os.environ if env is None else env
    data = default_values()
    values = values or env.get("FABRIQUE_VALUES") or None
    if values is not None:
        data = merge(data, read_values_file(Path(values)))
    unknown = []  # every bad variable is named, not only the first
    for name in sorted(env):
        if name.startswith(ENV_PREFIX) and name not in ENV_RESERVED:
            try:
                apply_env_override(data, name, env[name])
            except ConfigError as err:
                unknown.append(str(err))
    if unknown:
        raise ConfigError("; ".join(unknown))
    return parse_site(data)


def parse_site(data: Any) -> Site:
    try:
        return Site.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None


def read_values_file(path: Path) -> dict[str, Any]:
    """A values file as a mapping, the apps of the files its ``appsFrom`` names added to
    its own ``apps`` (``continued_apps``)."""
    data = _read_yaml(path)
    if data is None:
        # an empty file is a mistake (a wrong path, a truncated copy), not "the defaults"
        raise ConfigError(f"values file {path}: is empty; give at least one setting")
    if not isinstance(data, dict):
        raise ConfigError(f"values file {path}: must be a mapping at the top level")
    if APPS_FROM in data:
        data = dict(data)
        data["apps"] = continued_apps(path, data.get("apps"), data.pop(APPS_FROM))
    return data


# A values file may go on in other files: ``appsFrom`` lists them, beside it, each a YAML
# list of apps that continue its ``apps`` in order. ``fabrique render`` writes the site
# so when it is too large for one ConfigMap (``fabrique.render.site_configmaps``), each
# file with its sha256, so that a pod that reads files of two renders stops and says so.
APPS_FROM = "appsFrom"


def shard_digest(text: str) -> str:
    """The sha256 a values file's ``appsFrom`` gives for one of its files."""
    return hashlib.sha256(text.encode()).hexdigest()


def continued_apps(path: Path, apps: Any, listed: Any) -> list[Any]:
    """``apps`` (the values file's own, if any) followed by the apps of every file that
    ``listed`` (its ``appsFrom``) names, in order: ``[{file: NAME, sha256: HEX}, …]``,
    each NAME relative to the values file's folder, sha256 optional."""
    where = f"values file {path}: {APPS_FROM}"
    if not isinstance(listed, list) or not all(
        isinstance(entry, dict)
        and isinstance(entry.get("file"), str)
        and entry.keys() <= {"file", "sha256"}
        for entry in listed
    ):
        raise ConfigError(
            f"{where}: must be a list of {{file: NAME, sha256: HEX}}, NAME a file beside it"
        )
    if apps is not None and not isinstance(apps, list):
        raise ConfigError(f"values file {path}: apps: must be a list with {APPS_FROM}")
    found = list(apps or [])
    for index, entry in enumerate(listed):
        name = entry["file"]
        if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts:
            raise ConfigError(f"{where}[{index}].file: {name!r} must be a file beside it")
        shard = path.parent / name
        text = _read_text(shard)
        expected = entry.get("sha256")
        if expected is not None and shard_digest(text) != expected:
            raise ConfigError(
                f"values file {shard}: not the file {path.name} names (its sha256 differs): "
                "they come from two renders of the site; render again, or wait for the "
                "site being applied and retry"
            )
        more = _parse_yaml(shard, text)
        if not isinstance(more, list):
            raise ConfigError(
                f"values file {shard}: must be a list of apps, which continue "
                f"{path.name}'s apps ({APPS_FROM}[{index}])"
            )
        found += more
    return found


def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"values file {path}: not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"values file {path}: cannot be read ({exc.__class__.__name__})"
        ) from None


def _parse_yaml(path: Path, text: str) -> Any:
    try:
        return _parse_json(text)
    except _NotPlainJson:
        pass
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no object tags
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"values file {path}:{where}: {problem}") from None


def _read_yaml(path: Path) -> Any:
    return _parse_yaml(path, _read_text(path))


class _NotPlainJson(Exception):
    """Not JSON that means what the YAML it also is means: read it as YAML."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        raise _NotPlainJson  # the YAML loader names the key and its line
    return mapping


# the floats YAML 1.1 reads as floats (PyYAML's resolver): 1e-05, which JSON writes, is
# a string to it
_YAML_FLOAT = re.compile(r"-?(?:0|[1-9][0-9]*)\.[0-9]*(?:[eE][-+][0-9]+)?")


def _yaml_float(literal: str) -> float:
    if not _YAML_FLOAT.fullmatch(literal):
        raise _NotPlainJson
    return float(literal)


def _not_json(literal: str) -> Any:
    raise _NotPlainJson  # NaN, Infinity: Python's, not JSON


# what YAML takes for a line break (U+0085, U+2028, U+2029) or refuses raw (DEL, the C1
# controls, non-characters, lone surrogates), and a byte-order mark: JSON escapes them
# where a YAML reader reads it too
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\ud800-\udfff]")


def json_line(value: Any) -> str:
    """``value`` as one line of JSON, which the loader parses in C and a YAML reader
    (a person's, kubectl's) reads as the same values."""
    text = json.dumps(value, ensure_ascii=False)
    return _YAML_UNSAFE.sub(lambda char: f"\\u{ord(char[0]):04x}", text)


def _parse_json(text: str) -> Any:
    """``text`` parsed as JSON, which is YAML too, in C (``fabrique render`` writes the
    site's files so, ``fabrique.site.files.site_files``): 10 000 apps in 0.1 s, where the
    YAML loader's Python half takes 3. _NotPlainJson for anything else, and for JSON the
    YAML reading would give another meaning or an error (a key given twice)."""
    try:
        return json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_float=_yaml_float,
            parse_constant=_not_json,
        )
    except json.JSONDecodeError:
        raise _NotPlainJson from None


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """A SafeLoader (libyaml's where it is there: a values file of 1 000 apps parses in
    0.1 s, not 0.9) that refuses a key given twice in one mapping: PyYAML would keep the
    last one silently, and half of what the user wrote would be ignored. A key that is a
    mapping or a list (``? {owner: data} : team``, valid YAML) names no setting: refused
    by its line, before it is hashed."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    "a key that is a mapping or a list; a setting's name is a string",
                    key_node.start_mark,
                )
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# the two forms of a peer (netpol.dns, .gitea, .registry, .giteaPeers[]): pods, or
# addresses. A values file that gives one form replaces the default's other form (its
# port stays the default's unless given).
PEER_FORMS = ({"namespace", "podLabels"}, {"cidrs"})


def merge(base: Any, override: Any) -> Any:
    """Deep-merge mappings; anything else in ``override`` replaces ``base`` whole, and
    a peer given in the other form replaces ``base``'s form (``PEER_FORMS``)."""
    if isinstance(base, dict) and isinstance(override, dict):
        for form, other in (PEER_FORMS, PEER_FORMS[::-1]):
            if form & base.keys() and other & override.keys() and not form & override.keys():
                base = {key: value for key, value in base.items() if key not in form}
        merged = dict(base)
        for key, value in override.items():
            merged[key] = merge(base.get(key), value) if key in base else value
        return merged
    return override


def _field_aliases(model: type[BaseModel]) -> dict[str, str]:
    """snake_case field name -> camelCase alias."""
    return {name: (info.alias or name) for name, info in model.model_fields.items()}


def apply_env_override(data: dict[str, Any], name: str, raw: str) -> None:
    """Apply ``FABRIQUE_A__B__0__C=value`` to ``data`` in place.

    The value stays a string (pydantic turns ``false`` or ``3600`` into the field's type);
    an empty value means "unset" (null).
    """
    parts = name[len(ENV_PREFIX) :].split("__")
    model: Any = Site
    node: Any = data
    path = ""
    for position, part in enumerate(parts):
        key: Any
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{name}: {path} has no item {part.lower()!r}")
            key = int(part)
            path += f"[{key}]"
        else:
            fields = _field_aliases(model) if model is not None else {}
            if part.lower() not in fields:
                gone = f"{path}.{to_camel(part.lower())}" if path else to_camel(part.lower())
                if gone in RETIRED:
                    raise ConfigError(f"{name}: {gone} is retired: {RETIRED[gone]}; unset it")
                hint = ""
                if "_" in part and position == 0:
                    hint = f" (nested settings use '__' between levels: {ENV_PREFIX}REGISTRY__HOST)"
                raise ConfigError(f"{name}: unknown setting {part.lower()!r}{hint}")
            key = fields[part.lower()]
            path += f".{key}" if path else key
            model = _unwrap(model.model_fields[part.lower()].annotation)
        if position == len(parts) - 1:
            node[key] = raw if raw != "" else None
            return
        if isinstance(node, dict) and not isinstance(node.get(key), dict | list):
            node[key] = {}
        node = node[key]


def _unwrap(annotation: Any) -> Any:
    """The model class behind ``X``, ``list[X]``, ``X | None`` or ``Annotated[…]``, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _unwrap(arg)
        if found is not None:
            return found
    origin = getattr(annotation, "__origin__", None)
    return _unwrap(origin) if origin is not None and origin is not annotation else None


_NAMED_FIELD = re.compile(
    r"^([A-Za-z][A-Za-z0-9]*(?:\[\d+\])?(?:\.[A-Za-z][A-Za-z0-9]*(?:\[\d+\])?)*): (.+)$"
)


def describe_validation_error(exc: ValidationError) -> str:
    """Every error, each as its field path and reason, on one line joined by ``; ``."""
    described: dict[str, str] = {}  # path -> line: a union reports one field per branch
    for error in exc.errors(include_url=False):
        path, line = _describe_one(error)
        described.setdefault(path, line)
    return "; ".join(described.values())


def _describe_one(error: Any) -> tuple[str, str]:
    path = _format_loc(error["loc"])
    message = _clean_message(error)
    # a model validator names the field it blames: "build: must differ from control"
    named = _NAMED_FIELD.match(message) if error["type"] == "value_error" else None
    if named:
        path = f"{path}.{named[1]}" if path else named[1]
        message = named[2]
    line = f"{path}: {message}" if path else message
    gone = ".".join(to_camel(part) for part in path.split("."))  # a snake_case key too
    if error["type"] == "extra_forbidden" and gone in RETIRED:
        return path, f"{path}: retired: {RETIRED[gone]}; remove it"
    shown = error.get("input")
    if error["type"] not in ("missing", "extra_forbidden") and isinstance(
        shown, str | int | float | bool
    ):
        # a refused URL may be refused for the very credentials it carries
        shown = redact_urls(shown) if isinstance(shown, str) else shown
        line += f" (got {shown!r})" if len(repr(shown)) <= 80 else ""
    return path, line


def _format_loc(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part.startswith(("function-after", "function-before", "union")):
            continue
        else:
            text += f".{part}" if text else part
    return text


def _clean_message(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    message = str(error["msg"])
    return message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
