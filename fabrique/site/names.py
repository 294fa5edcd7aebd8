"""Names and identifiers that several parts of fabrique must agree on.

The Workflow name ``fabrique-<app>-<sha12>`` is the deduplication key of the whole
factory: the Sensor, the reconciler and ``fabrique submit`` all derive it from here, so
the Kubernetes API refuses a second build of the same commit.
"""

from __future__ import annotations

import re

from .errors import InputError

WORKFLOW_PREFIX = "fabrique-"
SHORT_SHA_LEN = 12
# A Workflow name is also a pod-name prefix and a label value: keep it to 63 characters.
MAX_NAME_LEN = 63
MAX_APP_NAME_LEN = MAX_NAME_LEN - len(WORKFLOW_PREFIX) - 1 - SHORT_SHA_LEN

# A commit id of a SHA-1 repository (40 hex) or a SHA-256 one (64 hex). Every pattern
# here is used with fullmatch: ``$`` alone would let a trailing newline through.
REVISION_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

LABEL_APP = "fabrique.io/app"
# A label value holds at most 63 characters, and a SHA-256 commit id is 64: the label
# holds the sha12 (as the Workflow's name and the image tag do), the annotation of the
# same key the full revision.
LABEL_REVISION = "fabrique.io/revision"
ANNOTATION_REVISION = "fabrique.io/revision"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_PART_OF = "app.kubernetes.io/part-of"
# who made a build's Workflow (cli, reconciler); the Sensor's carry none, so that its
# patch of a redelivered push changes no other caller's (eventsources/sensor.py)
LABEL_SUBMITTED_BY = "fabrique.io/submitted-by"
# who asked for the builds a push's plan asked for (``fabrique plan-push``), and the
# label selector of those builds
PUSH_SUBMITTER = "push"
PUSH_MADE = f"{LABEL_PART_OF}=fabrique,{LABEL_SUBMITTED_BY}={PUSH_SUBMITTER}"
# The builds of one push whose write-backs meet (``writeback.batch``): each carries the
# push's Workflow name in this label and in its ``group`` parameter; its own write-back
# then writes nothing, and the push's Workflow writes them all, one commit per repository
# and branch (fabrique/gestures/group.py).
LABEL_PUSH = "fabrique.io/push"
GROUP_PARAMETER = "group"

TEMPLATE_NAME = "fabrique-build"
# The container of fabrique-build that checks the pushed digest against the registry; the
# build's pod (the template whose outputs hold what it verified), and that output: the one
# record the reconciler trusts to write a digest back.
VERIFY_STAGE = "verify-digest"
VERIFIED_BY = "run"
VERIFIED_OUTPUT = "digest"


def check_revision(revision: str) -> str:
    """Return ``revision`` if it is a full commit id (40 hex, or 64 in a SHA-256
    repository), else raise InputError."""
    if not REVISION_RE.fullmatch(revision):
        raise InputError(
            f"revision {revision!r}: must be a full lowercase hex commit id "
            "(40 characters, or 64 in a SHA-256 repository)"
        )
    return revision


def check_label_value(value: str, what: str) -> str:
    """Return ``value`` if it can be a label's value (a Workflow's name up to 63
    characters, as a push's is), else raise InputError naming ``what``."""
    if len(value) > 63 or not DNS_LABEL_RE.fullmatch(value):
        raise InputError(
            f"{what} {value!r}: must be a Workflow name of at most 63 characters "
            "(lowercase letters, digits and '-'), as fabrique-push-<after12>-<before12>"
        )
    return value


def check_digest(digest: str, *, what: str = "digest") -> str:
    """Return ``digest`` if it is ``sha256:<64 hex>``, else raise InputError."""
    if not DIGEST_RE.fullmatch(digest):
        raise InputError(f"{what} {digest!r}: must match sha256:<64 lowercase hex>")
    return digest


def short_sha(revision: str) -> str:
    """The 12-character prefix used in tags and Workflow names, whatever the hash."""
    return check_revision(revision)[:SHORT_SHA_LEN]


PUSH_BRANCH_MARK = "push."
MAX_BRANCH_LEN = 100  # Gitea's new_branch (MaxSize(100))


def push_branch(prefix: str, revision: str, base: str) -> str:
    """The branch that proposes a push's pins into ``base`` in one pull request:
    ``<prefix>push.<revision12>.<base>``. Two dots, where an app's branch
    (``<prefix><app>[.<env>]``) holds at most one: never one app's."""
    return f"{prefix}{PUSH_BRANCH_MARK}{revision[:SHORT_SHA_LEN]}.{base}"


def workflow_name(app: str, revision: str) -> str:
    """``fabrique-<app>-<sha12>``: the one name every caller gives a build of a commit."""
    return f"{WORKFLOW_PREFIX}{app}-{short_sha(revision)}"


_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_PORT = r"(?::[0-9]{1,5})?"
_HOST = rf"(?:{_LABEL}(?:\.{_LABEL})*{_PORT}|\[[0-9a-fA-F:]+\]{_PORT})"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
IMAGE_REF_RE = re.compile(
    rf"^(?:(?P<host>{_HOST})/)?(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>sha256:[0-9a-f]{{64}}))?$"
)


class ImageRef:
    """A parsed image reference ``[host/]repository[:tag][@digest]``.

    A first path part counts as a registry host only when it looks like one (a dot, a
    port or ``localhost``), the way Docker's reference grammar reads it.
    """

    __slots__ = ("digest", "host", "repository", "tag")

    def __init__(self, host: str | None, repository: str, tag: str | None, digest: str | None):
        self.host = host
        self.repository = repository
        self.tag = tag
        self.digest = digest

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        match = IMAGE_REF_RE.fullmatch(text)
        if not match:
            raise InputError(
                f"image reference {text!r}: not of the form [host/]name[:tag][@sha256:…]"
            )
        host, repo = match["host"], match["repo"]
        if host and not ("." in host or ":" in host or host == "localhost" or host.startswith("[")):
            repo, host = f"{host}/{repo}", None
        return cls(host, repo, match["tag"], match["digest"])

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/`` in the registry API: the digest, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.host}/{self.repository}" if self.host else self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    def __repr__(self) -> str:
        return f"ImageRef({str(self)!r})"


# The event path: the names Argo Events derives its Services, labels and streams from.
EVENT_BUS = "default"
EVENT_SOURCE = "gitea"
EVENT_NAME = "push"
WEBHOOK_PORT = 12000
WEBHOOK_ENDPOINT = "/push"
SENSOR = "fabrique-build"  # the site's one Sensor
# Each push the Sensor takes becomes one Workflow of this template, in the control
# namespace: fabrique-push-<after12>-<before12>, whose step asks for the push's builds.
PUSH_TEMPLATE = "fabrique-push"
PUSH_PREFIX = "fabrique-push-"
PLANNER_ACCOUNT = "fabrique-planner"
RECONCILER_ACCOUNT = "fabrique-reconciler"  # the safety net's pass
PLANNER_ROLE = "planner"  # its pod's fabrique.io/role, which its NetworkPolicy selects
PUSH_PARAMETERS = ("before", "after")  # what the Sensor passes it: the push's two commits
# A promotion's look at its environment (a build's is a step of its own Workflow): one
# Workflow of this template, in the control namespace, fabrique-verify-<12 hex> of the
# app, the environment and the digest
VERIFY_TEMPLATE = "fabrique-verify"
VERIFY_PREFIX = "fabrique-verify-"
VERIFY_PARAMETERS = ("app", "env")
# the label every Sensor pod of the site carries (its template's), which its policy selects
SENSOR_ROLE_LABEL, SENSOR_ROLE = "fabrique.io/role", "sensor"
SENSOR_SERVICE_ACCOUNT = "fabrique-sensor"
STREAM = "default"  # Argo Events' JetStream stream, subjects default.<eventsource>.<event>

# The site as the pods read it (``fabrique.site.files``): fabrique-site, then
# fabrique-site-<n> for the apps that do not fit
SITE_CONFIGMAP = "fabrique-site"

# What a reconcile pass leaves for the next one, in the build namespace.
RECONCILE_MEMORY = "fabrique-reconcile-memory"


def webhook_service_url(namespace: str) -> str:
    """Where Gitea posts: the Service Argo Events creates for the EventSource."""
    return (
        f"http://{EVENT_SOURCE}-eventsource-svc.{namespace}.svc.cluster.local:"
        f"{WEBHOOK_PORT}{WEBHOOK_ENDPOINT}"
    )


_USERINFO = re.compile(
    r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^/\s@:]*)(?::[^/\s@]*)?@"
)


def redact_urls(text: str) -> str:
    """``text`` with the credentials of every URL in it masked: a password, or the user
    of any scheme but ssh (``https://<token>@host`` is a token), its query and its
    fragment. An ssh user name such as
    ``git@`` is not a secret and stays readable."""

    def mask(match: re.Match[str]) -> str:
        scheme, user = match["scheme"], match["user"]
        if scheme.lower() == "ssh://" and user and match.group(0) == f"{scheme}{user}@":
            return match.group(0)
        return f"{scheme}***@"

    masked = _QUERY.sub(r"\g<url>?***", _USERINFO.sub(mask, text))
    return _FRAGMENT.sub(r"\g<url>#***", masked)


# a URL's query may carry a token (?token=…, ?access_token=…): never shown
_QUERY = re.compile(r"(?P<url>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s?#'\"]*)\?[^\s#'\"]*")
# and so may its fragment (an OAuth implicit grant's #access_token=…)
_FRAGMENT = re.compile(r"(?P<url>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s#'\"]*)#[^\s'\"]+")


# what a write-back did, as the build's write-back step says it (its output, the status
# it reports, the metric it counts); decisions/status.WRITTEN words each one
WRITEBACK_OUTCOMES = (
    "changed",
    "unchanged",
    "superseded",
    "held",
    "frozen",
    "proposed",
    "in-review",
    "rejected",
)


def verified_context(app: str, env: str) -> str:
    """The commit status a verification posts on the built commit, per environment."""
    return f"fabrique/{app}/{env}/verified"
