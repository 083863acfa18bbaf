"""A task's pod template: the parts of a pod a user writes, checked at submission, and what gpufed owns.

A task may carry `template:`, in the shape of Volcano's task template and Kubernetes'
PodTemplateSpec (metadata with labels and annotations, and a pod spec: containers with resources,
args, workingDir, ports, volumeMounts and envFrom, initContainers, volumes, nodeSelector,
tolerations, affinity, securityContext, imagePullSecrets, ...). The short task fields stay: `image`,
`command` and `env` fill the first container (the main one), `gpus` its GPU request, and
`shmSize` becomes an in-memory emptyDir at /dev/shm in every container.

The template is checked here in three steps: against the Kubernetes schema (`pod_schema`), by the
API server's own rules that a schema cannot say (names, ports, quantities, references between
mounts and volumes), and against what gpufed owns: the GPU request, the scheduler, the choice of
GPU nodes, its labels, the pod's name and lifetime, and the rendezvous environment. A template
that sets one of those is refused with the reason, so that a job never lands on a cluster set up
in a way gpufed did not choose.
"""

from __future__ import annotations

import json
import re
from typing import Any

from federation.errors import InvalidSpec
from federation.spec.manifest_text import key_path, shorten
from federation.spec.pod_schema import check_schema
from federation.spec.quantity import RULE as QUANTITY_RULE
from federation.spec.quantity import parse_quantity, quantity_text
from federation.spec.validate import unsafe_character

SHM_VOLUME = "gpufed-shm"
SHM_PATH = "/dev/shm"
MAX_CONTAINERS = 16
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_TEMPLATE_KEYS = ("metadata", "spec")
_METADATA_KEYS = ("labels", "annotations")

# Pod fields gpufed sets itself, each with why: a template may not set them.
OWNED_POD_FIELDS = {
    "schedulerName": "gpufed chooses the scheduler (Volcano's for gangs, the default otherwise)",
    "nodeName": "gpufed's placement and the cluster's scheduler choose the node",
    "restartPolicy": "gpufed restarts whole gangs by spec.restartPolicy, so pods are never restarted alone",
    "activeDeadlineSeconds": "gpufed sets it from spec.maxRuntime",
    "priorityClassName": "gpufed sets it from spec.priorityClassName",
    "priority": "gpufed sets it from spec.priorityClassName",
    "preemptionPolicy": "gpufed decides preemption across clusters",
    "hostname": "gpufed names the pods for the rendezvous",
    "subdomain": "gpufed names the pods for the rendezvous",
    "setHostnameAsFQDN": "gpufed names the pods for the rendezvous",
    "hostnameOverride": "gpufed names the pods for the rendezvous",
    "schedulingGates": "gpufed creates the whole gang at once; a gated pod would hold the others",
}
# Main-container fields gpufed sets on the trials of a sweep whose metric is read from a file
# (`metric.source: file`, federation.jobsets): a trial's template may not set them.
METRIC_FILE_FIELDS = {
    "terminationMessagePath": "gpufed sets it to the sweep's metric.path, the file a trial writes its "
    "metric to (metric.source: file)",
    "terminationMessagePolicy": "gpufed sets it to File for a sweep whose metric is read from a file: "
    "with FallbackToLogsOnError a failed trial's last log lines would be read as its metric",
}
# Node labels that say which GPUs and which capacity a node has: gpufed picks the nodes by them
# (clusters.kubernetes.inventory reads them; a unit test keeps the two lists together).
OWNED_NODE_LABELS = frozenset(
    {
        "nvidia.com/gpu.product",
        "gpufed.io/pool",
        "gpufed.io/capacity-type",
        "cloud.google.com/gke-nodepool",
        "cloud.google.com/gke-accelerator",
        "cloud.google.com/gke-spot",
        "eks.amazonaws.com/nodegroup",
        "eks.amazonaws.com/capacityType",
        "k8s.amazonaws.com/accelerator",
        "kubernetes.azure.com/agentpool",
        "kubernetes.azure.com/scalesetpriority",
        "kubernetes.azure.com/accelerator",
        "agentpool",
    }
)
_OWNED_NODE_LABEL_PREFIXES = ("nvidia.com/gpu.", "nvidia.com/mig.")
_NODE_LABEL_REASON = (
    "gpufed chooses the GPU type and the nodes that have it (spec.gpuTypes, spec.allowSpot); "
    "a template may not select nodes by GPU, pool or capacity labels"
)
# Label and annotation domains that mark gpufed's objects and its gang schedulers' pods.
_OWNED_DOMAINS = ("gpufed.io", "volcano.sh", "batch.kubernetes.io", "scheduling.k8s.io")
_OWNED_LABELS = frozenset({"app.kubernetes.io/managed-by", "controller-uid", "job-name"})
# The rendezvous: gpufed sets these for torchrun, MPI and DeepSpeed (and GPUFED_* for itself).
OWNED_ENV = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "NODE_RANK",
        "NNODES",
        "NPROC_PER_NODE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
    }
)
_ENV_REASON = "gpufed sets the rendezvous environment (MASTER_ADDR, RANK, WORLD_SIZE, ...) itself"
_GPU_REASON = "gpufed owns the GPU request: set the task's gpus field instead"


def owned_env_name(name: str) -> bool:
    return name in OWNED_ENV or name.startswith("GPUFED_")


def _gpu_resource(name: str) -> bool:
    """`nvidia.com/gpu`, `amd.com/gpu`, a MIG slice (`nvidia.com/mig-1g.5gb`): all GPUs."""
    return name.endswith("/gpu") or name.startswith("nvidia.com/")


def _owned_key(key: str) -> bool:
    domain = key.rpartition("/")[0]
    return key in _OWNED_LABELS or any(domain == d or domain.endswith("." + d) for d in _OWNED_DOMAINS)


def _owned_node_label(key: str) -> bool:
    return key in OWNED_NODE_LABELS or key.startswith(_OWNED_NODE_LABEL_PREFIXES)


# ---- before the schema: nulls dropped, numbers in quantity fields read as quantities


def _without_nulls(value: Any) -> Any:
    """A null field is an unset one, as a real API server decodes it."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _quantities_as_text(resources: Any) -> None:
    if not isinstance(resources, dict):
        return
    for part in ("limits", "requests"):
        values = resources.get(part)
        if isinstance(values, dict):
            for name, value in values.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    values[name] = str(value)


def _normalised(raw: dict[str, Any], task: str) -> dict[str, Any]:
    template: dict[str, Any] = _without_nulls(raw)
    spec = template.setdefault("spec", {})
    if not isinstance(spec, dict):
        return template
    containers = spec.setdefault("containers", [{}])
    if isinstance(containers, list) and containers and isinstance(containers[0], dict):
        containers[0].setdefault("name", task)  # the main container is named after its task
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            if isinstance(c, dict):
                _quantities_as_text(c.get("resources"))
    _quantities_as_text(spec.get("resources"))
    for volume in spec.get("volumes") or []:
        empty = volume.get("emptyDir") if isinstance(volume, dict) else None
        if isinstance(empty, dict) and (size := quantity_text(empty.get("sizeLimit"))) is not None:
            empty["sizeLimit"] = size
    return template


# ---- after the schema: the API server's rules, then gpufed's


def _first_unsafe(value: Any) -> tuple[tuple[int | str, ...], str] | None:
    """Where the first control or bidirectional character is (a key's location ends in its key),
    and the character; None when there is none. Paths are built only for the one found."""
    if isinstance(value, str):
        found = unsafe_character(value)
        return None if found is None else ((), found[1])
    items: Any = (
        value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    )
    for key, item in items:
        if isinstance(key, str) and (bad := unsafe_character(key)) is not None:
            return (key,), bad[1]
        inner = _first_unsafe(item)
        if inner is not None:
            return (key, *inner[0]), inner[1]
    return None


def _text_everywhere(value: Any, path: str) -> None:
    """No control or bidirectional characters anywhere: they hide text in a terminal, log or pod."""
    found = _first_unsafe(value)
    if found is not None:
        at = path
        for part in found[0]:
            at = f"{at}[{part}]" if isinstance(part, int) else key_path(at, part)
        raise InvalidSpec(at, f"must not contain control or bidirectional characters: {found[1]}")


def _label_key(key: str, path: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if (slash and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix))) or not _LABEL_NAME.fullmatch(
        name
    ):
        raise InvalidSpec(
            path,
            "must be a label key: an optional DNS-subdomain prefix and '/', then 1 to 63 letters, digits, "
            f"'-', '_' or '.', starting and ending with a letter or digit; got {shorten(key)}",
        )


def _labels(values: dict[str, str], path: str, *, what: str, check_values: bool) -> None:
    for key, value in values.items():
        at = key_path(path, key)
        _label_key(key, at)
        if _owned_key(key):
            raise InvalidSpec(at, f"gpufed owns this {what}: {', '.join(_OWNED_DOMAINS)} keys mark its pods")
        if check_values and value and not _LABEL_NAME.fullmatch(value):
            raise InvalidSpec(
                at,
                "value must be empty or 1 to 63 letters, digits, '-', '_' or '.', starting and ending "
                f"with a letter or digit, got {shorten(value)}",
            )


def _resources(resources: dict[str, Any], path: str) -> None:
    for part in ("limits", "requests"):
        for name, value in (resources.get(part) or {}).items():
            at = key_path(f"{path}.{part}", name)
            if _gpu_resource(name):
                raise InvalidSpec(at, _GPU_REASON)
            amount = parse_quantity(value)
            if amount is None:
                raise InvalidSpec(at, f"must be {QUANTITY_RULE}, got {shorten(str(value))}")
            if amount < 0:
                raise InvalidSpec(at, f"must be greater than or equal to 0, got {shorten(value)}")
    limits = resources.get("limits") or {}
    for name, value in (resources.get("requests") or {}).items():
        if name in limits and parse_quantity(value) > parse_quantity(limits[name]):  # type: ignore[operator]
            raise InvalidSpec(
                key_path(f"{path}.requests", name),
                f"must be less than or equal to the limit ({limits[name]}), got {value}",
            )


def _env(env: list[dict[str, Any]], path: str, taken: dict[str, str]) -> None:
    for i, var in enumerate(env):
        at = f"{path}[{i}].name"
        name = var["name"]
        if not name or "=" in name or not name.isprintable() or not name.isascii():
            raise InvalidSpec(at, f"must be printable ASCII characters other than '=', got {shorten(name)}")
        if owned_env_name(name):
            raise InvalidSpec(at, f"{name} is set by gpufed: {_ENV_REASON}")
        if name in taken:
            raise InvalidSpec(at, f"duplicate variable {shorten(name)} (also at {taken[name]})")
        taken[name] = at


def _ports(ports: list[dict[str, Any]], path: str) -> None:
    for i, port in enumerate(ports):
        at = f"{path}[{i}]"
        if not 1 <= port["containerPort"] <= 65535:
            raise InvalidSpec(f"{at}.containerPort", f"must be from 1 to 65535, got {port['containerPort']}")
        if not 0 <= port.get("hostPort", 0) <= 65535:
            raise InvalidSpec(f"{at}.hostPort", f"must be from 1 to 65535, got {port['hostPort']}")
        if port.get("protocol", "TCP") not in ("TCP", "UDP", "SCTP"):
            raise InvalidSpec(f"{at}.protocol", f"must be TCP, UDP or SCTP, got {shorten(port['protocol'])}")


def _container(c: dict[str, Any], at: str, volumes: set[str], *, main: bool, env: dict[str, str]) -> None:
    if not main and not c.get("image", "").strip():
        raise InvalidSpec(f"{at}.image", "is required")
    if any(ch.isspace() for ch in c.get("image", "")):
        raise InvalidSpec(f"{at}.image", f"must not contain whitespace, got {shorten(c['image'])}")
    _resources(c.get("resources") or {}, f"{at}.resources")
    _env(c.get("env") or [], f"{at}.env", env if main else {})
    _ports(c.get("ports") or [], f"{at}.ports")
    paths: dict[str, int] = {}
    for j, mount in enumerate(c.get("volumeMounts") or []):
        where = f"{at}.volumeMounts[{j}]"
        if mount["name"] not in volumes:
            raise InvalidSpec(f"{where}.name", f"no volume named {shorten(mount['name'])} in spec.volumes")
        if not mount["mountPath"]:
            raise InvalidSpec(f"{where}.mountPath", "is required")
        if mount["mountPath"] in paths:
            raise InvalidSpec(
                f"{where}.mountPath",
                f"must be unique (also at {at}.volumeMounts[{paths[mount['mountPath']]}])",
            )
        paths[mount["mountPath"]] = j


def _volumes(volumes: list[dict[str, Any]], path: str) -> set[str]:
    names: set[str] = set()
    for i, volume in enumerate(volumes):
        at = f"{path}[{i}]"
        name = volume["name"]
        if not _DNS_LABEL.fullmatch(name):
            raise InvalidSpec(f"{at}.name", f"must be a DNS-1123 label, got {shorten(name)}")
        if name.startswith("gpufed-"):
            raise InvalidSpec(
                f"{at}.name", "names starting 'gpufed-' are gpufed's (shmSize makes gpufed-shm)"
            )
        if name in names:
            raise InvalidSpec(f"{at}.name", f"duplicate volume name {shorten(name)}")
        names.add(name)
        sources = [k for k in volume if k != "name"]
        if len(sources) != 1:
            rule = "must specify a volume type" if not sources else "may not specify more than 1 volume type"
            raise InvalidSpec(at, f"{rule}, got {', '.join(sources) or 'none'}")
        size = (volume.get("emptyDir") or {}).get("sizeLimit")
        if size is not None and parse_quantity(size) is None:
            raise InvalidSpec(
                f"{at}.emptyDir.sizeLimit", f"must be {QUANTITY_RULE}, got {shorten(str(size))}"
            )
    return names


def _tolerations(tolerations: list[dict[str, Any]], path: str) -> None:
    for i, t in enumerate(tolerations):
        at = f"{path}[{i}]"
        operator = t.get("operator", "Equal")
        if operator not in ("Equal", "Exists"):
            raise InvalidSpec(f"{at}.operator", f"must be Equal or Exists, got {shorten(operator)}")
        if operator == "Exists" and t.get("value"):
            raise InvalidSpec(f"{at}.value", "must be empty when operator is Exists")
        if not t.get("key") and operator != "Exists":
            raise InvalidSpec(f"{at}.operator", "must be Exists when key is empty")
        effect = t.get("effect", "")
        if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
            raise InvalidSpec(
                f"{at}.effect", f"must be NoSchedule, PreferNoSchedule or NoExecute, got {shorten(effect)}"
            )
        if "tolerationSeconds" in t and effect != "NoExecute":
            raise InvalidSpec(f"{at}.effect", "must be NoExecute when tolerationSeconds is set")


def _node_affinity(affinity: dict[str, Any], path: str) -> None:
    node = affinity.get("nodeAffinity") or {}
    at = f"{path}.nodeAffinity"
    required = (node.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    terms = [
        (f"{at}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]", t)
        for i, t in enumerate(required)
    ]
    for i, p in enumerate(node.get("preferredDuringSchedulingIgnoredDuringExecution") or []):
        terms.append(
            (f"{at}.preferredDuringSchedulingIgnoredDuringExecution[{i}].preference", p["preference"])
        )
    for where, term in terms:
        for j, expr in enumerate(term.get("matchExpressions") or []):
            if _owned_node_label(expr["key"]):
                raise InvalidSpec(f"{where}.matchExpressions[{j}].key", _NODE_LABEL_REASON)
            if expr["operator"] not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
                raise InvalidSpec(
                    f"{where}.matchExpressions[{j}].operator",
                    f"must be In, NotIn, Exists, DoesNotExist, Gt or Lt, got {shorten(expr['operator'])}",
                )


def _check_spec(spec: dict[str, Any], path: str, shm: bool, short_env: dict[str, str]) -> None:
    for field, why in OWNED_POD_FIELDS.items():
        if field in spec:
            raise InvalidSpec(f"{path}.{field}", f"gpufed owns this field: {why}")
    if "ephemeralContainers" in spec:
        # As the API server says: they are added to a running pod for debugging, never created with it.
        raise InvalidSpec(f"{path}.ephemeralContainers", "may not be set when a pod is created")
    containers = spec["containers"]
    init = spec.get("initContainers") or []
    if not containers:
        raise InvalidSpec(f"{path}.containers", "must have at least one container")
    if len(containers) + len(init) > MAX_CONTAINERS:
        raise InvalidSpec(
            f"{path}.containers", f"at most {MAX_CONTAINERS} containers and initContainers in all"
        )
    volumes = _volumes(spec.get("volumes") or [], f"{path}.volumes")
    if shm:
        volumes.add(SHM_VOLUME)
    names: dict[str, str] = {}
    for key, items in (("containers", containers), ("initContainers", init)):
        for i, c in enumerate(items):
            at = f"{path}.{key}[{i}]"
            if not _DNS_LABEL.fullmatch(c["name"]):
                raise InvalidSpec(f"{at}.name", f"must be a DNS-1123 label, got {shorten(c['name'])}")
            if c["name"] in names:
                raise InvalidSpec(f"{at}.name", f"duplicate container name (also {names[c['name']]})")
            names[c["name"]] = at
            _container(c, at, volumes, main=(key, i) == ("containers", 0), env=short_env)
            if shm and any(m["mountPath"].rstrip("/") == SHM_PATH for m in c.get("volumeMounts") or []):
                raise InvalidSpec(f"{at}.volumeMounts", f"shmSize mounts {SHM_PATH}; do not mount it as well")
    _resources(spec.get("resources") or {}, f"{path}.resources")
    for key in spec.get("nodeSelector") or {}:
        at = key_path(f"{path}.nodeSelector", key)
        _label_key(key, at)
        if _owned_node_label(key):
            raise InvalidSpec(at, _NODE_LABEL_REASON)
    _tolerations(spec.get("tolerations") or [], f"{path}.tolerations")
    _node_affinity(spec.get("affinity") or {}, f"{path}.affinity")
    for i, secret in enumerate(spec.get("imagePullSecrets") or []):
        if not secret.get("name"):
            raise InvalidSpec(f"{path}.imagePullSecrets[{i}].name", "is required")


def parse_template(
    raw: object, path: str, *, task: str, shm_size: str | None, short_env: tuple[tuple[str, str], ...]
) -> tuple[dict[str, Any], str | None, tuple[str, ...] | None]:
    """The template as stored (main container without image and command), and those two if it set them.

    `short_env` is the task's `env`, whose names the main container's template env may not repeat."""
    if not isinstance(raw, dict):
        raise InvalidSpec(path, "must be a mapping with metadata and spec (a Kubernetes PodTemplateSpec)")
    for key in raw:
        if key not in _TEMPLATE_KEYS:
            raise InvalidSpec(
                key_path(path, str(key)),
                f"unknown field {shorten(str(key))}; a template has metadata and spec (a PodTemplateSpec)",
            )
    metadata = raw.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidSpec(f"{path}.metadata", "must be a mapping")
    for key in metadata:
        if key not in _METADATA_KEYS and metadata[key] is not None:
            raise InvalidSpec(
                key_path(f"{path}.metadata", str(key)),
                "gpufed names the pods and their namespace: a template's metadata may hold only labels and "
                "annotations",
            )
    template = _normalised(raw, task)
    check_schema(template, path)
    _text_everywhere(template, path)
    meta = template.get("metadata") or {}
    _labels(meta.get("labels") or {}, f"{path}.metadata.labels", what="label", check_values=True)
    _labels(
        meta.get("annotations") or {}, f"{path}.metadata.annotations", what="annotation", check_values=False
    )
    env = {name: f"{path[: -len('.template')]}.env[{name!r}]" for name, _ in short_env}
    _check_spec(template["spec"], f"{path}.spec", shm_size is not None, env)
    main = template["spec"]["containers"][0]
    image = main.pop("image", None)
    command = main.pop("command", None)
    return template, image, None if command is None else tuple(command)


def refuse_metric_file_fields(template_json: str, path: str) -> None:
    """Refuse a stored template whose main container sets a field of METRIC_FILE_FIELDS: gpufed owns
    them on a sweep's trials when the metric is read from a file. `path` names the template."""
    if not template_json:
        return
    containers = (json.loads(template_json).get("spec") or {}).get("containers") or [{}]
    for field, why in METRIC_FILE_FIELDS.items():
        if field in containers[0]:
            raise InvalidSpec(f"{path}.spec.containers[0].{field}", why)


def template_text(template: dict[str, Any]) -> str:
    """The stored form: compact JSON with sorted keys, so equal templates are equal strings."""
    return json.dumps(template, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def expanded_template(template_json: str, shm_size: str | None) -> str:
    """The task's template with gpufed's expansions of the short fields: /dev/shm for shmSize."""
    if not shm_size:
        return template_json
    template: dict[str, Any] = json.loads(template_json) if template_json else {"spec": {"containers": [{}]}}
    spec = template["spec"]
    spec.setdefault("volumes", []).append(
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size}}
    )
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            c.setdefault("volumeMounts", []).append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    return template_text(template)
