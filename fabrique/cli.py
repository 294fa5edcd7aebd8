"""The ``fabrique`` command line.

Results go to stdout, logs and errors to stderr. An error is one line, ``error: …``,
and the exit code comes from the exception tree (see ``pipelines.errors``).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fabrique import __version__
from fabrique.site.errors import (
    TRANSIENT_EXIT_CODE,
    TRANSIENT_SAID,
    FabriqueError,
    InputError,
    NotPassed,
    ValidationFailed,
)
from fabrique.site.names import WRITEBACK_OUTCOMES, check_label_value

if TYPE_CHECKING:
    from fabrique.decisions.reconcile import Reconciler
    from fabrique.site.config import Environment, Site

log = logging.getLogger("fabrique")


class _Group(click.Group):
    """Maps the FabriqueError tree to one stderr line and its exit code.

    A transient error's line ends with TRANSIENT_SAID, as the step scripts' do: a failed
    step's node message may carry that last line and no exit code, and those words are
    what then tell the exit handler's report that the infrastructure gave up.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ValidationFailed as err:
            for problem in err.problems:
                click.echo(problem, err=True)
            click.echo(f"error: {err}", err=True)
            ctx.exit(err.exit_code)
        except FabriqueError as err:
            said = str(err)
            if err.exit_code == TRANSIENT_EXIT_CODE and TRANSIENT_SAID not in said:
                said = f"{said}: {TRANSIENT_SAID}"
            click.echo(f"error: {said}", err=True)
            ctx.exit(err.exit_code)


class _State:
    def __init__(self, values: str | None) -> None:
        self.values = values
        self._site: Site | None = None

    @property
    def site(self) -> Site:
        if self._site is None:
            # the site's pydantic model only for a command that reads the site
            from fabrique.site.config import load_site

            self._site = load_site(self.values)
        return self._site


pass_state = click.make_pass_decorator(_State)
kube_context_option = click.option(
    "--context", "kube_context", envvar="FABRIQUE_KUBECONTEXT", help="kubeconfig context."
)


def _setup_logging(verbose: bool) -> None:
    """fabrique's own logs to stderr; library chatter only with --verbose."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    log.propagate = False
    for noisy in ("httpx", "httpcore", "urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.WARNING)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--values",
    "-f",
    metavar="FILE",
    envvar="FABRIQUE_VALUES",
    help="Site values file over the embedded default site (env: FABRIQUE_VALUES).",
)
@click.option("--verbose", "-v", is_flag=True, help="Log debug details to stderr.")
@click.version_option(__version__, prog_name="fabrique")
@click.pass_context
def cli(ctx: click.Context, values: str | None, verbose: bool) -> None:
    """fabrique: build app images with rootless BuildKit and deploy them by digest."""
    _setup_logging(verbose)
    ctx.obj = _State(values)


@cli.command()
@click.option(
    "--out", "-o", default="manifests", show_default=True, type=click.Path(path_type=Path)
)
@pass_state
def render(state: _State, out: Path) -> None:
    """Write the whole manifest tree for the site (kubectl apply -k / Argo CD ready)."""
    from .render import render_tree, write_tree

    tree = render_tree(state.site)
    for removed in write_tree(tree, out):
        click.echo(f"notice: removed {out / removed}: not part of the rendered tree", err=True)
    click.echo(f"rendered {len(tree)} files into {out}")


@cli.command()
@click.argument("directory", default="manifests", type=click.Path(path_type=Path))
@click.option(
    "--specs",
    metavar="DIR",
    help="Upstream specs (default: the copy shipped with fabrique; env FABRIQUE_SPECS).",
)
@click.option("--k8s-version", metavar="X.Y.Z", help="Kubernetes schema version for core kinds.")
@click.option(
    "--external",
    multiple=True,
    metavar="KIND/NS/NAME",
    help="An object the tree refers to that lives outside it (repeatable), such as "
    "ServiceAccount/fabrique-build/builder.",
)
@click.option(
    "--rules",
    multiple=True,
    metavar="FILE",
    type=click.Path(path_type=Path),
    help="A Prometheus rules file to check too (repeatable), such as `fabrique alerts`' "
    "(promtool check rules' structure; not its PromQL).",
)
def validate(
    directory: Path,
    specs: str | None,
    k8s_version: str | None,
    external: tuple[str, ...],
    rules: tuple[Path, ...],
) -> None:
    """Check every rendered document strictly; list every error with its place."""
    from .validate import (
        find_specs,
        kustomize_check,
        parse_external,
        validate_rules_file,
        validate_tree,
    )

    outside = [parse_external(value) for value in external]
    problems = [
        str(p)
        for p in validate_tree(
            directory, find_specs(specs), k8s_version=k8s_version, external=outside
        )
    ]
    problems += [str(p) for path in rules for p in validate_rules_file(path)]
    try:
        kustomize_error = kustomize_check(directory)
    except FileNotFoundError:
        click.echo("notice: kubectl not found; the `kubectl kustomize` check was skipped", err=True)
    else:
        if kustomize_error:
            problems.append(f"{directory}: kubectl kustomize: {kustomize_error}")
    if problems:
        raise ValidationFailed(problems)
    click.echo(f"{directory}: valid")


@cli.command()
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    help="Write the rules file here (default: stdout).",
)
@pass_state
def alerts(state: _State, out: Path | None) -> None:
    """Print the factory's alerts as a Prometheus rules file, thresholds from the site."""
    from fabrique.decisions.alerts import rules_file

    from .render import dump_documents

    text = dump_documents([rules_file(state.site)], header=False)
    _emit(text, out, f"{len(text.splitlines())} lines of rules")


def _emit(text: str, out: Path | None, what: str) -> None:
    """``text`` on stdout, or into ``--out`` (saying ``what`` was written there)."""
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        out.write_text(text, "utf-8")
    except OSError as exc:
        raise InputError(f"--out {out}: cannot write it ({exc.strerror})") from None
    click.echo(f"wrote {what} into {out}", err=True)


@cli.command()
@click.option(
    "--out",
    "-o",
    type=click.Path(path_type=Path),
    help="Write the dashboard's JSON here (default: stdout).",
)
@pass_state
def dashboard(state: _State, out: Path | None) -> None:
    """Print the factory's Grafana dashboard (JSON), over the series the alerts read."""
    from fabrique.decisions.dashboard import dashboard as model

    _emit(json.dumps(model(state.site), indent=2) + "\n", out, "the dashboard")


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@click.option(
    "--revision", required=True, help="Full commit id (40 hex, or 64 in a SHA-256 repository)."
)
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Output directory.")
@click.option(
    "--force",
    type=click.Choice(["true", "false"]),
    default="false",
    show_default=True,
    help="Build even if nothing under the app's context changed since the deployed revision.",
)
@pass_state
def plan(state: _State, app: str, revision: str, out: Path, force: str) -> None:
    """Resolve an app and revision into build parameters, and decide whether to build.

    The first step of fabrique-build: a bad revision or an unknown app fails here, and a
    push that changed nothing under the app's context skips the rest of the Workflow.
    """
    from fabrique.clients.gitea import token_from_env
    from fabrique.decisions.changes import Decision, needs_build
    from fabrique.decisions.plan import make_plan, write_outputs
    from fabrique.decisions.writeback import open_transport

    site = state.site
    build_plan = make_plan(site, app, revision)
    if force == "true":
        decision = Decision(True, "forced")
    else:
        with open_transport(site, token_from_env(), writes=False) as transport:
            decision = needs_build(site, transport, app, revision)
    write_outputs(build_plan, out, build=decision.build, reason=decision.reason)
    verdict = "build" if decision.build else "skip"
    click.echo(f"plan: {verdict} {build_plan.image_ref} ({decision.reason})")


@cli.group()
def digest() -> None:
    """Digest checks."""


@digest.command("verify")
@click.option("--app", required=True)
@click.option("--revision", required=True)
@click.option(
    "--metadata",
    required=True,
    type=click.Path(path_type=Path),
    help="buildctl --metadata-file output.",
)
@click.option(
    "--output", type=click.Path(path_type=Path), help="Also write the digest to this file."
)
@pass_state
def digest_verify(
    state: _State, app: str, revision: str, metadata: Path, output: Path | None
) -> None:
    """Check that the pushed tag's registry digest equals the build's; print it.

    With build.attestations, the index must also carry provenance that names the
    revision and the repository (and an SBOM with build.sbom)."""
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.digest import verify_pushed
    from fabrique.decisions.plan import write_atomic
    from fabrique.site.names import short_sha

    site = state.site
    app_config = site.app(app)
    tag = short_sha(revision)
    with RegistryClient.for_site(site) as client:
        verified = verify_pushed(client, app_config.image, tag, metadata)
        if site.build.attestations:
            from fabrique.decisions.provenance import check_attestations, expected

            want = expected(site, app_config, revision, verified)
            check_attestations(client, want, sbom=site.build.sbom)
            log.info("provenance of %s names %s and %s", verified, revision, want.source)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(output, verified)
    log.info("verified %s/%s:%s = %s", site.registry.host, app_config.image, tag, verified)
    click.echo(verified)


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@click.option("--digest", required=True, help="The verified digest, sha256:<64 hex>.")
@click.option(
    "--key",
    "key_path",
    default="/etc/fabrique/signing/cosign.key",
    show_default=True,
    help="The cosign private key (mounted from signing.keySecret).",
)
@pass_state
def sign(state: _State, app: str, digest: str, key_path: str) -> None:
    """Sign the verified digest with cosign (the password from COSIGN_PASSWORD), then
    check the signature as the write-back will. A step of fabrique-build with signing."""
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.signature import sign as cosign_sign
    from fabrique.site.names import check_digest

    site = state.site
    image = site.app(app).image
    check_digest(digest)
    with RegistryClient.for_site(site) as registry:
        cosign_sign(site, registry, image, digest, key_path=key_path)
    click.echo(f"signed: {site.registry.host}/{image}@{digest}")


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@click.option("--revision", help="Full commit id (40 hex, or 64 in a SHA-256 repository) to build.")
@click.option("--head", is_flag=True, help="Build the branch head, resolved through Gitea.")
@click.option("--force", is_flag=True, help="Build even if the app's context did not change.")
@click.option("--dry-run", is_flag=True, help="Print the Workflow YAML; create nothing.")
@click.option(
    "--print-argo", is_flag=True, help="Print the equivalent `argo submit` line; create nothing."
)
@kube_context_option
@pass_state
def submit(
    state: _State,
    app: str,
    revision: str | None,
    head: bool,
    force: bool,
    dry_run: bool,
    print_argo: bool,
    kube_context: str | None,
) -> None:
    """Create the Workflow fabrique-<app>-<sha12> by hand (first-step mode)."""
    from fabrique.decisions.workflow import argo_submit_line, build_workflow
    from fabrique.site.errors import InputError

    site = state.site
    site.app(app)
    if bool(revision) == head:
        raise InputError("give exactly one of --revision SHA or --head")
    if dry_run and print_argo:
        raise InputError("give at most one of --dry-run (the Workflow) or --print-argo (its line)")
    if head:
        from fabrique.clients.gitea import GiteaClient

        with GiteaClient.for_site(site) as gitea:
            revision = gitea.branch_head(site.gitea.code_repo, site.gitea.branch)
        log.info("head of %s@%s is %s", site.gitea.code_repo, site.gitea.branch, revision)
    assert revision is not None
    body = build_workflow(site, app, revision, submitted_by="cli", force=force)
    if print_argo:
        click.echo(argo_submit_line(body, context=kube_context))
        return
    if dry_run:
        from .render import dump_documents

        click.echo(dump_documents([body], header=False), nl=False)
        return
    from fabrique.clients.kube import KubeClient

    result = KubeClient.for_site(site, kube_context).create_workflow(body)
    state_word = "created" if result.created else "already exists"
    click.echo(f"{state_word}: workflow {result.namespace}/{result.name}")


@cli.command("plan-push")
@click.option("--before", required=True, help="The branch's commit before the push (zeros: new).")
@click.option("--after", required=True, help="The pushed commit: the branch's head after it.")
@click.option(
    "--group",
    help="The push's Workflow: the builds whose write-backs meet there (writeback.batch) "
    "carry its name, and write nothing themselves.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Also write how many builds meet (file 'grouped'), the step's output.",
)
@click.option("--dry-run", is_flag=True, help="Say which builds it would ask for; create none.")
@kube_context_option
@pass_state
def plan_push(
    state: _State,
    before: str,
    after: str,
    group: str | None,
    out: Path | None,
    dry_run: bool,
    kube_context: str | None,
) -> None:
    """Create the build of every app a push of the site's branch may have changed.

    The step of the push's Workflow (the Sensor makes one per push): it lists the
    commits the push brought and dropped, and asks for fabrique-<app>-<sha12> of each
    app a changed file lies under; one that exists already is success. With --group,
    the builds of apps that write into one repository and branch leave their write-back
    to that Workflow (fabrique writeback-group). One line per app, then why. Exits 75
    when the API server did not answer (the step is retried).
    """
    from fabrique.clients.gitea import GiteaClient, token_from_env
    from fabrique.clients.kube import KubeClient
    from fabrique.decisions.plan import write_files
    from fabrique.decisions.push import (
        ask_builds,
        check_push,
        meeting,
        raise_for_failures,
        touched,
    )

    check_push(before, after)
    site = state.site
    if group is not None:
        check_label_value(group, "--group")
    with GiteaClient.for_site(site, token_from_env()) as gitea:
        found = touched(site, gitea, before, after)
    meets = meeting(site, found.apps) if group else frozenset()
    if dry_run:
        for app in found.apps:
            click.echo(f"would ask: {app}" + (f" (written by {group})" if app in meets else ""))
    else:
        kube = KubeClient.for_site(site, kube_context)
        asked = ask_builds(site, kube, found.apps, after, group=group)
        for one in asked:
            word = "failed" if one.error else "created" if one.created else "already exists"
            said = f" (written by {group})" if one.app in meets else ""
            click.echo(f"{one.app}: {word}: workflow {site.namespaces.build}/{one.name}{said}")
        raise_for_failures(asked)
    if out is not None:
        write_files(out, {"grouped": str(len(meets))}, "--out")
    click.echo(f"{len(found.apps)} of {len(site.apps)} app(s): {found.reason}")
    if meets:
        click.echo(f"{len(meets)} build(s) write back together, through {group}")


@cli.command("writeback-group")
@click.option(
    "--push",
    help="The push's Workflow: wait for the builds it asked for (label fabrique.io/push), "
    "and write those that built.",
)
@click.option(
    "--from",
    "source",
    type=click.File("r"),
    help='Write these now instead: a JSON list of {"app", "revision", "digest"} ("-": stdin).',
)
@click.option("--dry-run", is_flag=True, help="Print the diffs that would be committed.")
@kube_context_option
@pass_state
def writeback_group(
    state: _State, push: str | None, source: Any, dry_run: bool, kube_context: str | None
) -> None:
    """Write several apps' digests, one commit per repository and branch.

    The last step of a push's Workflow (writeback.batch): every build of the push that
    meets there has ended, or maxWait has passed since the first ended; those that built
    are written, each judged as its own write-back would be (held, frozen, superseded,
    unchanged), and each app's status is posted. A build that failed is left out and
    said. One line per app. Exits 2 when an app's write-back was refused (the others are
    written), 75 when Gitea did not answer.
    """
    from fabrique.clients.gitea import GiteaClient, token_from_env
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.signature import signature_gate
    from fabrique.decisions.status import StatusReporter
    from fabrique.decisions.writeback import Outcome, open_transport
    from fabrique.gestures.group import wait_and_write, write_batch

    site = state.site
    if (push is None) == (source is None):
        raise InputError("writeback-group: give --push or --from, one of them")
    states = None if source is None else _deploys_file(source)
    if push is not None:
        check_label_value(push, "--push")
    token = token_from_env()
    with (
        open_transport(site, token, writes=not dry_run) as transport,
        GiteaClient.for_site(site, token) as gitea,
        RegistryClient.for_site(site) as registry,  # only asked when the site signs
    ):
        statuses = None if dry_run else StatusReporter(site, gitea, token)
        gate = signature_gate(site, registry)

        kube = None
        if push is not None:
            from fabrique.clients.kube import KubeClient

            kube = KubeClient.for_site(site, kube_context)

        def look(app: Any, env: Any, outcome: Any) -> str | None:
            from fabrique.gestures.promote import look_after

            if kube is None:  # --from, by hand: the pass looks
                return None
            return look_after(site, lambda _: kube, app, env, outcome)

        def write(builds: Any) -> Any:
            landed = write_batch(
                site, transport, statuses, builds, gate=gate, dry_run=dry_run, look=look
            )
            for one in landed:
                if isinstance(one.outcome, Outcome) and one.outcome.diff:
                    click.echo(one.outcome.diff, nl=False)
                click.echo(one.line())
            return landed

        running: list[str] = []
        if states is not None:
            landed = write(states)
        else:
            assert push is not None and kube is not None
            landed, running = wait_and_write(site, kube, push, write)
    if running:
        click.echo(
            f"still building when the wait ended: {', '.join(running)}; the safety net writes them"
        )
    click.echo(f"{len(landed)} build(s) of the push: {_landed_summary(landed)}")
    failed = [one.outcome for one in landed if isinstance(one.outcome, FabriqueError)]
    if failed:
        raise failed[0]


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@click.option(
    "--revision",
    required=True,
    help="Full commit id (40 hex, or 64 in a SHA-256 repository) the image was built from.",
)
@click.option("--digest", required=True, help="The verified digest, sha256:<64 hex>.")
@click.option("--workflow", help="Workflow to name in the commit (default fabrique-<app>-<sha12>).")
@click.option(
    "--dry-run", is_flag=True, help="Print the diff that would be committed; write nothing."
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="Also write the outcome and the commit here, one file each (the step's outputs).",
)
@pass_state
def writeback(
    state: _State,
    app: str,
    revision: str,
    digest: str,
    workflow: str | None,
    dry_run: bool,
    out: Path | None,
) -> None:
    """Write a verified digest into the app's target: changed, unchanged, superseded or held
    (with writeback.mode pull-request: proposed, in-review or rejected)."""
    from fabrique.clients.gitea import token_from_env
    from fabrique.decisions.plan import write_files
    from fabrique.decisions.writeback import open_transport, write_back
    from fabrique.site.names import check_digest, check_revision

    site = state.site
    site.app(app)
    check_revision(revision)
    check_digest(digest)
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.signature import signature_gate

    with (
        open_transport(site, token_from_env(), writes=not dry_run) as transport,
        RegistryClient.for_site(site) as registry,  # only asked when the site signs
    ):
        outcome = write_back(
            *(site, transport, app, revision, digest),
            workflow=workflow,
            dry_run=dry_run,
            gate=signature_gate(site, registry),
        )
    if outcome.diff:
        click.echo(outcome.diff, nl=False)
    if out is not None:
        verify = _verify_after(site, app, outcome.state)
        written = {"outcome": outcome.state, "commit": outcome.commit or "", "verify": verify}
        write_files(out, written, "--out")
    click.echo(outcome.line())


def _deploys_file(source: Any) -> list[Any]:
    """``--from``'s JSON list of deploys, as the builds' records they stand for; a
    one-line error naming the entry and field otherwise."""
    from fabrique.clients.kube import WorkflowState
    from fabrique.site.names import check_digest, check_revision, workflow_name

    try:
        items = json.load(source)
    except ValueError as exc:
        raise InputError(f"--from {source.name}: not JSON ({exc})") from None
    if not isinstance(items, list):
        raise InputError(f"--from {source.name}: must be a JSON list of deploys")
    states = []
    for i, item in enumerate(items):
        where = f"--from {source.name}[{i}]"
        if not isinstance(item, dict) or set(item) - {"app", "revision", "digest", "workflow"}:
            raise InputError(f"{where}: an object of app, revision, digest (and workflow)")
        for key in ("app", "revision", "digest"):
            if not isinstance(item.get(key), str):
                raise InputError(f"{where}.{key}: missing, or not a string")
        check_revision(item["revision"])
        check_digest(item["digest"], what=f"{where}.digest")
        name = item.get("workflow") or workflow_name(item["app"], item["revision"])
        states.append(
            WorkflowState(name, "Succeeded", item["revision"], item["digest"], "", app=item["app"])
        )
    return states


def _landed_summary(landed: Any) -> str:
    from collections import Counter

    from fabrique.decisions.writeback import Outcome

    counted = Counter(
        one.outcome.state
        if isinstance(one.outcome, Outcome)
        else "failed"
        if one.outcome is not None
        else "left out"
        for one in landed
    )
    return ", ".join(f"{n} {state}" for state, n in sorted(counted.items())) or "none"


def _verify_after(site: Site, app: str, state: str) -> str:
    """The environment the build's own Workflow verifies after this write-back (its
    ``verify-deploy`` step): the first, when the digest was written there and its Argo CD
    runs in this cluster; "" for none (the pass verifies what else there is)."""
    if state != "changed":
        return ""
    return next((env.name for found, env in site.built_in_cluster() if found.name == app), "")


@cli.group("status-report")
def status_report() -> None:
    """Post the build's commit status on its revision in Gitea (context fabrique/<app>).

    The fabrique-build steps run these. A report never fails the build: a Gitea that
    fails or times out is logged and the next reconcile pass repairs the status. A
    status equal to the latest of its context is not posted again.
    """


def _report_options(command: Any) -> Any:
    for option in reversed(
        [
            click.option("--app", required=True, help="App name from the site config."),
            click.option("--revision", required=True, help="The commit the Workflow builds."),
            click.option("--workflow", help="The Workflow's name (links the status to it)."),
        ]
    ):
        command = option(command)
    return command


def _report(
    state: _State,
    app: str,
    revision: str,
    workflow: str | None,
    make: Any,
) -> None:
    """Resolve the app, make the report, post it; print one line; never raise for Gitea."""
    from fabrique.clients.gitea import GiteaClient, token_from_env
    from fabrique.decisions.status import StatusReporter, context
    from fabrique.site.names import check_revision

    site = state.site
    try:
        app_config = site.app(app)
        check_revision(revision)
    except InputError as err:  # the plan step fails on it and says so; nothing to report on
        click.echo(f"notice: no status reported: {err}", err=True)
        return
    report = make(app_config)
    if report is None:
        click.echo(f"status: nothing to report for {context(app)} on {revision[:12]}")
        return
    token = token_from_env()
    with GiteaClient.for_site(site, token) as gitea:
        result = StatusReporter(site, gitea, token).post(app, revision, report, workflow=workflow)
    click.echo(f"status {result}: {context(app)} {report.state} on {revision[:12]}")


@status_report.command("pending")
@_report_options
@pass_state
def status_pending(state: _State, app: str, revision: str, workflow: str | None) -> None:
    """pending: the build of the revision starts."""
    from fabrique.decisions.status import pending

    _report(state, app, revision, workflow, lambda a: pending(a, revision))


@status_report.command("skipped")
@_report_options
@pass_state
def status_skipped(state: _State, app: str, revision: str, workflow: str | None) -> None:
    """success: nothing under the app's context changed, nothing was built."""
    from fabrique.decisions.status import skipped

    _report(state, app, revision, workflow, skipped)


@status_report.command("success")
@_report_options
@click.option("--digest", required=True, help="The verified digest that was written back.")
@click.option(
    "--outcome",
    required=True,
    type=click.Choice(WRITEBACK_OUTCOMES),
    help="The write-back's outcome.",
)
@click.option("--commit", default="", help="The write-back commit, when it changed.")
@pass_state
def status_success(
    state: _State,
    app: str,
    revision: str,
    workflow: str | None,
    digest: str,
    outcome: str,
    commit: str,
) -> None:
    """success: the digest is written back (changed, unchanged, superseded, held, frozen,
    proposed, in-review or rejected)."""
    from fabrique.decisions.status import written
    from fabrique.site.names import check_digest

    check_digest(digest)
    _report(state, app, revision, workflow, lambda _: written(outcome, digest, commit or None))


@status_report.command("failure")
@_report_options
@click.option(
    "--workflow-status",
    required=True,
    help="{{workflow.status}}: Succeeded (nothing is reported), Failed or Error.",
)
@click.option(
    "--failures", default="", help="{{workflow.failures}}: the JSON list of the failed nodes."
)
@pass_state
def status_failure(
    state: _State,
    app: str,
    revision: str,
    workflow: str | None,
    workflow_status: str,
    failures: str,
) -> None:
    """failure or error, from the exit handler: the failing step and why."""
    from fabrique.decisions.status import failed
    from fabrique.site.names import workflow_name

    def make(app_config: Any) -> Any:
        name = workflow or workflow_name(app_config.name, revision)
        return failed(workflow_status, failures, name)

    _report(state, app, revision, workflow, make)


def _operator(by: str | None) -> str:
    """Who is holding: --by, else the login name (it goes into Git, with the time)."""
    import getpass

    from fabrique.decisions.holds import check_text

    if by is None:
        try:
            by = getpass.getuser()
        except (OSError, KeyError):
            raise InputError("--by: cannot tell who you are; give --by NAME") from None
    by = check_text("--by", by)
    if not by:
        raise InputError("--by: must not be empty")
    return by


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


by_option = click.option("--by", help="Who holds, recorded in Git (default: your login name).")
env_option = click.option(
    "--env", "env_name", help="In this environment's target (default: the first, the build's)."
)


def _environment(site: Site, app: str, name: str | None) -> Environment | None:
    return None if name is None else site.app(app).environment(name, "--env")[0]


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@click.option("--reason", default="", help="Why, recorded in Git and shown by status.")
@by_option
@click.option("--dry-run", is_flag=True, help="Print the diff that would be committed.")
@env_option
@pass_state
def hold(
    state: _State, app: str, reason: str, by: str | None, dry_run: bool, env_name: str | None
) -> None:
    """Keep the app on what it deploys now: write-backs and reconcile passes say held."""
    from fabrique.clients.gitea import token_from_env
    from fabrique.decisions.holds import Hold, check_text
    from fabrique.decisions.writeback import open_transport, set_hold

    site = state.site
    site.app(app)
    wanted = Hold(by=_operator(by), at=_now(), reason=check_text("--reason", reason))
    environment = _environment(site, app, env_name)
    with open_transport(site, token_from_env(), writes=not dry_run) as transport:
        outcome = set_hold(
            *(site, transport, app, wanted),
            by=wanted.by,
            dry_run=dry_run,
            environment=environment,
        )
    if outcome.diff:
        click.echo(outcome.diff, nl=False)
    assert outcome.hold is not None
    if outcome.state == "unchanged":
        click.echo(f"unchanged: {app} is already {outcome.hold.describe()} ({outcome.where})")
    elif outcome.state == "would-change":
        click.echo(f"would hold: {app} ({outcome.where}, dry run)")
    else:
        click.echo(
            f"held: {app} {outcome.hold.describe()} ({outcome.where}, commit {outcome.commit})"
        )


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@by_option
@click.option("--dry-run", is_flag=True, help="Print the diff that would be committed.")
@env_option
@pass_state
def release(state: _State, app: str, by: str | None, dry_run: bool, env_name: str | None) -> None:
    """Lift the app's hold: the next write-back or reconcile pass rolls it forward."""
    from fabrique.clients.gitea import token_from_env
    from fabrique.decisions.writeback import open_transport, set_hold

    site = state.site
    site.app(app)
    environment = _environment(site, app, env_name)
    with open_transport(site, token_from_env(), writes=not dry_run) as transport:
        outcome = set_hold(
            *(site, transport, app, None),
            by=_operator(by),
            dry_run=dry_run,
            environment=environment,
        )
    if outcome.diff:
        click.echo(outcome.diff, nl=False)
    was = f"; it was {outcome.previous.describe()}" if outcome.previous else ""
    if outcome.still_held:
        was += f"; still held: {', '.join(outcome.still_held)} (the file-wide hold, now their own)"
    if outcome.state == "unchanged":
        click.echo(f"unchanged: {app} is not held ({outcome.where})")
    elif outcome.state == "would-change":
        click.echo(f"would release: {app} ({outcome.where}, dry run){was}")
    else:
        click.echo(f"released: {app} ({outcome.where}, commit {outcome.commit}){was}")


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@click.option("--to", "to", required=True, help="The commit to go back to (full or short sha).")
@click.option("--reason", default="", help="Why, recorded in the commit and the hold.")
@by_option
@click.option("--dry-run", is_flag=True, help="Print the diff that would be committed.")
@env_option
@pass_state
def rollback(
    state: _State,
    app: str,
    to: str,
    reason: str,
    by: str | None,
    dry_run: bool,
    env_name: str | None,
) -> None:
    """Deploy the image built for an older commit, and hold the app there."""
    from fabrique.clients.gitea import token_from_env
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.holds import Hold, check_text
    from fabrique.decisions.signature import signature_gate
    from fabrique.decisions.writeback import open_transport
    from fabrique.gestures.rollback import roll_back

    site = state.site
    site.app(app)
    wanted = Hold(by=_operator(by), at=_now(), reason=check_text("--reason", reason))
    environment = _environment(site, app, env_name)
    with (
        open_transport(site, token_from_env(), writes=not dry_run) as transport,
        RegistryClient.for_site(site) as registry,
    ):
        outcome = roll_back(
            *(site, transport, registry, app, to, wanted),
            dry_run=dry_run,
            gate=signature_gate(site, registry),
            environment=environment,
        )
    if outcome.diff:
        click.echo(outcome.diff, nl=False)
    if outcome.state == "changed":
        click.echo(
            f"rolled back: {app} {outcome.pin.reference} -> {outcome.where} "
            f"(commit {outcome.commit}); {wanted.describe()}"
        )
    elif outcome.state == "unchanged":
        click.echo(f"unchanged: {app} already deploys {outcome.pin.reference} and is held")
    else:
        click.echo(outcome.line())


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@click.option("--to", "to", required=True, help="The environment to promote into (prod).")
@click.option(
    "--revision",
    help="The commit whose image to promote: it must be the one the environment before runs.",
)
@click.option("--dry-run", is_flag=True, help="Check, and print the diff; write nothing.")
@pass_state
def promote(state: _State, app: str, to: str, revision: str | None, dry_run: bool) -> None:
    """Give an environment the digest that passed in the one before it: no rebuild."""
    from fabrique.clients.gitea import GiteaClient, token_from_env
    from fabrique.clients.kube import KubeClient
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.signature import signature_gate
    from fabrique.decisions.status import StatusReporter
    from fabrique.decisions.writeback import open_transport
    from fabrique.gestures.promote import look_after
    from fabrique.gestures.promote import promote as promote_gesture

    site = state.site
    site.app(app)
    token = token_from_env()

    def kube_for(target: str) -> KubeClient:
        return KubeClient.for_site(site, site.targets[target].context)

    with (
        open_transport(site, token, writes=not dry_run) as transport,
        GiteaClient.for_site(site, token) as gitea,
        RegistryClient.for_site(site) as registry,
    ):
        outcome = promote_gesture(
            *(site, transport, StatusReporter(site, gitea, token), registry),
            kube_for,
            *(app, to),
            revision=revision,
            dry_run=dry_run,
            gate=signature_gate(site, registry),
        )
    if outcome.diff:
        click.echo(outcome.diff, nl=False)
    if outcome.state == "changed":
        click.echo(
            f"promoted: {app} {outcome.pin.reference} -> {to} {outcome.where} "
            f"(commit {outcome.commit})"
        )
        config = site.app(app)
        looking = look_after(site, kube_for, config, config.environment(to)[0], outcome)
        if looking:
            click.echo(looking)
    else:
        click.echo(outcome.line())


@cli.command()
@click.option("--app", required=True, help="App name from the site config.")
@click.option("--env", "env_name", required=True, help="The environment to verify (bench).")
@click.option("--dry-run", is_flag=True, help="Look and say; post nothing, write nothing.")
@click.option(
    "--wait",
    is_flag=True,
    help="Look again every 5 s while it is verifying, until its verdict (bounded by "
    "verify.timeout and verify.soak).",
)
@click.option(
    "--in-cluster",
    is_flag=True,
    help="Read the cluster this runs in, with its pod's account (the build's "
    "verify-deploy step); the environment's target must be inCluster.",
)
@kube_context_option
@pass_state
def verify(
    state: _State,
    app: str,
    env_name: str,
    dry_run: bool,
    wait: bool,
    in_cluster: bool,
    kube_context: str | None,
) -> None:
    """Look at an environment: does the digest its target deploys run well there?

    Posts fabrique/<app>/<env>/verified on the built commit (verifying, verified, or
    failed with why); a failure does what verify.onFailure says (rollback, hold, none)
    and exits 8. A digest already judged is said and left alone. Each pass of the safety
    net does the same for every environment of its own cluster.
    """
    import time

    from fabrique.clients.gitea import GiteaClient, token_from_env
    from fabrique.clients.kube import KubeClient
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.reconcile import AppResult
    from fabrique.decisions.signature import signature_gate
    from fabrique.decisions.status import StatusReporter
    from fabrique.decisions.writeback import open_transport
    from fabrique.gestures.verify import VERIFY_EVERY, verify_environment
    from fabrique.site.errors import RemoteError

    site = state.site
    config = site.app(app)
    environment = config.environment(env_name, option="--env")[0]
    token = token_from_env()
    # the verdict comes by the timeout (from the first look) and the soak after it
    bound = site.verify_of(config, environment).verdict_within()
    deadline = time.monotonic() + bound.total_seconds() + 60
    with (
        open_transport(site, token, writes=not dry_run) as transport,
        GiteaClient.for_site(site, token) as gitea,
        RegistryClient.for_site(site) as registry,
    ):
        target = site.targets[environment.target]
        if in_cluster and not target.in_cluster:
            raise InputError(
                f"--in-cluster: environment {env_name} deploys through target "
                f"{environment.target}, which is not inCluster"
            )
        kube = KubeClient.for_site(site, None if in_cluster else kube_context or target.context)
        while True:
            try:
                result = verify_environment(
                    *(site, transport, StatusReporter(site, gitea, token), registry, kube),
                    *(config, environment),
                    dry_run=dry_run,
                    gate=signature_gate(site, registry),
                )
            except NotPassed as err:
                if not wait:
                    raise
                # nothing deploys it yet (its Application is made after the first
                # promotion): no verdict, no status; looked at again until the bound
                result = AppResult(f"{app}/{env_name}", "verifying", str(err))
            if not wait or result is None or result.state != "verifying":
                break
            if time.monotonic() >= deadline:
                raise RemoteError(
                    f"{app}/{env_name}: still verifying: {result.detail}", transient=True
                )
            click.echo(f"{result.app}: {result.state}: {result.detail}", err=True)
            time.sleep(VERIFY_EVERY)
    from fabrique.gestures.verify import FAILED_VERIFICATION

    if result is None:
        click.echo(f"{app}/{env_name}: judged: its digest is verified or failed already")
        return
    click.echo(f"{result.app}: {result.state}: {result.detail}")
    if result.state.removeprefix("would-") in FAILED_VERIFICATION:
        click.get_current_context().exit(NotPassed.exit_code)


@cli.command("seed-webhook")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option("--rotate", is_flag=True, help="Write the bearer token again.")
@pass_state
def seed_webhook_command(state: _State, dry_run: bool, rotate: bool) -> None:
    """Make sure the code repository has exactly one webhook #2 to the EventSource.

    The bearer token comes from FABRIQUE_WEBHOOK_TOKEN (the value of the Secret the
    EventSource checks), the Gitea token from FABRIQUE_GITEA_TOKEN. Neither is ever
    printed. No HMAC secret is set: the EventSource checks the bearer header, and nothing
    could check X-Gitea-Signature.
    """
    from fabrique.clients.gitea import GiteaClient
    from fabrique.gestures.webhook import Credentials, allowed_host_notice, seed_webhook

    site = state.site
    credentials = Credentials.from_env()
    with GiteaClient.for_site(site) as gitea:
        actions = seed_webhook(site, gitea, credentials, dry_run=dry_run, rotate=rotate)
    for action in actions:
        click.echo(action.line(dry_run))
    click.echo(f"notice: {allowed_host_notice(site)}", err=True)


@contextmanager
def _reconciler(site: Site, kube_context: str | None, *, writes: bool) -> Iterator[Reconciler]:
    from fabrique.clients.gitea import GiteaClient, token_from_env
    from fabrique.clients.kube import KubeClient
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.memory import ConfigMapMemory
    from fabrique.decisions.reconcile import Reconciler
    from fabrique.decisions.status import StatusReporter
    from fabrique.decisions.writeback import open_transport

    kube = KubeClient.for_site(site, kube_context)
    memory = ConfigMapMemory(kube, site.namespaces.control)  # beside the reconciler
    token = token_from_env()
    with (
        open_transport(site, token, writes=writes) as transport,  # reading needs no key
        RegistryClient.for_site(site) as registry,
        GiteaClient.for_site(site, token) as gitea,
    ):
        statuses = StatusReporter(site, gitea, token)
        yield Reconciler(site, transport, registry, kube, memory, statuses)


@cli.command()
@click.option("--app", help="Only this app (default: every app of the site).")
@click.option("--dry-run", is_flag=True, help="Decide and say; take no action.")
@click.option(
    "--counts",
    type=click.Path(path_type=Path),
    help="Also write how many apps got each decision here, one file per decision.",
)
@kube_context_option
@pass_state
def reconcile(
    state: _State, app: str | None, dry_run: bool, counts: Path | None, kube_context: str | None
) -> None:
    """Converge every app on the image of the last commit that changed it (the safety net).

    One line per app (ok, held, in-flight, written-back, submitted, failed, error), one
    per environment it promotes into (promote: auto; promoted, waiting, held), then a
    summary. Exits non-zero only when a check itself failed.
    """
    from fabrique.decisions.plan import write_files
    from fabrique.decisions.reconcile import (
        AppResult,
        decision_counts,
        raise_for_errors,
        selected,
        summary,
    )
    from fabrique.decisions.review import pause_merges
    from fabrique.gestures.promote import auto_promote
    from fabrique.gestures.verify import auto_verify

    site = state.site
    apps = selected(site, app)
    with _reconciler(site, kube_context, writes=not dry_run) as reconciler:
        # no merge Gitea would make on its own may fall into a freeze window
        results = [
            AppResult(name, "frozen", said)
            for name, said in ([] if dry_run else pause_merges(site, reconciler.transport, apps))
        ]
        results += reconciler.run(apps, "dry-run" if dry_run else "act")
        if reconciler.statuses is not None:
            # what its environments deploy is judged before anything goes further
            results += auto_verify(
                *(site, reconciler.transport, reconciler.statuses, reconciler.registry),
                reconciler.kube,
                apps,
                dry_run=dry_run,
            )
            results += auto_promote(
                *(site, reconciler.transport, reconciler.statuses, reconciler.registry),
                reconciler.kube,
                apps,
                dry_run=dry_run,
            )
    for result in results:
        click.echo(f"{result.app}: {result.state}: {result.detail}")
    click.echo(summary(results))
    if counts is not None:  # before raising: a pass with errors is counted too
        counted = {decision: str(n) for decision, n in decision_counts(results).items()}
        write_files(counts, counted, "--counts")
    raise_for_errors(results)


@cli.command()
@click.option("--app", help="Only this app (default: every app of the site).")
@click.option(
    "--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@kube_context_option
@pass_state
def status(state: _State, app: str | None, output: str, kube_context: str | None) -> None:
    """Is prod on the commit I pushed? Want, deployed, built and in-flight, per app. Read-only.

    Every app gets its row. An app whose facts could not be read (its target or an
    environment's, a server that failed) is an error row that says why, and the others
    are shown; the exit code is then non-zero when any row is an error: 75 when each
    of them may pass on a later run (a server unreachable, 5xx), else 3.
    """
    from dataclasses import asdict, replace

    from fabrique.decisions.reconcile import error_result, raise_for_errors, selected, table
    from fabrique.gestures.promote import Stage, stage_line, stages
    from fabrique.gestures.verify import verification_of

    site = state.site
    apps = selected(site, app)  # an unknown app is named before the cluster is asked
    with _reconciler(site, kube_context, writes=False) as reconciler:
        results = reconciler.run(apps, "status")
        # each environment of an app that has them: what it deploys, what waits for it;
        # one that cannot be read makes its app's row an error, not the whole table's
        staged: dict[str, list[Stage]] = {}
        for index, a in enumerate(apps):
            if not a.environments:
                continue
            try:
                staged[a.name] = [
                    replace(
                        stage,
                        verified=verification_of(
                            site, reconciler.transport, reconciler.statuses, a, stage
                        )
                        if reconciler.statuses is not None
                        else None,
                    )
                    for stage in stages(site, reconciler.transport, a)
                ]
            except FabriqueError as err:
                if results[index].state != "error":
                    results[index] = replace(error_result(a.name, err), facts=results[index].facts)
    if output == "json":
        click.echo(
            json.dumps(
                [
                    {
                        **r.as_dict(),
                        **(
                            {"environments": [asdict(s) for s in staged[r.app]]}
                            if r.app in staged
                            else {}
                        ),
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    else:
        for line in table(results, _short):
            click.echo(line)
        for name, found in staged.items():
            click.echo(stage_line(name, found, _short))
    raise_for_errors(results)


def _short(value: str | None) -> str:
    if not value:
        return "-"
    return value[:19] if value.startswith("sha256:") else value[:12]


@cli.group(invoke_without_command=True)
@click.option("--component", "-c", help="Only this component or spec of vendor/lock.yaml.")
@click.option("--update", is_flag=True, help="Accept a new bundle or digest and rewrite the lock.")
@click.option("--check", "check_only", is_flag=True, help="Offline: vendor/ must match the lock.")
@click.option("--dir", "root", default="vendor", show_default=True, type=click.Path(path_type=Path))
@click.option(
    "--plain-http",
    multiple=True,
    metavar="HOST",
    help="A registry reached over plain HTTP (repeatable), such as a local mirror.",
)
@click.pass_context
def vendor(
    ctx: click.Context,
    component: str | None,
    update: bool,
    check_only: bool,
    root: Path,
    plain_http: tuple[str, ...],
) -> None:
    """Vendor the upstream bundles, every image pinned by its multi-arch index digest."""
    from fabrique.gestures import vendor as vendoring

    lock = vendoring.load_lock(root)
    specs = vendoring.load_specs(root)
    if component is not None and component not in lock and component not in specs:
        raise InputError(
            f"--component {component!r}: not in {root}/{vendoring.LOCK} "
            f"({', '.join([*lock, *specs])})"
        )
    if ctx.invoked_subcommand:
        return
    if check_only:
        problems = vendoring.check(root, component)
        for problem in problems:
            click.echo(("notice: " if vendoring.pending([problem]) else "") + problem, err=True)
        if not vendoring.pending(problems):
            raise vendoring.VendorError(f"{root}: {len(problems)} problem(s), see above")
        click.echo(f"{root}: matches {vendoring.LOCK}")
        return
    site = ctx.ensure_object(_State).site
    # image sets first: argo-events' controller config takes the JetStream pins
    order = sorted(lock.values(), key=lambda c: c.url is not None)
    resolver = vendoring.Resolver(frozenset(plain_http), retry=site.network.retry_policy())
    try:
        for entry in order:
            if component in (None, entry.name):
                for line in vendoring.vendor_component(
                    root,
                    entry,
                    lock,
                    resolver,
                    update=update,
                    # the lock's image set: the version the EventBus takes by default
                    jetstream_version=lock["jetstream"].version if "jetstream" in lock else None,
                ):
                    click.echo(line)
                vendoring.save_lock(root, lock, specs)
    finally:
        resolver.close()
    for spec in specs.values():
        if component in (None, spec.name):
            click.echo(vendoring.vendor_spec(root, spec, update=update))
            vendoring.save_lock(root, lock, specs)


@vendor.command("mirror")
@click.option("--to", "target", required=True, metavar="HOST", help="The internal registry.")
@click.pass_context
def vendor_mirror(ctx: click.Context, target: str) -> None:
    """Copy every pinned image, all platforms, digests unchanged, into the internal registry."""
    from fabrique.gestures import vendor as vendoring

    params = ctx.parent.params if ctx.parent else {}
    site = ctx.ensure_object(_State).site
    plain = frozenset(params.get("plain_http") or ())
    lock = vendoring.load_lock(params.get("root") or Path("vendor"))
    if params.get("component"):  # a spec has no image: then nothing is left to mirror
        lock = {name: entry for name, entry in lock.items() if name == params["component"]}
    resolver = vendoring.Resolver(plain, retry=site.network.retry_policy())
    plain_target = target in plain or (target == site.registry.host and site.registry.plain_http)
    try:
        for line in vendoring.mirror(lock, target, resolver, plain_http_target=plain_target):
            click.echo(line)
    finally:
        resolver.close()


@cli.group()
def mirror() -> None:
    """Gitea pull mirrors of the upstream repositories."""


@mirror.command("ensure")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@pass_state
def mirror_ensure(state: _State, dry_run: bool) -> None:
    """Create or repair every pull mirror the site lists (Gitea's migrate API)."""
    from fabrique.clients.gitea import GiteaClient
    from fabrique.gestures.mirrors import ensure

    site = state.site
    with GiteaClient.for_site(site) as gitea:
        for entry in site.mirrors:
            click.echo(ensure(site, gitea, entry, dry_run=dry_run).line(dry_run))


@mirror.command("sync")
@pass_state
def mirror_sync(state: _State) -> None:
    """Ask Gitea to pull every mirror now (what the gitea-mirror-sync CronWorkflow runs)."""
    from fabrique.clients.gitea import GiteaClient
    from fabrique.gestures.mirrors import sync

    site = state.site
    with GiteaClient.for_site(site) as gitea:
        for entry in site.mirrors:
            click.echo(sync(gitea, entry).line())


@cli.group()
def lint() -> None:
    """Check what fabrique does not write but depends on."""


@lint.command("apps")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option(
    "--specs",
    metavar="DIR",
    help="Upstream specs (default: the copy shipped with fabrique; env FABRIQUE_SPECS).",
)
@pass_state
def lint_apps_command(state: _State, directory: Path, specs: str | None) -> None:
    """Argo CD Applications of a cluster/apps checkout: CRD-valid, from Gitea, by digest."""
    from fabrique.gestures.lint import lint_apps

    from .validate import find_specs

    problems = lint_apps(directory, state.site, find_specs(specs))
    if problems:
        raise ValidationFailed(problems)
    click.echo(f"{directory}: every Application is valid, from Gitea, pinned by digest")


@cli.command()
@click.option("--app", required=True, help="The app to seed.")
@click.option("--target", default="prod", show_default=True, help="Site target (targets.<name>).")
@kube_context_option
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@pass_state
def seed(
    state: _State, app: str, target: str, kube_context: str | None, dry_run: bool, yes: bool
) -> None:
    """The operator gesture: image by digest, write-back, Secrets, webhook, Application.

    Refuses any kube context but the target's, before anything else. Prints the plan,
    asks (unless --yes), then one line per step: changed, unchanged or skipped.
    """
    from fabrique.clients.gitea import GiteaClient, token_from_env
    from fabrique.clients.kube import KubeClient, kubeconfig_context
    from fabrique.clients.registry import RegistryClient
    from fabrique.decisions.writeback import open_transport
    from fabrique.gestures.seed import (
        Seeder,
        check_target,
        gitea_admin_token,
        seeded_environments,
    )
    from fabrique.gestures.webhook import Credentials, allowed_host_notice

    from .validate import Schemas, find_specs

    site = state.site
    app_config = site.app(app)
    context = kubeconfig_context(kube_context)
    check_target(site, target, context)
    environments = seeded_environments(app_config, target)
    credentials = Credentials.from_env()
    kube = KubeClient.for_site(site, context)
    token = token_from_env() or gitea_admin_token(kube, site)
    schemas = Schemas(find_specs())
    with (
        GiteaClient.for_site(site, token) as gitea,
        open_transport(site, token) as transport,
        RegistryClient.for_site(site) as registry,
    ):
        seeder = Seeder(
            site,
            app_config,
            kube=kube,
            gitea=gitea,
            transport=transport,
            registry=registry,
            webhook=credentials,
            specs_schemas=schemas,
            target=target,
            environments=environments,
        )
        plan = seeder.run(dry_run=True)
        click.echo(f"plan for {app} on {target} ({context}):")
        for step in plan:
            click.echo(f"  {step.line()}")
        notice = f"notice: {allowed_host_notice(site, seeder.argo_cd_urls())}"
        if dry_run:
            click.echo(notice, err=True)
            return
        if any(step.state == "changed" for step in plan) and not yes:
            click.confirm("apply?", abort=True, err=True)
        for step in seeder.run(dry_run=False):
            click.echo(step.line())
            if step.state == "missing":
                click.echo(f"warning: {step.name}: {step.detail}", err=True)
    click.echo(notice, err=True)


@cli.command("derive-secrets")
@click.option("--app", help="Only the derivations of this app.")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@kube_context_option
@pass_state
def derive_secrets(state: _State, app: str | None, dry_run: bool, kube_context: str | None) -> None:
    """Make the declared Secrets from their sources; the same content makes no change."""
    from fabrique.clients.kube import KubeClient
    from fabrique.gestures.secrets import derive, wanted

    site = state.site
    if app is not None:
        site.app(app)  # an unknown app is named before the cluster is asked anything
    derivations = wanted(site, app)
    if not derivations:
        scope = f" for app {app}" if app else ""
        click.echo(f"nothing declared: the site lists no derivedSecrets{scope}")
        return
    kube = KubeClient.for_site(site, kube_context)
    for derivation in derivations:
        result = derive(kube, derivation, dry_run=dry_run)
        prefix = "would be " if dry_run and result.state == "changed" else ""
        click.echo(f"{prefix}{result.state}: Secret {result.target} ({result.detail})")


@cli.group()
def doctor() -> None:
    """Diagnose the platform pieces fabrique depends on."""


@doctor.command("eventbus")
@click.option("--url", required=True, help="nats://host:4222 (or tls://) of the EventBus.")
@click.option("--creds", type=click.Path(path_type=Path), help="NATS creds file.")
@click.option("--tls-ca", type=click.Path(path_type=Path), help="CA of the EventBus's TLS.")
def doctor_eventbus(url: str, creds: Path | None, tls_ca: Path | None) -> None:
    """Report the JetStream stream and consumers; fail if the Sensor's consumer is missing.

    The client auth comes from FABRIQUE_NATS_CLIENT_AUTH: the Secret
    eventbus-default-js-client-auth's client-auth as it is (a user and a password), or
    from FABRIQUE_NATS_TOKEN for a bus with a bare token.
    """
    import os

    from fabrique.gestures.doctor import ClientAuth, inspect
    from fabrique.site.errors import RemoteError

    auth = ClientAuth.parse(
        os.environ.get("FABRIQUE_NATS_CLIENT_AUTH"), os.environ.get("FABRIQUE_NATS_TOKEN")
    )
    report = inspect(url, auth=auth, creds=creds, tls_ca=tls_ca)
    for line in report.lines():
        click.echo(line)
    if report.errors:
        raise RemoteError(f"EventBus at {url}: {len(report.errors)} problem(s), see above")


@doctor.command("leftovers")
@kube_context_option
@pass_state
def doctor_leftovers(state: _State, kube_context: str | None) -> None:
    """Name each object in the cluster that an earlier render made and this one does not.

    ``kubectl apply -k`` never deletes: after a site shrinks or its Sensors are split
    anew, the old objects stay (a Sensor still triggering). Exits 1 when there is any.
    """
    from fabrique.clients.kube import KubeClient
    from fabrique.gestures.doctor import leftovers
    from fabrique.site.objects import RENDERED

    from .render import render_tree

    rendered = [doc for docs in render_tree(state.site).values() for doc in docs]
    kube = KubeClient.for_site(state.site, kube_context)
    found = leftovers(rendered, lambda version, plural: kube.labelled(version, plural, RENDERED))
    for leftover in found:
        click.echo(leftover.line())
    if found:
        raise FabriqueError(
            f"{len(found)} object(s) in the cluster that render no longer makes, see above"
        )
    click.echo("ok: the cluster holds no object of an earlier render")


@cli.group()
def config() -> None:
    """The effective site config."""


@config.command("show")
@pass_state
def config_show(state: _State) -> None:
    """Print the site config after the values file and FABRIQUE_* overrides."""
    from .render import dump_documents

    click.echo(dump_documents([state.site.to_values()], header=False), nl=False)


def main() -> None:
    cli(prog_name="fabrique")
