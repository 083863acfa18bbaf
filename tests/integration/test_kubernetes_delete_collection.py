"""Ended gangs removed with one `deletecollection` a namespace, against a simulated cluster (issue 33).

The collector's removals were a delete call per gang, a third of a one-pod job's calls to its
cluster (bench/scale.py). `KubernetesBackend.cancel_many` removes a namespace's gangs of one kind
with one DELETE on the collection, by a label selector naming each gang and gpufed as their
manager. What these hold it to, read through the official client (the independent judge of what the
cluster holds afterwards):
- the named gangs go, in one call (an Indexed gang's headless Services with one more), and their
  Services with them;
- nothing else of the namespace goes: not a gang that was not named, nor a third party's object
  with no gpufed label, nor one that copied a named gang's label without gpufed's manager label;
- on a cluster whose account lacks the verb (joined before gpufed asked for it), the gangs still
  go, one call each, and the refusal is not asked again at once; kubectl's `auth can-i` agrees
  with the role `gpufed cluster join` grants now and with the old one;
- the simulator's `deletecollection` answers as the API server does: the official client's own
  `delete_collection_namespaced_*` removes what the selector picks and nothing else.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from clusters.api import GangPhase, GangWorkload
from clusters.kubernetes import KubernetesBackend
from clusters.kubernetes.check import Verdict, check
from clusters.kubernetes.gangs import gangs_selector
from clusters.kubernetes.inventory import GANG_LABEL
from clusters.kubernetes.names import object_name
from clusters.kubernetes.permissions import cluster_role_rules
from clusters.sim.resources import CLUSTER_ROLE_BINDINGS, CLUSTER_ROLES, NAMESPACES, SECRETS, SERVICE_ACCOUNTS
from tests.contract.conftest import POOLS, kube_config, no_leaked_threads
from tests.contract.helpers import a_gang, eventually, status_of, wait_phase
from tests.contract.simulated import running_sim
from tests.integration.kube_world import Counted, world_fixture  # noqa: F401 (the `world` fixture)

pytestmark = pytest.mark.usefixtures(no_leaked_threads.__name__)

NS = "gpufed-team-a"
VOLCANO = ("batch.volcano.sh", "v1alpha1", "jobs")
DELETES = (
    "delete_volcano_jobs",
    "delete_jobs",
    "delete_services",
    "delete_volcano_job",
    "delete_job",
    "delete_service",
)
KUBECTL = shutil.which("kubectl", path=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin")


def _third_party(name: str, labels: dict[str, str], *, volcano: bool) -> dict[str, Any]:
    """An object of the gangs' own kind that no gpufed gang is: suspended, or asking for no GPU."""
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1"}]}}
    metadata = {"name": name, "labels": labels}
    if volcano:
        return {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": metadata,
            "spec": {
                "schedulerName": "volcano",
                "minAvailable": 1,
                "tasks": [{"name": "main", "replicas": 1, "template": template}],
            },
        }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {"suspend": True, "template": template},
    }


def _names(api: Any, *, volcano: bool) -> set[str]:
    """The names of the namespace's objects of the gangs' kind, as the official client lists them."""
    if volcano:
        listed = k8s.CustomObjectsApi(api).list_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2])
        return {item["metadata"]["name"] for item in listed["items"]}
    return {j.metadata.name for j in k8s.BatchV1Api(api).list_namespaced_job(NS).items}


def _create(api: Any, body: dict[str, Any], *, volcano: bool) -> None:
    if volcano:
        k8s.CustomObjectsApi(api).create_namespaced_custom_object(*VOLCANO[:2], NS, VOLCANO[2], body)
    else:
        k8s.BatchV1Api(api).create_namespaced_job(NS, body)


async def _ended(backend: KubernetesBackend, prefix: str, count: int) -> list[GangWorkload]:
    gangs = [a_gang(f"{prefix}-{i}", replicas=1, gpus=4, duration_s=0.2) for i in range(count)]
    for gang in gangs:
        await backend.dispatch(gang)
    for gang in gangs:
        await wait_phase(backend, gang, GangPhase.SUCCEEDED)
    return gangs


async def _gone(backend: KubernetesBackend, gangs: list[GangWorkload]) -> None:
    async def all_gone() -> bool:
        return all([await status_of(backend, g) is None for g in gangs])

    await eventually(all_gone, what="the removed gangs to leave the watch")


async def test_ended_gangs_go_in_one_call_and_nothing_else_of_the_namespace_goes(
    world: tuple[KubernetesBackend, Any],
) -> None:
    backend, api = world
    volcano = bool(backend._volcano)
    removed = await _ended(backend, "dc", 3)
    (kept,) = await _ended(backend, "dc-kept", 1)
    named = [object_name(g.job_id, g.attempt) for g in removed]
    # A third party's objects of the same kind in the same namespace: one with no gpufed label, one
    # that copied a removed gang's label (and a tenant label) but is not managed by gpufed.
    await asyncio.to_thread(
        _create, api, _third_party("their-own", {"team": "ml"}, volcano=volcano), volcano=volcano
    )
    copied = {GANG_LABEL: named[0], "gpufed.io/tenant": "team-a"}
    await asyncio.to_thread(
        _create, api, _third_party("their-copy", copied, volcano=volcano), volcano=volcano
    )
    counted = Counted(backend, DELETES)

    await backend.cancel_many([(g.job_id, g.attempt) for g in removed], 0.0)

    await _gone(backend, removed)
    one_call = {"delete_volcano_jobs": 1} if volcano else {"delete_jobs": 1, "delete_services": 1}
    assert dict(counted.calls) == one_call
    left = await asyncio.to_thread(_names, api, volcano=volcano)
    assert left == {object_name(kept.job_id, kept.attempt), "their-own", "their-copy"}
    assert (await status_of(backend, kept)) is not None
    listed = await asyncio.to_thread(k8s.CoreV1Api(api).list_namespaced_service, NS)
    services = {s.metadata.name for s in listed.items}
    assert not services & set(named), "a removed gang's Service is left"
    if not volcano:
        assert object_name(kept.job_id, kept.attempt) in services, "the kept gang's Service went"


async def test_the_simulators_deletecollection_is_what_the_official_client_expects(
    world: tuple[KubernetesBackend, Any],
) -> None:
    """The official client's own deletecollection (not gpufed's request) against the simulator."""
    backend, api = world
    volcano = bool(backend._volcano)
    removed = await _ended(backend, "oc", 2)
    (kept,) = await _ended(backend, "oc-kept", 1)
    await asyncio.to_thread(
        _create, api, _third_party("bystander", {"team": "ml"}, volcano=volcano), volcano=volcano
    )
    selector = gangs_selector([object_name(g.job_id, g.attempt) for g in removed])
    if volcano:
        group, version, plural = VOLCANO
        answer = await asyncio.to_thread(
            k8s.CustomObjectsApi(api).delete_collection_namespaced_custom_object,
            group,
            version,
            NS,
            plural,
            label_selector=selector,
        )
        # The answer is the list of what was deleted, as kube-apiserver's registry answers it.
        assert answer["kind"] == "JobList"
        assert {i["metadata"]["name"] for i in answer["items"]} == {
            object_name(g.job_id, g.attempt) for g in removed
        }
    else:
        await asyncio.to_thread(
            k8s.BatchV1Api(api).delete_collection_namespaced_job,
            NS,
            label_selector=selector,
            propagation_policy="Foreground",
        )
    await _gone(backend, removed)
    assert await asyncio.to_thread(_names, api, volcano=volcano) == {
        object_name(kept.job_id, kept.attempt),
        "bystander",
    }


def _account(sim: Any, rules: list[dict[str, Any]], token: str) -> None:
    """An account `token` authenticates as, bound to a ClusterRole of `rules` (as `gpufed cluster
    join` makes one, with the rules given)."""
    store = sim.engine.store
    store.create(NAMESPACES, {"metadata": {"name": "gpufed"}})
    store.create(SERVICE_ACCOUNTS, {"metadata": {"name": "gpufed", "namespace": "gpufed"}})
    secret = {
        "metadata": {
            "name": "t",
            "namespace": "gpufed",
            "annotations": {"kubernetes.io/service-account.name": "gpufed"},
        },
        "type": "kubernetes.io/service-account-token",
        "data": {"token": base64.b64encode(token.encode()).decode()},
    }
    store.create(SECRETS, secret)
    store.create(CLUSTER_ROLES, {"metadata": {"name": "gpufed-member"}, "rules": rules})
    store.create(
        CLUSTER_ROLE_BINDINGS,
        {
            "metadata": {"name": "gpufed-member"},
            "roleRef": {"kind": "ClusterRole", "name": "gpufed-member"},
            "subjects": [{"kind": "ServiceAccount", "name": "gpufed", "namespace": "gpufed"}],
        },
    )


def _as_token(admin_kubeconfig: Path, token: str, path: Path) -> Path:
    doc = yaml.safe_load(admin_kubeconfig.read_text())
    doc["users"] = [{"name": doc["users"][0]["name"], "user": {"token": token}}]
    path.write_text(yaml.safe_dump(doc))
    return path


def _without_deletecollection(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "verbs": [v for v in r["verbs"] if v != "deletecollection"]} for r in rules]


def _can_i(kubeconfig: Path, verb: str, resource: str) -> str:
    assert KUBECTL is not None
    answer = subprocess.run(
        [KUBECTL, "--kubeconfig", str(kubeconfig), "auth", "can-i", verb, resource, "-n", NS],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return answer.stdout.strip()


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("granted", [True, False], ids=["joined-now", "joined-before"])
async def test_an_account_without_the_verb_has_its_gangs_removed_one_by_one(
    tmp_path: Path, granted: bool
) -> None:
    rules = cluster_role_rules()
    async with running_sim(tmp_path, POOLS, volcano=True, token="admin-token", tls=True) as (sim, admin):
        _account(sim, rules if granted else _without_deletecollection(rules), "member-token")
        kubeconfig = _as_token(admin, "member-token", tmp_path / "member.kubeconfig")
        # kubectl asks the cluster's authorizer (SelfSubjectAccessReview), as an administrator would.
        expected = "yes" if granted else "no"
        assert (
            await asyncio.to_thread(_can_i, kubeconfig, "deletecollection", "jobs.batch.volcano.sh")
            == expected
        )
        assert await asyncio.to_thread(_can_i, kubeconfig, "delete", "jobs.batch.volcano.sh") == "yes"
        assert await asyncio.to_thread(_can_i, kubeconfig, "deletecollection", "pods") == "no"
        # `gpufed cluster check` passes either way: the verb's absence is a warning, not a failure.
        report = await asyncio.to_thread(check, "sim", kubeconfig, None)
        assert report.ok, report.missing()
        warned = [f.check for f in report.findings if f.verdict is Verdict.WARNING]
        if granted:
            assert not [w for w in warned if "deletecollection" in w]
        else:
            assert "permission: deletecollection jobs (batch.volcano.sh group, in any namespace)" in warned
        config = kube_config("sim", kubeconfig)
        async with KubernetesBackend(dataclasses.replace(config)) as backend:
            assert await backend.wait_synced()
            counted = Counted(backend, DELETES)
            removed = await _ended(backend, "rb", 3)
            await backend.cancel_many([(g.job_id, g.attempt) for g in removed[:2]], 0.0)
            await _gone(backend, removed[:2])
            if granted:
                assert dict(counted.calls) == {"delete_volcano_jobs": 1}
            else:
                # Refused once (403), then one delete each; the next batch asks no collection again.
                assert dict(counted.calls) == {"delete_volcano_jobs": 1, "delete_volcano_job": 2}
            await backend.cancel_many([(removed[2].job_id, removed[2].attempt)], 0.0)
            await _gone(backend, removed)
            if not granted:
                assert dict(counted.calls) == {"delete_volcano_jobs": 1, "delete_volcano_job": 3}
        admin_api = k8s_config.new_client_from_config(config_file=str(admin))
        try:
            assert await asyncio.to_thread(_names, admin_api, volcano=True) == set()
        finally:
            admin_api.close()
