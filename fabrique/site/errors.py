"""The one exception tree of fabrique.

Every error a user can meet says what failed, the value that was wrong and what to do.
The CLI maps each branch to an exit code (``exit_code``) and prints ``str(err)`` on one
line; nothing else reaches the terminal.

    FabriqueError                  1  anything fabrique raises on purpose
    ├── ConfigError                2  the site config (values file, FABRIQUE_* variables)
    ├── InputError                 2  a command-line value: app, revision, digest, path
    │   └── TargetError               a write-back target file that cannot be edited
    ├── RemoteError                3  a server answered wrongly (75 when ``transient``:
    │   │                             unreachable, timed out, 5xx, conflicts that outlast
    │   │                             every retry; running again later may succeed)
    │   ├── RegistryError             the OCI registry
    │   │   └── ImageNotFound         a tag or digest the registry does not hold
    │   ├── GiteaError                the Gitea API
    │   ├── GitError                  a git server, through the git command
    │   ├── KubeError                 the Kubernetes API
    │   └── StaleWrite                someone else wrote first (Gitea 422, git non-fast-
    │                                 forward): re-read and re-apply, a bounded number of
    │                                 times
    ├── DigestMismatch             4  two digests that must be equal are not
    ├── RenderError                5  the manifest tree could not be written
    ├── ValidationFailed           6  rendered documents broke a schema or a rule
    └── ProvenanceError            8  an image does not prove that this factory built it
        │                             from that commit (labels, attestations, signature)
        └── NotPassed                 a digest to promote did not pass the environment
                                      before (its Application, its checks)
"""

from __future__ import annotations

import re


class FabriqueError(Exception):
    """Base of every error fabrique raises on purpose."""

    exit_code = 1


class ConfigError(FabriqueError):
    """The site config is invalid; the message starts with the field path."""

    exit_code = 2


class InputError(FabriqueError):
    """A value given on the command line is invalid."""

    exit_code = 2


class TargetError(InputError):
    """The write-back target file is not YAML, or not of the shape its kind needs."""


TRANSIENT_EXIT_CODE = 75  # EX_TEMPFAIL: the Argo step retries on this code only
# What a step's script says, on its last line, when it gives up on a transient cause:
# the exit handler's report reads it (``decisions.status``) as it reads exit code 75
TRANSIENT_SAID = "transient, worth retrying"


class RemoteError(FabriqueError):
    """A remote system was unreachable, timed out, or answered something unusable.

    ``transient`` marks failures that a later attempt may not meet (the server was down,
    slow, or kept losing a race); they exit with 75 so that a workflow retries them and
    nothing else.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient

    @property
    def exit_code(self) -> int:  # type: ignore[override]
        return TRANSIENT_EXIT_CODE if self.transient else 3


class RegistryError(RemoteError):
    """The OCI registry failed or answered wrongly."""


class ImageNotFound(RegistryError):
    """The registry does not hold the requested tag or digest."""


class GiteaError(RemoteError):
    """The Gitea API failed or answered wrongly."""


class GitError(RemoteError):
    """A git server, reached through the git command, failed or refused."""


class KubeError(RemoteError):
    """The Kubernetes API failed or answered wrongly."""


class StaleWrite(RemoteError):
    """A write lost a race: the file or branch moved since it was read."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=True)


class DigestMismatch(FabriqueError):
    """Two digests that must be equal differ (build metadata versus registry)."""

    exit_code = 4


class ProvenanceError(FabriqueError):
    """An image's labels, attestations or signature do not name the build they must."""

    exit_code = 8


class NotPassed(ProvenanceError):
    """A promotion's digest has not passed the environment before: nothing is written."""


class RenderError(FabriqueError):
    """The manifest tree could not be written; the previous tree is left as it was."""

    exit_code = 5


class ValidationFailed(FabriqueError):
    """Rendered documents failed validation; ``problems`` lists every one."""

    exit_code = 6

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{len(problems)} validation error(s)")


# Argo's message for a failed container (operator.go, inferFailedReason): "<container>:
# <Reason> (exit code <n>)", then ": <termination message>" when there is one
_ARGO_EXIT = re.compile(r"^(?:[\w.-]+: )?(?P<reason>[A-Za-z]+) \(exit code (?P<code>\d+)\)")
# A build's pod runs its stages as the containers of one containerSet: Argo's node for
# each says "<container>: <Reason> (exit code <n>)…", and so does the pod's node, for
# one of its failed containers. A container whose stage never ran, because one before it
# failed, ends with Argo's executor saying so (cmd/argoexec/commands/emissary.go): it is
# no cause. Nor is Argo's word for a container the pod's end stopped.
_ARGO_CONTAINER = re.compile(r"^(?P<container>[\w.-]+): [A-Za-z]+ \(exit code \d+\)")
NOT_RUN = re.compile(
    r'dependency "[^"]*" exited with non-zero code|^Pod Failed whilst container running$'
)


def failed_stage(node_name: str, message: str) -> str:
    """The stage a failed node names: the container Argo's message begins with (a
    containerSet's container or pod node), else the node's own name."""
    found = _ARGO_CONTAINER.match(message.lstrip())
    return found["container"] if found else node_name


# Exit codes that blame no commit, whatever words the log ends with: 75 (EX_TEMPFAIL), a
# step's TRANSIENT_SAID (still there when the last attempt gave up), and 137, a
# container killed (out of memory, evicted).
INFRASTRUCTURE_EXITS = frozenset({TRANSIENT_EXIT_CODE, 137})


def reason_line(message: str) -> str:
    """The line of a failed step's message that says why.

    A build container's termination message is the tail of its log
    (``FallbackToLogsOnError``): fabrique's own one-line ``error: …`` when there is one,
    else the last line (buildctl's error, Argo's ``Error (exit code 1)``). What says that
    the infrastructure gave up is carried on the line: an exit code that blames no commit
    (75, 137), which Argo puts ahead of the tail (``… (exit code 75)``), and the step's own
    TRANSIENT_SAID when another line was chosen (``… (transient, worth retrying)``),
    which is all an Argo message with no exit code ahead of the tail has to say so.
    """
    argo = _ARGO_EXIT.match(message.lstrip())
    # Argo's words ahead of the tail say no cause: the tail's lines do, or those words
    # when there is no tail (a one-line tail is no longer prefixed by "<container>: …")
    exited = f"{argo['reason']} (exit code {argo['code']})" if argo else ""
    tail = message.lstrip()[argo.end() :].removeprefix(":") if argo else message
    lines = [line.strip() for line in tail.splitlines() if line.strip()] or [exited]
    errors = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    line = errors[-1] if errors else lines[-1]
    if TRANSIENT_SAID in message and TRANSIENT_SAID not in line:
        line = f"{line} ({TRANSIENT_SAID})"
    if argo is None or int(argo["code"]) not in INFRASTRUCTURE_EXITS or exited in line:
        return line
    said = f"exit code {argo['code']}"
    return f"{line} ({said})" if argo["reason"] == "Error" else f"{line} ({argo['reason']}, {said})"
