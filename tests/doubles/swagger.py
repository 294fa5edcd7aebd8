"""Checks a double's traffic against Gitea's own OpenAPI (Swagger 2.0) document.

Every request a double receives must be an operation the spec declares, with its
required parameters; every answer must use a status the operation declares (or 401/403,
which the spec's global security allows) and a body valid against the declared schema,
closed so that a field Gitea does not have is an error. This keeps the double from
drifting away from the real API without anyone noticing.

Where Gitea 1.27.3 answers outside its own document, the real server is right, and the
checker follows it (``GITEA_NULLS``, ``GITEA_EXTRA_PROPERTIES``, ``UNDECLARED``,
``check_answer``): the contract tests hold a real Gitea's answers to this checker too
(``doubles.proxy.SpecProxy``), so each exception is one the real server makes.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import jsonschema

from fabrique.validate import close_schema

GLOBAL_AUTH_STATUSES = {"401", "403"}
# statuses a handler answers that its operation does not declare (the real server is
# right): CreateHook's 422 for a config without url or content_type; MergePullRequest's
# 201 (empty) for a merge scheduled to happen when checks succeed (ScheduleAutoMerge)
UNDECLARED = {
    ("post", "/repos/{owner}/{repo}/hooks"): {"422": {"$ref": "#/responses/validationError"}},
    ("post", "/repos/{owner}/{repo}/pulls/{index}/merge"): {"201": {"$ref": "#/responses/empty"}},
}
# APIErrorInternal: any handler answers 500 with the `error` shape when git or the
# database fails (its message shown to a site admin only), declared or not
INTERNAL_ERROR = "500"


class SpecViolation(AssertionError):
    pass


def _route_regex(template: str) -> str:
    """A path template as a regex; ``{filepath}`` spans several segments, as in Gitea,
    and so do a ``{branch}`` and a pull request's ``{head}`` that end the path (their
    routes are ``/branches/*`` and ``/pulls/{base}/*``: a branch such as
    ``fabrique/citation``)."""
    parts = re.split(r"(\{[^}]+\})", template)
    spans = {"{filepath}"}
    spans |= {"{branch}"} if template.endswith("/branches/{branch}") else set()
    spans |= {"{head}"} if template.endswith("/pulls/{base}/{head}") else set()
    regex = "".join(
        (".+" if part in spans else "[^/]+") if part.startswith("{") else re.escape(part)
        for part in parts
    )
    return f"^{regex}$"


def _documented_nulls(node: Any) -> Any:
    """Swagger 2 cannot say "nullable": a Go pointer field that Gitea documents as null
    in some case ("`content` is … otherwise null") may be null, and nothing else may."""
    if isinstance(node, list):
        return [_documented_nulls(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _documented_nulls(value) for key, value in node.items()}
    kind = out.get("type")
    if isinstance(kind, str) and kind != "null" and "null" in str(out.get("description", "")):
        out["type"] = [kind, "null"]
    return out


# Where Gitea answers outside its own swagger, the real server is right (found by the
# contract tests, tests/test_gitea_contract.py, against Gitea 1.27.3):
# - a Go nil slice, map or pointer is sent as null where the spec says array or object,
#   with nothing in the description to say so;
GITEA_NULLS = {
    "PayloadCommit": ("added", "removed", "modified"),  # a branch's head commit: never filled
    "PayloadCommitVerification": ("signer",),  # an unsigned commit
    "Commit": ("author", "committer", "files", "stats"),  # no user of that email; not asked
    "RepoCommit": ("verification",),  # verification=false
    "CombinedStatus": ("statuses",),  # a commit with no status
    "ContentsResponse": ("download_url",),  # a directory's entry (of file-contents)
    # a pull request not merged, closed, assigned, labelled or asked to review
    "PullRequest": (
        *("merge_commit_sha", "merged_at", "merged_by", "closed_at", "due_date"),
        *("milestone", "assignee", "assignees", "labels"),
        *("requested_reviewers", "requested_reviewers_teams"),
    ),
}
# - a User carries `username` besides `login` (its MarshalJSON adds it, for the clients
#   of older versions).
GITEA_EXTRA_PROPERTIES = {
    "User": {"username": {"description": "the user's username, same as `login`", "type": "string"}}
}


def _as_gitea_answers(definitions: dict[str, Any]) -> dict[str, Any]:
    out = dict(definitions)
    for name, fields in GITEA_NULLS.items():
        properties = dict(out[name]["properties"])
        for field in fields:
            properties[field] = {"anyOf": [properties[field], {"type": "null"}]}
        out[name] = {**out[name], "properties": properties}
    for name, extra in GITEA_EXTRA_PROPERTIES.items():
        out[name] = {**out[name], "properties": {**out[name]["properties"], **extra}}
    return out


class Swagger:
    def __init__(self, path: Path) -> None:
        self.document = json.loads(path.read_text("utf-8"))
        self.base_path = self.document.get("basePath", "")
        self.definitions = _as_gitea_answers(
            _documented_nulls(close_schema(self.document["definitions"]))
        )
        self._routes = [
            (re.compile(_route_regex(template)), template) for template in self.document["paths"]
        ]

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any]]:
        """The path template and operation that ``method path`` (without basePath) is."""
        matches = [t for regex, t in self._routes if regex.match(path)]
        # the most specific template wins: fewest {placeholders}
        for template in sorted(matches, key=lambda t: t.count("{")):
            operation = self.document["paths"][template].get(method.lower())
            if operation is not None:
                return template, operation
        raise SpecViolation(f"{method} {path}: no such operation in the Gitea spec")

    def check_request(
        self, method: str, path: str, query: dict[str, str], body: Any | None
    ) -> None:
        template, operation = self.operation(method, path)
        for parameter in operation.get("parameters", []):
            if (
                parameter.get("in") == "query"
                and parameter.get("required")
                and parameter["name"] not in query
            ):
                raise SpecViolation(
                    f"{method} {template}: required query {parameter['name']} missing"
                )
            if parameter.get("in") == "body":
                if body is None:
                    if parameter.get("required"):
                        raise SpecViolation(f"{method} {template}: body required")
                    continue
                self._validate(parameter["schema"], body, f"{method} {template} request body")
        known = {p["name"] for p in operation.get("parameters", []) if p.get("in") == "query"}
        unknown = set(query) - known
        if unknown:
            raise SpecViolation(
                f"{method} {template}: unknown query parameter(s) {sorted(unknown)}"
            )

    def check_response(self, method: str, path: str, status: int, body: Any | None) -> None:
        template, operation = self.operation(method, path)
        responses = operation.get("responses", {}) | UNDECLARED.get((method.lower(), template), {})
        declared = responses.get(str(status))
        if declared is None:
            if str(status) in GLOBAL_AUTH_STATUSES:
                return
            if str(status) == INTERNAL_ERROR:
                declared = {"$ref": "#/responses/error"}
            else:
                raise SpecViolation(
                    f"{method} {template}: status {status} is not declared "
                    f"(declared: {sorted(responses)})"
                )
        if "$ref" in declared:
            declared = self.document["responses"][declared["$ref"].split("/")[-1]]
        schema = declared.get("schema")
        if schema is not None and body is not None:
            self._validate(schema, body, f"{method} {template} response {status}")

    def check_answer(self, method: str, path: str, status: int, body: Any | None) -> None:
        """``check_response``, but where Gitea answers outside its own swagger the real
        server is right: the contents of a directory are a list (GetContentsOrList), where
        the spec says object; file-contents lists a file it cannot read as null, as its
        description says and its schema (a list of ContentsResponse) does not."""
        if method == "GET" and "/contents/" in path and isinstance(body, list):
            return
        if method == "POST" and path.endswith("/file-contents") and isinstance(body, list):
            body = [entry for entry in body if entry is not None]
        self.check_response(method, path, status, body)

    def check_definition(self, name: str, instance: Any) -> None:
        """``instance`` against the closed definition ``name`` (e.g. ``PayloadCommit``)."""
        self._validate({"$ref": f"#/definitions/{name}"}, instance, name)

    def _validate(self, schema: dict[str, Any], instance: Any, what: str) -> None:
        validator = self._validator(json.dumps(schema, sort_keys=True))
        error = jsonschema.exceptions.best_match(validator.iter_errors(instance))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise SpecViolation(f"{what}: {where}: {error.message}")

    @functools.lru_cache(maxsize=64)  # noqa: B019 - a handful of schemas per run
    def _validator(self, schema_json: str) -> jsonschema.protocols.Validator:
        schema = close_schema(json.loads(schema_json))
        return jsonschema.Draft4Validator({**schema, "definitions": self.definitions})
