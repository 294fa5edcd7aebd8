"""Sensor ``fabrique-build``: a push that touches an app creates ``fabrique-<app>-<sha12>``.

Per app, one dependency on the push event and one trigger that creates the same Workflow
``fabrique submit`` creates, named from the pushed commit. The dependency passes a push
of a commit to the site's branch (data filters: anchored regexes, since Argo Events
treats a string value as an unanchored one) **and** either

- *touched*: a file the push's commits add, modify or remove lies under the app's
  context, other than a file fabrique itself writes (a write-back target); or
- *unknown*: the payload cannot say what changed: Gitea listed fewer commits than it
  counted (it cuts the list at ``FEED_MAX_COMMIT_NUM``, 5 by default), listed none (a
  branch reset to an older commit), or the branch is new (``before`` all zeros).

So a push makes Workflows only for the apps it may have changed, and fabrique's own
write-back commits make none. A push that rewrites history (a forced push) lists only
its new commits: an app changed only by the dropped ones is not seen here; the safety
net's next pass builds it (docs/DESIGN.md, "The event path"). The Workflow's plan step
stays the last word on what is built.

The trigger's operation is ``patch``: Argo Events gets the Workflow of that name, creates
it when there is none, and otherwise merge-patches it with the very body it would have
created, which changes nothing. A redelivered push (Gitea's "Replay", or JetStream
handing an event again to a Sensor that died before its ack) is so settled at once; a
``create`` would meet 409 AlreadyExists, which Argo Events retries like any error, for
the minute of ``RETRY_STRATEGY``. The build namespace's admission refuses any UPDATE by
the Sensor's account that would change a Workflow (pipelines/admission.py). So the body
holds only what every caller's Workflow of the commit holds: no
``fabrique.io/submitted-by`` (a Sensor-made Workflow is the one without it,
``SENSOR_MADE``), which the safety net's and ``fabrique submit``'s carry.

The Argo Events controller hands a Sensor to its pod as one environment variable, which
Linux caps at 128 KiB: a site whose Sensor would outweigh ``SENSOR_ENV_TARGET`` is split
into Sensors ``fabrique-build-<n>`` (``sensors``).
"""

from __future__ import annotations

import math
import re
import zlib
from typing import Any

from hera.events.models import (
    DataFilter,
    EventDependency,
    EventDependencyFilter,
    ExprFilter,
    PayloadField,
    RateLimit,
    StandardK8STrigger,
    TriggerParameter,
    TriggerParameterSource,
)

from fabrique.decisions.changes import fabrique_paths
from fabrique.decisions.workflow import (
    NAME_DEST,
    REVISION_DESTS,
    SHORT_REVISION_DESTS,
    workflow_object,
)
from fabrique.site.config import AppConfig, Site
from fabrique.site.errors import RenderError
from fabrique.site.limits import POD_ENV_LIMIT, pod_env_size
from fabrique.site.names import (
    EVENT_BUS,
    EVENT_NAME,
    EVENT_SOURCE,
    REVISION_RE,
    SENSOR,
    SENSOR_ROLE,
    SENSOR_ROLE_LABEL,
    SENSOR_SERVICE_ACCOUNT,
    SHORT_SHA_LEN,
    WORKFLOW_PREFIX,
)

from ._common import document, dump, restricted_container, restricted_pod

UNRESOLVED = "unresolved"  # what the resource says until the event fills it in
NON_ZERO_SHA = "^[0-9a-f]*[1-9a-f][0-9a-f]*$"  # a deleted branch pushes after = 0{40|64}


def anchored(text: str) -> str:
    return f"^{re.escape(text)}$"


def dependency_name(app: str) -> str:
    return f"push-{app}"


# the pushed commit's sha12: the Workflow's name ends with it, and the revision label
# holds it (a label value holds at most 63 characters)
SHORT_REVISION_TEMPLATE = f"{{{{ .Input.body.after | substr 0 {SHORT_SHA_LEN} }}}}"


def name_template(app: str) -> str:
    """The Go template that yields ``fabrique-<app>-<sha12>`` from the event."""
    return f"{WORKFLOW_PREFIX}{app}-{SHORT_REVISION_TEMPLATE}"


# The revision through the same Go template as the name, not a dataKey: a dataKey is read
# with gjson (the first of duplicated keys), a template over the decoded body (the last),
# so a payload with `after` twice could name one commit and build another.
REVISION_TEMPLATE = "{{ .Input.body.after }}"


def push_filters(site: Site) -> list[DataFilter]:
    """A push of a commit to the site's branch of the code repository."""
    return [
        DataFilter(path="header.X-Gitea-Event.0", type="string", value=["^push$"]),
        DataFilter(
            path="body.ref", type="string", value=[anchored(f"refs/heads/{site.gitea.branch}")]
        ),
        DataFilter(
            path="body.repository.full_name", type="string", value=[anchored(site.gitea.code_repo)]
        ),
        # 40 hex, or 64 in a SHA-256 repository; Go's $ is the end of the text
        DataFilter(path="body.after", type="string", value=[REVISION_RE.pattern]),
        DataFilter(path="body.after", type="string", value=[NON_ZERO_SHA]),
    ]


# Every file a push's commits add, modify or remove, as one flat list (gjson: each
# commit's three lists, flattened); the app's dependency counts those under its context
# that fabrique does not write (gjson queries, ``touched_path``).
CHANGED_FILES = (
    '[body.commits.#.added,body.commits.#.modified,body.commits.#.removed]|@flatten:{"deep":true}'
)
# The payload cannot say what changed: Gitea listed fewer commits than the push holds
# (it cuts the list at FEED_MAX_COMMIT_NUM), or none, or the branch is new.
UNKNOWN_EXPR = "listed != total || listed == 0 || before =~ '^0+$'"
UNKNOWN_FIELDS = (
    ("listed", "body.commits.#"),
    ("total", "body.total_commits"),
    ("before", "body.before"),
)
# What a path may hold to be written into a gjson query as it is: not a quote, a
# backslash, nor a wildcard of its ``%`` match.
_QUERY_SAFE = re.compile(r'[^"\\*?]+')


def touched_path(site: Site, app: AppConfig) -> str:
    """The gjson path that counts the pushed files under ``app``'s context other than the
    files fabrique writes: the plan's own rule (``files_changed`` under the context, less
    ``fabrique_paths``). A context or write-back path a query cannot hold as it is
    counts every changed file (the plan decides); a list Gitea left null counts none."""
    own = sorted(p for p in fabrique_paths(site) if p.startswith(app.context + "/"))
    if not all(_QUERY_SAFE.fullmatch(p) for p in (app.context, *own)):
        return f'{CHANGED_FILES}|#(%"*")#|#'
    kept = "".join(f'|#(!="{path}")#' for path in own)
    return f'{CHANGED_FILES}|#(%"{app.context}/*")#{kept}|#'


def touched_filters(site: Site, app: AppConfig) -> dict[str, Any]:
    """The expressions of ``app``'s dependency, ORed: a file of its is touched, or the
    payload cannot say."""
    touched = ExprFilter(
        expr="touched > 0", fields=[PayloadField(name="touched", path=touched_path(site, app))]
    )
    unknown = ExprFilter(
        expr=UNKNOWN_EXPR, fields=[PayloadField(name=n, path=p) for n, p in UNKNOWN_FIELDS]
    )
    return {"exprs": [dump(touched), dump(unknown)], "exprLogicalOperator": "or"}


# What render lets one Sensor weigh as its pod's SENSOR_OBJECT: four fifths of Linux's
# limit for one variable (``POD_ENV_LIMIT``), about 78 KiB of JSON, some 34 apps of the
# default site's names (bench/object_sizes.py measures it).
SENSOR_ENV_TARGET = POD_ENV_LIMIT * 4 // 5


def sensors(site: Site) -> list[dict[str, Any]]:
    """The Sensors of the site: one, ``fabrique-build``, while it fits
    ``SENSOR_ENV_TARGET``; else ``fabrique-build-<n>``, as few as fit it, each app in
    the Sensor its name's CRC-32 picks (so that adding an app changes one Sensor, and
    restarts one pod, unless it takes one Sensor more). A Sensor no app falls in is not
    rendered. An app whose dependency and trigger alone outweigh the target fails render
    (``RenderError``): no split holds it."""
    parts = {app.name: app_parts(site, app) for app in site.apps}
    whole = _sensor_of(site, SENSOR, list(parts.values()))
    size = pod_env_size(whole)
    if size <= SENSOR_ENV_TARGET:
        return [whole]
    longest = f"{SENSOR}-{len(site.apps) - 1}"  # the longest name a split may give it
    for index, app in enumerate(site.apps):
        alone = pod_env_size(_sensor_of(site, longest, [parts[app.name]]))
        if alone > SENSOR_ENV_TARGET:
            raise RenderError(_too_heavy(site, index, alone))
    # one Sensor an app at most: a split that still needs more has apps that collide
    fewest = math.ceil(size / SENSOR_ENV_TARGET)
    for count in range(fewest, max(fewest, len(site.apps)) + 1):
        groups: dict[int, list[AppConfig]] = {}
        for app in site.apps:
            groups.setdefault(zlib.crc32(app.name.encode()) % count, []).append(app)
        split = [
            _sensor_of(site, f"{SENSOR}-{n}", [parts[app.name] for app in groups[n]])
            for n in sorted(groups)
        ]
        if all(pod_env_size(one) <= SENSOR_ENV_TARGET for one in split):
            return split
    heaviest = max(split, key=pod_env_size)
    raise RenderError(
        f"apps: no split into {len(site.apps)} Sensors or fewer keeps each under "
        f"{SENSOR_ENV_TARGET} bytes as its pod's SENSOR_OBJECT ({heaviest['metadata']['name']}: "
        f"{pod_env_size(heaviest)} bytes, apps "
        f"{', '.join(d['name'].removeprefix('push-') for d in heaviest['spec']['dependencies'])}): "
        "make those apps' contexts hold fewer write-back targets"
    )


def _too_heavy(site: Site, index: int, size: int) -> str:
    app = site.apps[index]
    written = sorted(p for p in fabrique_paths(site) if p.startswith(app.context + "/"))
    return (
        f"apps[{index}].context: {app.context!r} holds {len(written)} files fabrique writes "
        "(write-back targets), each left out by its Sensor's filter: that app alone makes a "
        f"Sensor of {size} bytes as its pod's SENSOR_OBJECT, over the {SENSOR_ENV_TARGET} "
        f"bytes render keeps a Sensor under (Linux takes {POD_ENV_LIMIT} for one variable); "
        "narrow the context, or move those targets out of it"
    )


def sensor_names(site: Site) -> list[str]:
    return [one["metadata"]["name"] for one in sensors(site)]


def sensor(site: Site, name: str = SENSOR, apps: list[AppConfig] | None = None) -> dict[str, Any]:
    """The Sensor ``name`` of ``apps`` (every app of the site by default)."""
    return _sensor_of(
        site, name, [app_parts(site, app) for app in (site.apps if apps is None else apps)]
    )


def app_parts(site: Site, app: AppConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """``app``'s dependency and its trigger, as a Sensor holds them."""
    dep = dependency_name(app.name)
    dependency = dump(
        EventDependency(
            name=dep,
            event_source_name=EVENT_SOURCE,
            event_name=EVENT_NAME,
            filters=EventDependencyFilter(data=push_filters(site), data_logical_operator="and"),
        )
    )
    dependency["filters"].update(touched_filters(site, app))
    parameters = [
        TriggerParameter(
            src=TriggerParameterSource(dependency_name=dep, data_template=name_template(app.name)),
            dest=NAME_DEST,
        ),
        *(
            TriggerParameter(
                src=TriggerParameterSource(dependency_name=dep, data_template=REVISION_TEMPLATE),
                dest=dest,
            )
            for dest in REVISION_DESTS
        ),
        *(
            TriggerParameter(
                src=TriggerParameterSource(
                    dependency_name=dep, data_template=SHORT_REVISION_TEMPLATE
                ),
                dest=dest,
            )
            for dest in SHORT_REVISION_DESTS
        ),
    ]
    k8s = dump(StandardK8STrigger(operation="patch", parameters=parameters))
    # The resource must be the raw Workflow object: hera's K8SResource would dump it as
    # a base64 {value: …}, which the API rejects.
    k8s["source"] = {
        "resource": workflow_object(
            site,
            app.name,
            f"{WORKFLOW_PREFIX}{app.name}-{UNRESOLVED}",
            UNRESOLVED,
            # the one field that differs by caller: left out, so that the merge patch
            # of a redelivered push changes no Workflow the safety net or a person made
            submitted_by=None,
        )
    }
    trigger = {
        "template": {"name": f"build-{app.name}", "conditions": dep, "k8s": k8s},
        # at-most-once unless told: a Sensor that dies between ack and create would lose it
        "atLeastOnce": True,
        "retryStrategy": RETRY_STRATEGY,
        "rateLimit": dump(
            RateLimit(unit="Second", requests_per_unit=site.events.triggers_per_second)
        ),
    }
    return dependency, trigger


def _sensor_of(
    site: Site, name: str, parts: list[tuple[dict[str, Any], dict[str, Any]]]
) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {SENSOR_ROLE_LABEL: SENSOR_ROLE}},
        "serviceAccountName": SENSOR_SERVICE_ACCOUNT,
        "securityContext": restricted_pod(),
        "container": {"securityContext": restricted_container()},
    }
    spec = {
        "eventBusName": EVENT_BUS,
        "template": template,
        "dependencies": [dependency for dependency, _ in parts],
        "triggers": [trigger for _, trigger in parts],
    }
    return document("Sensor", name, site.namespaces.control, spec)


# The trigger's tries (Argo Events' DoWithRetry, pkg/shared/util/retry.go: a
# k8s.io/apimachinery wait.Backoff, `steps` tries, the wait doubling from `duration`, each
# stretched by up to `jitter`): 2, 4, 8, 16 and 32 s between six tries, so an API server
# away for a minute loses no event. DoWithRetry retries every error alike, which is why
# the operation is a patch: a redelivered commit finds its Workflow and is done.
RETRY_STRATEGY = {"steps": 6, "duration": "2s", "factor": 2, "jitter": 0.2}


def sensor_rbac(site: Site) -> list[dict[str, Any]]:
    """The Sensor's ServiceAccount may create Workflows in the build namespace, and get
    and patch them (a patch that changes nothing: admission refuses any other)."""
    from fabrique.site.objects import service_account

    return service_account(
        SENSOR_SERVICE_ACCOUNT,
        site.namespaces.control,
        [
            {
                "apiGroups": ["argoproj.io"],
                "resources": ["workflows"],
                "verbs": ["create", "get", "patch"],
            }
        ],
        role=f"{SENSOR_SERVICE_ACCOUNT}-workflows",
        role_namespace=site.namespaces.build,
    )
