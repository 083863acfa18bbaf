"""What the API server does to an object before storing it: validate, default, allocate.

Real clusters default many fields on create (a Job's selector and labels, a pod's restart policy
and tolerations, a Service's cluster IP, a Volcano Job's queue and minAvailable) and reject bad
names and missing namespaces with `422 Invalid` or `404 NotFound`. Clients rely on those defaults
(the Job selector, the controller-uid label), so controllers and HTTP requests alike go through
`admit_create` here.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
import secrets
import uuid
from typing import Any

from clusters.sim import errors, pod_security, rbac
from clusters.sim.resources import (
    BATCH_JOBS,
    NAMESPACES,
    POD_GROUPS,
    PODS,
    QUEUES,
    SECRETS,
    SERVICES,
    VOLCANO_JOBS,
    ResourceType,
)
from clusters.sim.store import Store, clone, meta

Obj = dict[str, Any]

# Matched whole (`fullmatch`): with `^...$` and `match`, `$` lets a trailing newline through.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SERVICE_CIDR_BASE = ipaddress.IPv4Address("10.96.0.0")
_FIRST_SERVICE_IP = 10

CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
JOB_NAME = "batch.kubernetes.io/job-name"


def random_suffix(length: int = 5) -> str:
    """The suffix a real API server appends for `generateName`, from the same alphabet."""
    return "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(length))


class Admission:
    def __init__(self, store: Store) -> None:
        self._store = store

    def admit_create(self, rt: ResourceType, obj: Obj, namespace: str | None, *, owned: bool = False) -> Obj:
        """The object as it will be stored: named, defaulted, checked. It is a copy unless `owned`:
        the caller made `obj` for this create alone (a request's parsed body, a controller's new
        pod) and holds no other reference to it, so it is changed in place rather than copied (a
        copy of every pod was a tenth of the simulator's CPU in bench/scale.py)."""
        if not isinstance(obj, dict):
            raise errors.bad_request("the body must be a JSON object")
        if not owned:
            obj = clone(obj)
        m = meta(obj)
        if rt.namespaced:
            body_ns = m.get("namespace")
            if namespace and body_ns and body_ns != namespace:
                raise errors.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            m["namespace"] = namespace or body_ns or "default"
            home = self._store.get(NAMESPACES, "", m["namespace"])
            if home is None:
                raise errors.not_found(NAMESPACES, m["namespace"])
            if home["metadata"].get("deletionTimestamp"):
                # The NamespaceLifecycle admission plugin: nothing new while the namespace empties.
                raise errors.namespace_terminating(rt, m.get("name") or m.get("generateName") or "", home)
        if not m.get("name") and m.get("generateName"):
            m["name"] = f"{m['generateName']}{random_suffix()}"
        name = m.get("name") or ""
        if not name:
            raise errors.invalid(
                rt, name, "metadata.name", "Required value: name or generateName is required"
            )
        limit = 63 if rt in (NAMESPACES, SERVICES) else 253
        pattern = _LABEL if rt in (NAMESPACES, SERVICES) else _SUBDOMAIN
        if len(name) > limit or not pattern.fullmatch(name):
            raise errors.invalid(
                rt, name, "metadata.name", f"Invalid value: {name!r}: must be a lowercase RFC 1123 name"
            )
        for field in ("labels", "annotations"):
            values = m.get(field) or {}
            if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
                raise errors.invalid(rt, name, f"metadata.{field}", "values must be strings")
        m.pop("deletionTimestamp", None)
        m["uid"] = str(uuid.uuid4())
        default = _DEFAULTS.get(rt)
        if default is not None:
            default(self, obj)
        if rt is PODS:
            # The PodSecurity admission plugin, after defaulting, for requests and controllers alike.
            pod_security.enforce(self._store.get(NAMESPACES, "", m["namespace"]), obj)
        return obj

    def _service_ip(self) -> str:
        """The lowest free address: one is used only by a stored Service, so a dry-run create, a
        create refused later and a deleted Service hold none (a real allocator frees them too)."""
        taken = self._service_ips_taken()
        for offset in itertools.count(_FIRST_SERVICE_IP):
            address = str(_SERVICE_CIDR_BASE + offset)
            if address not in taken:
                return address
        raise AssertionError("unreachable")

    def _service_ips_taken(self) -> set[str]:
        return {
            ip
            for svc in self._store.list(SERVICES, None)
            for ip in (svc.get("spec") or {}).get("clusterIPs") or []
        }


def _default_namespace(_: Admission, ns: Obj) -> None:
    m = ns["metadata"]
    m.setdefault("labels", {})["kubernetes.io/metadata.name"] = m["name"]
    ns.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    ns["status"] = {"phase": "Active"}


def _default_pod(_: Admission, pod: Obj) -> None:
    name = pod["metadata"]["name"]
    spec = pod.get("spec")
    if not isinstance(spec, dict) or not spec.get("containers"):
        raise errors.invalid(PODS, name, "spec.containers", "Required value")
    for i, c in enumerate(spec["containers"]):
        if not c.get("name"):
            raise errors.invalid(PODS, name, f"spec.containers[{i}].name", "Required value")
        if not c.get("image"):
            raise errors.invalid(PODS, name, f"spec.containers[{i}].image", "Required value")
        c.setdefault("imagePullPolicy", "IfNotPresent")
        c.setdefault("terminationMessagePath", "/dev/termination-log")
        c.setdefault("terminationMessagePolicy", "File")
        c.setdefault("resources", {})
        _extended_requests_default_to_limits(c["resources"])
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("securityContext", {})
    tolerations = spec.setdefault("tolerations", [])
    # DefaultTolerationSeconds admission: pods tolerate a NotReady or unreachable node for 300 s.
    for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == taint for t in tolerations):
            tolerations.append(
                {"key": taint, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )
    status = pod.setdefault("status", {})
    status["phase"] = "Pending"
    status["qosClass"] = _qos_class(spec["containers"])
    status.pop("conditions", None)


def _extended_requests_default_to_limits(resources: Obj) -> None:
    limits = resources.get("limits") or {}
    requests = resources.setdefault("requests", {})
    for k, v in limits.items():
        requests.setdefault(k, v)
    if not requests:
        del resources["requests"]


def _qos_class(containers: list[Obj]) -> str:
    requested = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in requested):
        return "BestEffort"
    guaranteed = all(
        r.get("limits")
        and all(r.get("limits", {}).get(k) == r.get("requests", {}).get(k) for k in ("cpu", "memory"))
        and {"cpu", "memory"} <= set(r.get("limits", {}))
        for r in requested
    )
    return "Guaranteed" if guaranteed else "Burstable"


def _default_service(admission: Admission, svc: Obj) -> None:
    spec = svc.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    if spec.get("clusterIP") is None:
        spec["clusterIP"] = admission._service_ip()
    elif spec["clusterIP"] != "None" and spec["clusterIP"] in admission._service_ips_taken():
        raise errors.invalid(
            SERVICES,
            svc["metadata"]["name"],
            "spec.clusterIPs",
            f'Invalid value: []string{{"{spec["clusterIP"]}"}}: failed to allocate IP '
            f"{spec['clusterIP']}: provided IP is already allocated",
        )
    spec["clusterIPs"] = [spec["clusterIP"]]
    spec.setdefault("sessionAffinity", "None")
    spec.setdefault("ipFamilies", ["IPv4"])
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    svc["status"] = {"loadBalancer": {}}


def _default_batch_job(_: Admission, job: Obj) -> None:
    m = job["metadata"]
    spec = job.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("template"), dict):
        raise errors.invalid(BATCH_JOBS, m["name"], "spec.template", "Required value")
    spec.setdefault("parallelism", 1)
    spec.setdefault("completions", spec["parallelism"] if spec.get("completionMode") == "Indexed" else 1)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    # With a pod failure policy a terminating pod is replaced only once it has failed.
    spec.setdefault(
        "podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed"
    )
    if spec["completionMode"] == "Indexed" and spec["completions"] is None:
        raise errors.invalid(
            BATCH_JOBS, m["name"], "spec.completions", "Required value when completionMode is Indexed"
        )
    uid = m["uid"]
    owned = {CONTROLLER_UID: uid, JOB_NAME: m["name"], "controller-uid": uid, "job-name": m["name"]}
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {CONTROLLER_UID: uid}}
    template_meta = spec["template"].setdefault("metadata", {})
    template_meta.setdefault("labels", {}).update(owned)
    m.setdefault("labels", {}).update({k: v for k, v in owned.items() if "job-name" in k or "uid" in k})
    job["status"] = {}


def _default_volcano_job(_: Admission, job: Obj) -> None:
    name = job["metadata"]["name"]
    spec = job.get("spec")
    if not isinstance(spec, dict) or not spec.get("tasks"):
        raise errors.invalid(
            VOLCANO_JOBS, name, "spec.tasks", "Required value: the job must have at least one task"
        )
    seen: set[str] = set()
    total = 0
    for i, task in enumerate(spec["tasks"]):
        task.setdefault("name", f"default{i}" if i else "default")
        if task["name"] in seen:
            raise errors.invalid(
                VOLCANO_JOBS, name, f"spec.tasks[{i}].name", f"duplicated task name {task['name']}"
            )
        seen.add(task["name"])
        task.setdefault("replicas", 1)
        task.setdefault("minAvailable", task["replicas"])
        if not isinstance(task.get("template"), dict):
            raise errors.invalid(VOLCANO_JOBS, name, f"spec.tasks[{i}].template", "Required value")
        total += int(task["replicas"])
    spec.setdefault("minAvailable", total)
    if int(spec["minAvailable"]) > total:
        raise errors.invalid(
            VOLCANO_JOBS,
            name,
            "spec.minAvailable",
            "job 'minAvailable' should not be greater than total replicas in tasks",
        )
    spec.setdefault("queue", "default")
    spec.setdefault("schedulerName", "volcano")
    spec.setdefault("maxRetry", 3)
    job["status"] = {}


def _default_queue(_: Admission, queue: Obj) -> None:
    spec = queue.setdefault("spec", {})
    spec.setdefault("weight", 1)
    spec.setdefault("reclaimable", True)
    queue["status"] = {"state": "Open"}


def _default_pod_group(_: Admission, pg: Obj) -> None:
    pg.setdefault("spec", {}).setdefault("minMember", 1)
    pg.setdefault("status", {}).setdefault("phase", "Pending")


def _fill_token(_: Admission, secret: Obj) -> None:
    rbac.fill_token(secret)


_DEFAULTS = {
    NAMESPACES: _default_namespace,
    PODS: _default_pod,
    SERVICES: _default_service,
    BATCH_JOBS: _default_batch_job,
    VOLCANO_JOBS: _default_volcano_job,
    POD_GROUPS: _default_pod_group,
    QUEUES: _default_queue,
    # The token controller fills a service-account-token Secret's token (clusters.sim.rbac).
    SECRETS: _fill_token,
}
