"""The rendered ValidatingAdmissionPolicy, evaluated as the API server evaluates it.

Its CEL runs with cel-python over the Workflow as JSON; a rule that errors refuses too,
as ``failurePolicy: Fail`` does. The refusal reads as the real API server words it (held
to it by ``tests/test_kube_contract.py``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import celpy

from ..manifests import find


class Admission:
    def __init__(self, tree: Path, name: str = "fabrique-build-workflows") -> None:
        self.policy = find(tree, "ValidatingAdmissionPolicy", name)
        self.binding = find(tree, "ValidatingAdmissionPolicyBinding", name)
        labels = self.binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]
        self.namespace = labels["kubernetes.io/metadata.name"]
        env = celpy.Environment()
        self.rules = [
            (env.program(env.compile(v["expression"])), v["message"])
            for v in self.policy["spec"]["validations"]
        ]

    def refusals(self, workflow: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
        """The messages of the rules ``workflow`` breaks, in the policy's order (an
        UPDATE's: ``old`` is the Workflow as it was)."""
        activation = {"object": celpy.json_to_cel(workflow)}
        if old is not None:
            activation["oldObject"] = celpy.json_to_cel(old)
        refused = []
        for program, message in self.rules:
            try:
                result = program.evaluate(activation)
            except celpy.CELEvalError:
                result = None
            if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
                refused.append(message)
        return refused

    def denial(self, namespace: str, workflow: dict[str, Any]) -> str | None:
        """The API server's message when it refuses ``workflow`` in ``namespace``."""
        if namespace != self.namespace:
            return None
        refused = self.refusals(workflow)
        if not refused:
            return None
        name = workflow.get("metadata", {}).get("name", "")
        policy, binding = self.policy["metadata"]["name"], self.binding["metadata"]["name"]
        return (
            f'workflows.argoproj.io "{name}" is forbidden: ValidatingAdmissionPolicy '
            f"'{policy}' with binding '{binding}' denied request: {refused[0]}"
        )


@functools.cache
def admission_of(tree: Path) -> Admission:
    """The policy of ``tree``, read and compiled once: every Kubernetes double of the
    suite evaluates the same one."""
    return Admission(tree)
