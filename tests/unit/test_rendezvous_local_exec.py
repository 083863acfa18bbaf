"""The simulated kubelet's process mode, its pure parts: what a pod's process is given.

Its environment as a kubelet builds it, the hosts file that lets it find its own gang (and no other
namespace's pods), and the downward API files it mounts. The process itself is run end to end by
tests/e2e/test_rendezvous.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from clusters.sim import local_exec


def a_pod(name: str, namespace: str = "gpufed-nlp", subdomain: str | None = "job", **notes: str) -> Any:
    spec: dict[str, Any] = {"hostname": name, "nodeName": "n1"}
    if subdomain is not None:
        spec["subdomain"] = subdomain
    return {
        "metadata": {
            "name": f"{name}-x1",
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": notes,
        },
        "spec": spec,
        "status": {"podIP": "10.244.0.7"},
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("$(A):$(B)", "host:29500", id="defined-names"),
        pytest.param("$(MISSING)", "$(MISSING)", id="undefined-stays"),
        pytest.param("$$(A)", "$(A)", id="escaped"),
        pytest.param("$A", "$A", id="shell-syntax-is-not-kubernetes"),
    ],
)
def test_expand_follows_kubernetes(text: str, expected: str) -> None:
    assert local_exec.expand(text, {"A": "host", "B": "29500"}) == expected


def test_env_resolves_values_field_refs_and_earlier_names() -> None:
    pod = a_pod("job-0", **{"batch.kubernetes.io/job-completion-index": "0"})
    container = {
        "env": [
            {"name": "PORT", "value": "29500"},
            {"name": "ENDPOINT", "value": "$(MASTER):$(PORT)"},  # MASTER is later: not expanded
            {"name": "MASTER", "value": "job-0.job"},
            {
                "name": "INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            },
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "MISSING", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['nope']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
            {"name": "PORT", "value": "1"},  # a later entry wins
        ]
    }
    assert local_exec.container_env(pod, container) == {
        "PORT": "1",
        "ENDPOINT": "$(MASTER):29500",
        "MASTER": "job-0.job",
        "INDEX": "0",
        "IP": "10.244.0.7",
        "MISSING": "",
    }


def test_hosts_resolve_the_gang_in_its_namespace_only() -> None:
    me = a_pod("job-0")
    peer = a_pod("job-1")
    other_job = a_pod("other-0", subdomain="other")
    other_tenant = a_pod("job-1b", namespace="gpufed-vision")
    no_subdomain = a_pod("lonely", subdomain=None)
    hosts = local_exec.hosts_file(me, [peer, other_job, other_tenant, no_subdomain])
    names = {name for line in hosts.splitlines() for name in line.split()[1:]}
    assert {"job-0", "job-0.job", "job-0.job.gpufed-nlp.svc.cluster.local", "job-1.job"} <= names
    assert "job-1.job.gpufed-nlp.svc.cluster.local" in names
    assert not any(n.startswith(("other-0", "job-1b", "lonely")) for n in names)
    assert all(line.split()[0] in ("127.0.0.1", "::1") for line in hosts.splitlines())


def test_downward_api_files_mounted_under_etc_are_written() -> None:
    pod = a_pod("job-0", **{"gpufed.io/hostfile": "job-0.job slots=2\n"})
    pod["spec"]["volumes"] = [
        {
            "name": "gpufed-hostfile",
            "downwardAPI": {
                "items": [
                    {
                        "path": "hostfile",
                        "fieldRef": {"fieldPath": "metadata.annotations['gpufed.io/hostfile']"},
                    }
                ]
            },
        },
        {"name": "scratch", "emptyDir": {}},
    ]
    container = {
        "volumeMounts": [
            {"name": "gpufed-hostfile", "mountPath": "/etc/gpufed"},
            {"name": "scratch", "mountPath": "/scratch"},
        ]
    }
    files = local_exec._mounted_files(pod, container)
    assert files == {"/etc/gpufed/hostfile": "job-0.job slots=2\n"}
