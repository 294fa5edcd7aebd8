"""The reconcile pass's memory fits its ConfigMap at 10 000 apps: the API server takes no
ConfigMap whose data passes 1 MiB, and a memory not saved costs the next pass a request
per app."""

from __future__ import annotations

import hashlib
from pathlib import Path

from kubernetes import config as k8s_config

from fabrique.clients.kube import KubeClient
from fabrique.decisions.memory import ConfigMapMemory, Memory, Remembered
from fabrique.site.limits import DATA_LIMIT, data_size
from fabrique.site.names import RECONCILE_MEMORY

from .doubles.kube import KubeApiDouble

NS = "fabrique"


def _sha(*parts: object) -> str:
    return hashlib.sha1("/".join(map(str, parts)).encode()).hexdigest()


def memory_of(apps: int) -> Memory:
    """A settled site's memory: each app's want deployed and its status reported."""
    memory = Memory("atlas/atlas", "main", _sha("head"))
    for index in range(apps):
        name, want = f"app-{index:05d}", _sha(index, "want")
        memory.apps[name] = Remembered(_sha(index, "scope")[:16], want, (want[:12], want))
        memory.reported[name] = want
    return memory


def _client(kube: KubeApiDouble, tmp_path: Path) -> KubeClient:
    kubeconfig = kube.kubeconfig(tmp_path / "kubeconfig")
    return KubeClient(k8s_config.new_client_from_config(config_file=str(kubeconfig)))


def test_the_memory_of_10_000_apps_is_saved_and_read_back(
    kube: KubeApiDouble, tmp_path: Path
) -> None:
    text = memory_of(10_000).dumps()
    assert len(text.encode()) > DATA_LIMIT  # as JSON, twice what a ConfigMap may hold
    store = ConfigMapMemory(_client(kube, tmp_path), NS)
    assert store.load() is None
    store.save(text)
    stored = kube.configmaps[(NS, RECONCILE_MEMORY)]
    assert data_size(stored) < DATA_LIMIT * 3 // 4
    assert ConfigMapMemory(_client(kube, tmp_path), NS).load() == text


def test_a_small_memory_stays_readable_json(kube: KubeApiDouble, tmp_path: Path) -> None:
    text = memory_of(3).dumps()
    ConfigMapMemory(_client(kube, tmp_path), NS).save(text)
    assert kube.configmaps[(NS, RECONCILE_MEMORY)]["data"] == {"memory.json": text}
    assert ConfigMapMemory(_client(kube, tmp_path), NS).load() == text
