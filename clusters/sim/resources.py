"""The resource types the simulated API server serves, in one table.

Routing, discovery and the store all key on `ResourceType`, so adding a kind to the simulator is one
entry here plus whatever controller gives it behaviour. Two kinds share the plural `jobs`
(`batch/v1` and Volcano's `batch.volcano.sh`), which is why a type is identified by group and plural
together and never by plural alone.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    # Subresources served besides the object itself (`status`, `eviction`, `log`).
    subresources: tuple[str, ...] = ("status",)
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """How error messages name the type: `pods`, `jobs.batch`."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


NAMESPACES = ResourceType("", "v1", "namespaces", "namespace", "Namespace", False, ("ns",))
NODES = ResourceType("", "v1", "nodes", "node", "Node", False, ("no",))
PODS = ResourceType(
    "", "v1", "pods", "pod", "Pod", True, ("po",), ("status", "eviction", "log"), categories=("all",)
)
SERVICES = ResourceType("", "v1", "services", "service", "Service", True, ("svc",), categories=("all",))
EVENTS = ResourceType("", "v1", "events", "event", "Event", True, ("ev",), subresources=())
CONFIG_MAPS = ResourceType("", "v1", "configmaps", "configmap", "ConfigMap", True, ("cm",), subresources=())
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "lease", "Lease", True, (), subresources=())
PRIORITY_CLASSES = ResourceType(
    "scheduling.k8s.io",
    "v1",
    "priorityclasses",
    "priorityclass",
    "PriorityClass",
    False,
    ("pc",),
    subresources=(),
)
BATCH_JOBS = ResourceType("batch", "v1", "jobs", "job", "Job", True, (), categories=("all",))
VOLCANO_JOBS = ResourceType(
    "batch.volcano.sh", "v1alpha1", "jobs", "job", "Job", True, ("vcjob", "vj"), categories=("all",)
)
POD_GROUPS = ResourceType(
    "scheduling.volcano.sh", "v1beta1", "podgroups", "podgroup", "PodGroup", True, ("pg", "podgroup-v1beta1")
)
QUEUES = ResourceType(
    "scheduling.volcano.sh", "v1beta1", "queues", "queue", "Queue", False, ("q", "queue-v1beta1")
)
# Access control (clusters.sim.rbac): the accounts `gpufed cluster join` makes, their tokens, and the
# roles that RBAC decides requests by. SelfSubjectAccessReviews are answered, never stored.
SERVICE_ACCOUNTS = ResourceType(
    "", "v1", "serviceaccounts", "serviceaccount", "ServiceAccount", True, ("sa",), subresources=()
)
SECRETS = ResourceType("", "v1", "secrets", "secret", "Secret", True, (), subresources=())
_RBAC = "rbac.authorization.k8s.io"
ROLES = ResourceType(_RBAC, "v1", "roles", "role", "Role", True, (), subresources=())
ROLE_BINDINGS = ResourceType(
    _RBAC, "v1", "rolebindings", "rolebinding", "RoleBinding", True, (), subresources=()
)
CLUSTER_ROLES = ResourceType(
    _RBAC, "v1", "clusterroles", "clusterrole", "ClusterRole", False, (), subresources=()
)
CLUSTER_ROLE_BINDINGS = ResourceType(
    _RBAC, "v1", "clusterrolebindings", "clusterrolebinding", "ClusterRoleBinding", False, (), subresources=()
)
SELF_SUBJECT_ACCESS_REVIEWS = ResourceType(
    "authorization.k8s.io",
    "v1",
    "selfsubjectaccessreviews",
    "selfsubjectaccessreview",
    "SelfSubjectAccessReview",
    False,
    (),
    subresources=(),
)
# Served only by clusters configured with Volcano (the default).
VOLCANO_GROUPS = frozenset({"batch.volcano.sh", "scheduling.volcano.sh"})

ALL: tuple[ResourceType, ...] = (
    NAMESPACES,
    NODES,
    PODS,
    SERVICES,
    EVENTS,
    CONFIG_MAPS,
    LEASES,
    PRIORITY_CLASSES,
    BATCH_JOBS,
    VOLCANO_JOBS,
    POD_GROUPS,
    QUEUES,
    SERVICE_ACCOUNTS,
    SECRETS,
    ROLES,
    ROLE_BINDINGS,
    CLUSTER_ROLES,
    CLUSTER_ROLE_BINDINGS,
    SELF_SUBJECT_ACCESS_REVIEWS,
)

# (group, version) -> plural -> type, for routing.
BY_GROUP_VERSION: dict[tuple[str, str], dict[str, ResourceType]] = {}
for _rt in ALL:
    BY_GROUP_VERSION.setdefault((_rt.group, _rt.version), {})[_rt.plural] = _rt

# Every served type answers every verb; the simulator has no read-only kinds.
VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    return BY_GROUP_VERSION.get((group, version), {}).get(plural)
