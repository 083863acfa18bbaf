"""The objects gpufed creates on a member cluster, as plain dicts: pure builders, no I/O.

Kept apart from the code that sends them so that their shape (docs/kubernetes.md) can be read and
tested on its own, and so that the backend sends exactly what a test inspected. Dicts rather than the
client's model classes: the client serialises a dict as it is, and building models only to turn them
back into JSON would cost time on every dispatch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clusters.api import GangWorkload, ReplicaSpec
from clusters.kubernetes import rendezvous
from clusters.kubernetes.inventory import GANG_LABEL, GPU_RESOURCE, PRODUCT_LABEL, TOLERATED_TAINTS, NodeInfo
from clusters.kubernetes.names import dns_label, label_value, namespace_for, queue_for, task_name
from clusters.kubernetes.status import (
    ATTEMPT_KEY,
    JOB_ID_KEY,
    MANAGED_BY,
    MANAGED_BY_KEY,
    REPLICAS_KEY,
    TENANT_KEY,
)
from placement.model import CapacityKind, GpuType, TenantId

Json = dict[str, Any]

VOLCANO_GROUP = "batch.volcano.sh"
VOLCANO_VERSION = "v1alpha1"
VOLCANO_SCHEDULING_GROUP = "scheduling.volcano.sh"
SIM_DURATION_ANNOTATION = "sim.gpufed.io/duration"
SIM_EXIT_CODE_ANNOTATION = "sim.gpufed.io/exit-code"
TASK_LABEL = "gpufed.io/task"
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
POD_SECURITY_PREFIX = "pod-security.kubernetes.io/"


@dataclass(frozen=True, slots=True)
class NodeSelection:
    """Where the gang's pods may run: the chosen GPU type and capacity kind, as node labels.

    `node_selector` holds the labels with one allowed value; `expressions` what only node affinity
    can say (several products or pools, or "not spot" on a pool that mixes kinds).
    """

    node_selector: tuple[tuple[str, str], ...]
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


def select_nodes(nodes: Sequence[NodeInfo], gpu_type: GpuType, kind: CapacityKind) -> NodeSelection | None:
    """Labels that pick the nodes of this GPU type and kind; None when the cluster has none."""
    matching = [n for n in nodes if n.gpu_type == gpu_type and n.kind == kind]
    if not matching:
        return None
    selector: dict[str, str] = {}
    expressions: list[tuple[str, str, tuple[str, ...]]] = []

    def allow(key: str, values: set[str]) -> None:
        if len(values) == 1:
            selector[key] = next(iter(values))
        else:
            expressions.append((key, "In", tuple(sorted(values))))

    by_label: dict[str, set[str]] = {}
    for n in matching:
        by_label.setdefault(n.product_label, set()).add(n.product)
    if len(by_label) == 1:
        key, products = next(iter(by_label.items()))
        allow(key, products)
    else:
        # Nodes of the type named by different labels (some with GPU feature discovery, some only
        # with their cloud's): one node selector term cannot say "this label or that", so the pods
        # go to the nodes that GFD names. A cluster that mixes them should label them alike.
        allow(PRODUCT_LABEL, by_label.get(PRODUCT_LABEL, set()))
    pool_keys = {n.pool_label for n in matching}
    pools = {n.pool for n in matching}
    pure_pools = False
    if len(pool_keys) == 1 and None not in pool_keys:
        pool_key = next(iter(pool_keys))
        assert pool_key is not None
        allow(pool_key, pools)
        # Pools that hold only this type and kind need nothing more to tell the kind apart.
        pure_pools = all(
            (n.gpu_type, n.kind) == (gpu_type, kind)
            for n in nodes
            if n.pool_label == pool_key and n.pool in pools
        )
    if not pure_pools:
        if kind is CapacityKind.SPOT:
            spot_labels = {n.spot_label for n in matching if n.spot_label is not None}
            if len(spot_labels) == 1:
                key, value = next(iter(spot_labels))
                selector[key] = value
        elif kind is CapacityKind.ON_DEMAND:
            for key, value in sorted({n.spot_label for n in nodes if n.spot_label is not None}):
                expressions.append((key, "NotIn", (value,)))
    return NodeSelection(tuple(sorted(selector.items())), tuple(expressions))


def labels(gang: GangWorkload, name: str) -> dict[str, str]:
    return {
        JOB_ID_KEY: label_value(gang.job_id),
        TENANT_KEY: label_value(gang.tenant),
        ATTEMPT_KEY: str(gang.attempt),
        GANG_LABEL: name,
        MANAGED_BY_KEY: MANAGED_BY,
    }


def _annotations(gang: GangWorkload) -> dict[str, str]:
    """The exact ids (labels may have had to shorten them) and the gang's size."""
    return {
        JOB_ID_KEY: gang.job_id,
        TENANT_KEY: gang.tenant,
        ATTEMPT_KEY: str(gang.attempt),
        REPLICAS_KEY: str(len(gang.replicas)),
    }


def object_metadata(gang: GangWorkload, name: str, namespace: str) -> Json:
    """Name, namespace, gpufed's labels and the gang's annotations, for one of the gang's objects."""
    return _metadata(gang, name, namespace)


def _metadata(gang: GangWorkload, name: str, namespace: str) -> Json:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(gang, name),
        "annotations": _annotations(gang),
    }


def namespace_manifest(prefix: str, tenant: TenantId, pod_security: str = "baseline") -> Json:
    """The tenant's namespace, labelled for Pod Security Admission with the level its pods were checked
    against at submission: the member cluster refuses what the level forbids, as gpufed did."""
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": namespace_for(prefix, tenant),
            "labels": {
                TENANT_KEY: label_value(tenant),
                MANAGED_BY_KEY: MANAGED_BY,
                **pod_security_labels(pod_security),
            },
        },
    }


def pod_security_labels(level: str) -> dict[str, str]:
    """Pod Security Admission's labels for `level`: enforce it, and warn and audit at the same level."""
    return {f"{POD_SECURITY_PREFIX}{mode}": level for mode in ("enforce", "warn", "audit")}


def queue_manifest(tenant: TenantId) -> Json:
    """Volcano admits a job only into a queue that exists: one per tenant, created on first use."""
    return {
        "apiVersion": f"{VOLCANO_SCHEDULING_GROUP}/v1beta1",
        "kind": "Queue",
        "metadata": {
            "name": queue_for(tenant),
            "labels": {TENANT_KEY: label_value(tenant), MANAGED_BY_KEY: MANAGED_BY},
        },
        "spec": {"weight": 1, "reclaimable": True},
    }


def _pod_annotations(gang: GangWorkload) -> dict[str, str]:
    # The exact ids: a pod that outlives its gang object is still known by them.
    annotations: dict[str, str] = {JOB_ID_KEY: gang.job_id, ATTEMPT_KEY: str(gang.attempt)}
    if gang.sim_duration_s is not None:
        annotations[SIM_DURATION_ANNOTATION] = repr(float(gang.sim_duration_s))
    if gang.sim_exit_code != 0 or gang.sim_duration_s is not None:
        annotations[SIM_EXIT_CODE_ANNOTATION] = str(gang.sim_exit_code)
    annotations.update(gang.sim_annotations)
    return annotations


def _template(replica: ReplicaSpec) -> Json:
    """The user's pod template for this replica (a fresh copy: the builders below write into it)."""
    template: Json = json.loads(replica.pod_template) if replica.pod_template else {}
    template.setdefault("spec", {})
    if not template["spec"].get("containers"):
        template["spec"]["containers"] = [{}]
    return template


def _node_affinity(spec: Json, expressions: Sequence[tuple[str, str, tuple[str, ...]]]) -> None:
    """Add gpufed's node expressions to every required term of the template's own node affinity.

    Terms are ORed and a term's expressions ANDed, so gpufed's must join each term: a pod may then
    run only where the user's terms and the chosen GPU type both hold."""
    if not expressions:
        return
    ours = [{"key": k, "operator": op, "values": list(v)} for k, op, v in expressions]
    node = spec.setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    for term in terms:
        term["matchExpressions"] = [*(term.get("matchExpressions") or []), *ours]
    required["nodeSelectorTerms"] = terms


def _pod_spec(
    gang: GangWorkload,
    replica: ReplicaSpec,
    selection: NodeSelection,
    env: Sequence[Json],
    *,
    scheduler: str | None,
    template: Json,
) -> Json:
    """The template's pod spec with what gpufed owns written over it (the federation refused any
    template that set those): the main container's image, command, env and GPUs, the scheduler,
    the node selection, the tolerations of GPU taints, the restart policy and the deadline."""
    spec: Json = template["spec"]
    main: Json = spec["containers"][0]
    main.setdefault("name", dns_label(replica.task))
    main["image"] = replica.image
    main["command"] = list(replica.command)
    main["env"] = [*(main.get("env") or []), *({"name": k, "value": v} for k, v in replica.env), *env]
    resources = main.setdefault("resources", {})
    resources["limits"] = {**(resources.get("limits") or {}), GPU_RESOURCE: str(replica.gpu_count)}
    resources["requests"] = {**(resources.get("requests") or {}), GPU_RESOURCE: str(replica.gpu_count)}
    spec["restartPolicy"] = "Never"
    spec["priorityClassName"] = gang.priority_class
    spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **dict(selection.node_selector)}
    spec["tolerations"] = [
        *(spec.get("tolerations") or []),
        *({"key": key, "operator": "Exists"} for key in sorted(TOLERATED_TAINTS)),
    ]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if gang.max_runtime_s > 0:
        # On the pod, not the Job: the limit is on running, not on waiting for a place to run.
        spec["activeDeadlineSeconds"] = gang.max_runtime_s
    _node_affinity(spec, selection.expressions)
    return spec


def _template_metadata(gang: GangWorkload, name: str, task: str, template: Json) -> Json:
    """The template's own labels and annotations, under gpufed's (which identify the pods)."""
    own = template.get("metadata") or {}
    return {
        "labels": {**(own.get("labels") or {}), **labels(gang, name), TASK_LABEL: label_value(task)},
        "annotations": {**(own.get("annotations") or {}), **_pod_annotations(gang)},
    }


def _tasks(gang: GangWorkload) -> list[tuple[str, list[ReplicaSpec]]]:
    """The gang's tasks in the order given (the first is the master: rank 0 is its replica 0)."""
    tasks: dict[str, list[ReplicaSpec]] = {}
    for replica in gang.replicas:
        tasks.setdefault(replica.task, []).append(replica)
    return list(tasks.items())


def volcano_job(
    gang: GangWorkload, name: str, namespace: str, selection: NodeSelection, *, master_port: int
) -> Json:
    tasks = _tasks(gang)
    shorts = [task_name(name, task, len(replicas)) for task, replicas in tasks]
    # Volcano's svc plugin names each pod `<job>-<task>-<index>` with the job as its subdomain.
    lay = rendezvous.layout(
        [
            (
                [f"{name}-{short}-{i}.{name}" for i in range(len(replicas))],
                rendezvous.nproc_per_node(replicas[0].gpu_count),
                rendezvous.VOLCANO_TASK_INDEX,
            )
            for short, (_, replicas) in zip(shorts, tasks, strict=True)
        ]
    )
    vc_tasks: list[Json] = []
    for position, ((task, replicas), short, group) in enumerate(zip(tasks, shorts, lay.groups, strict=True)):
        launcher = position == 0
        env = rendezvous.environment(lay, group, master_port, launcher=launcher)
        template = _template(replicas[0])
        spec = _pod_spec(gang, replicas[0], selection, env, scheduler="volcano", template=template)
        metadata = _template_metadata(gang, name, task, template)
        _rendezvous_files(spec, metadata, lay, group, launcher=launcher)
        vc_task: Json = {
            "name": short,
            "replicas": len(replicas),
            "template": {"metadata": metadata, "spec": spec},
        }
        if launcher:
            # The master's end is the gang's end: its workers are then stopped, not waited for.
            vc_task["policies"] = [{"event": "TaskCompleted", "action": "CompleteJob"}]
        vc_tasks.append(vc_task)
    return {
        "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
        "kind": "Job",
        "metadata": _metadata(gang, name, namespace),
        "spec": {
            "minAvailable": gang.min_available,
            "queue": queue_for(gang.tenant),
            "priorityClassName": gang.priority_class,
            "schedulerName": "volcano",
            # gpufed counts retries across clusters and may place the next attempt elsewhere.
            "maxRetry": 0,
            "plugins": {"svc": [], "ssh": [], "env": []},
            "policies": [
                {"event": "PodEvicted", "action": "AbortJob"},
                {"event": "PodFailed", "action": "AbortJob"},
            ],
            "tasks": vc_tasks,
        },
    }


def _rendezvous_files(
    spec: Json, metadata: Json, lay: rendezvous.Layout, group: rendezvous.PodGroup, *, launcher: bool
) -> None:
    """The rank prelude where Kubernetes cannot write a pod's ranks, and the launcher's hostfile."""
    main: Json = spec["containers"][0]
    if rendezvous.needs_prelude(group):
        main["command"] = rendezvous.wrap_command(main.get("command") or [])
    if launcher:
        metadata["annotations"][rendezvous.HOSTFILE_ANNOTATION] = rendezvous.hostfile(lay)
        rendezvous.mount_hostfile(spec, main)


def uniform_replica(gang: GangWorkload) -> ReplicaSpec | None:
    """The one pod template an Indexed Job can have; None when replicas differ in what they run."""
    first = gang.replicas[0]
    for r in gang.replicas[1:]:
        if (r.gpu_count, r.image, r.command, r.env, r.pod_template) != (
            first.gpu_count,
            first.image,
            first.command,
            first.env,
            first.pod_template,
        ):
            return None
    return first


def indexed_job(
    gang: GangWorkload, name: str, namespace: str, selection: NodeSelection, *, master_port: int
) -> Json:
    replica = uniform_replica(gang)
    if replica is None:
        raise ValueError(f"gang {gang.name}: an Indexed Job needs replicas that all run the same pod")
    count = len(gang.replicas)
    # The Job controller names each pod's host `<job>-<index>`; the subdomain is the Service.
    lay = rendezvous.layout(
        [
            (
                [f"{name}-{i}.{name}" for i in range(count)],
                rendezvous.nproc_per_node(replica.gpu_count),
                rendezvous.COMPLETION_INDEX,
            )
        ]
    )
    (group,) = lay.groups
    env = rendezvous.environment(lay, group, master_port, launcher=True)
    template = _template(replica)
    pod_spec = _pod_spec(gang, replica, selection, env, scheduler=None, template=template)
    metadata = _template_metadata(gang, name, replica.task, template)
    # One template for every pod: each gets the hostfile; index 0 (rank 0) is the launcher.
    _rendezvous_files(pod_spec, metadata, lay, group, launcher=True)
    pod_spec["subdomain"] = name
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(gang, name, namespace),
        "spec": {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": count,
            "backoffLimit": 0,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    }
                ]
            },
            "template": {"metadata": metadata, "spec": pod_spec},
        },
    }


def headless_service(gang: GangWorkload, name: str, namespace: str, *, master_port: int) -> Json:
    """Gives each pod of an Indexed Job the DNS name `<gang>-<index>.<gang>` for the rendezvous."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(gang, name, namespace),
        "spec": {
            "clusterIP": "None",
            "selector": {GANG_LABEL: name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "rendezvous", "port": master_port, "targetPort": master_port}],
        },
    }


def eviction_event(
    *, namespace: str, name: str, uid: str, kind: str, api_version: str, reason: str, now_iso: str, seq: str
) -> Json:
    """A core v1 Event on the gang that says why gpufed evicted it (kubectl describe shows it)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{seq}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": api_version,
            "kind": kind,
            "name": name,
            "namespace": namespace,
            "uid": uid,
        },
        "reason": "Evicted",
        "message": reason,
        "type": "Warning",
        "source": {"component": "gpufed"},
        "reportingComponent": "gpufed.io/federation",
        "reportingInstance": "gpufed",
        "action": "Evict",
        "firstTimestamp": now_iso,
        "lastTimestamp": now_iso,
        "eventTime": None,
        "count": 1,
    }
