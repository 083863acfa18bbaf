"""The simulated kubelet's process mode, its pure parts: what a pod's process is given.

Its environment as a kubelet builds it, the hosts file that lets it find its own gang (and no other
namespace's pods), and the downward API files it mounts. The process itself is run end to end by
tests/e2e/test_rendezvous.py.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from clusters.sim import ManualClock, SimPoolConfig, cluster, local_exec
from clusters.sim.engine import Engine
from clusters.sim.resources import PODS
from tests.waits import until

Obj = dict[str, Any]


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


def test_secret_env_is_read_from_the_pods_own_namespace_as_a_kubelet_does() -> None:
    pod = a_pod("job-0")
    secrets = {
        ("gpufed-nlp", "job-creds"): {"hf.token": "hf_abc", "tracker.API_KEY": "k1"},
        ("gpufed-vision", "job-creds"): {"hf.token": "someone else's"},
    }
    container = {
        "envFrom": [{"secretRef": {"name": "job-creds"}, "prefix": "S_"}],
        "env": [
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "job-creds", "key": "hf.token"}}},
            {"name": "S_hf.token", "value": "env wins over envFrom"},
            {"name": "GONE", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}},
        ],
    }
    env = local_exec.container_env(pod, container, lambda ns, name: secrets.get((ns, name)))
    assert env == {"S_hf.token": "env wins over envFrom", "S_tracker.API_KEY": "k1", "HF_TOKEN": "hf_abc"}


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


needs_namespaces = pytest.mark.skipif(local_exec.available() is not None, reason=str(local_exec.available()))


def an_engine() -> Engine:
    config = cluster("u", (SimPoolConfig.of("a100", "A100", node_count=1),), local_exec=True)
    return Engine(config, ManualClock())


def a_process_pod(name: str, script: str, **notes: str) -> Obj:
    return {
        "metadata": {"name": name, "annotations": notes},
        "spec": {
            "restartPolicy": "Never",
            "hostname": name,
            "subdomain": "gang",
            "containers": [
                {
                    "name": "main",
                    "image": "i",
                    "command": ["/bin/sh", "-c", script],
                    "env": [
                        {"name": "PEER", "value": "peer-0.gang"},
                        {"name": "GREETING", "value": "hello $(PEER)"},
                    ],
                    "volumeMounts": [{"name": "rdv", "mountPath": "/etc/gpufed", "readOnly": True}],
                }
            ],
            "volumes": [
                {
                    "name": "rdv",
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "hostfile",
                                "fieldRef": {"fieldPath": "metadata.annotations['gpufed.io/hostfile']"},
                            }
                        ]
                    },
                }
            ],
        },
    }


def printed(engine: Engine, pod: Obj) -> list[str]:
    (run,) = engine.logs.runs(pod["metadata"]["uid"], "main")
    return [text for _, text in run.lines(engine.clock.wall_s() + 1e9, 1 << 20)]


def state(engine: Engine, name: str) -> Obj:
    current = engine.store.require(PODS, "default", name)
    statuses = (current.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0].get("state") or {})


@needs_namespaces
async def test_process_mode_runs_the_command_with_the_pods_env_files_and_names() -> None:
    engine = an_engine()
    engine.store.create(
        PODS, engine.admission.admit_create(PODS, a_process_pod("peer-0", "sleep 30"), "default")
    )
    script = 'echo "$GREETING"; cat /etc/gpufed/hostfile; hostname; getent hosts peer-0.gang; exit 3'
    body = a_process_pod("me-0", script, **{"gpufed.io/hostfile": "me-0.gang slots=1\npeer-0.gang slots=1\n"})
    pod = engine.store.create(PODS, engine.admission.admit_create(PODS, body, "default"))

    def ended() -> bool:
        engine.reconcile()
        return "terminated" in state(engine, "me-0")

    try:
        await until(ended, "the process exited", timeout_s=30)
        assert state(engine, "me-0")["terminated"]["exitCode"] == 3
        lines = printed(engine, pod)
        assert "hello peer-0.gang" in lines
        assert "me-0.gang slots=1" in lines
        assert "peer-0.gang slots=1" in lines
        assert "me-0" in lines  # the pod's host name
        assert any(line.startswith("127.0.0.1") and "peer-0.gang" in line for line in lines)
        assert lines[-1] == "[sim] exited with code 3 (Error)"
    finally:
        engine.kubelet.close()  # and the peer's `sleep` with it


@needs_namespaces
async def test_deleting_a_pod_kills_its_process() -> None:
    engine = an_engine()
    body = a_process_pod("me-0", "echo pid $$$$; exec sleep 60")  # `$$` is Kubernetes' `$`
    pod = engine.store.create(PODS, engine.admission.admit_create(PODS, body, "default"))

    def pid() -> int | None:
        engine.reconcile()
        runs = engine.logs.runs(pod["metadata"]["uid"], "main")
        found = (
            [t for _, t in runs[0].lines(engine.clock.wall_s() + 1e9, 1 << 20) if t.startswith("pid ")]
            if runs
            else []
        )
        return int(found[0].split()[1]) if found else None

    await until(lambda: pid() is not None, "the process printed its pid", timeout_s=30)
    number = pid()
    assert number is not None
    assert alive(number)
    engine.lifecycle.delete(PODS, "default", "me-0")
    engine.reconcile()
    await until(lambda: not alive(number), "the process was killed", timeout_s=30)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead too: it waits only for its parent (unshare, killed with it) to reap it.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone between the kill and the read: reaped, so dead (a read of a vanished pid's stat
        # raises ESRCH rather than ENOENT once the file was open).
        return False
