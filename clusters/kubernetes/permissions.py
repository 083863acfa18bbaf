"""Every API permission gpufed's cluster client uses on a member cluster, in one list.

`gpufed cluster join` grants exactly this list to the account it makes, `gpufed cluster check`
asks the API (SelfSubjectAccessReview) about every entry, and a unit test walks the client's code
(`kube.py`, `logs.py`) so that a call added without an entry here fails. One list, so that the
three cannot drift apart.

Namespaced entries are granted in every namespace (a ClusterRole bound cluster-wide): gpufed makes a
namespace per tenant (`gpufed-<tenant>`) when a tenant's first gang arrives, and RBAC has no way to
name "the namespaces whose name starts with gpufed-". What the account can touch is still only the
kinds below: no ConfigMaps, Nodes beyond reading, RBAC objects or anything else. Secrets it may
create and delete (a job's copy of its tenant's secrets, by name), never read or list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from clusters.kubernetes.manifests import VOLCANO_GROUP, VOLCANO_SCHEDULING_GROUP


class Scope(StrEnum):
    # A cluster-scoped kind (nodes, namespaces, queues), or a namespaced kind read across all
    # namespaces at once (the informers' list and watch).
    CLUSTER = "cluster"
    # Objects inside one namespace (gpufed's per-tenant namespaces).
    NAMESPACED = "namespaced"


@dataclass(frozen=True, slots=True)
class Permission:
    group: str
    resource: str
    verbs: tuple[str, ...]
    scope: Scope
    why: str
    subresource: str = ""
    # What gpufed does without it, for a verb it can do without (a cluster joined before gpufed asked
    # for it): `cluster check` then warns rather than fails. Empty: the verb is needed.
    without: str = ""

    @property
    def resource_path(self) -> str:
        """How RBAC rules name it: `pods`, `pods/log`."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def describe(self, verb: str) -> str:
        group = self.group or "core"
        where = "in any namespace" if self.scope is Scope.NAMESPACED else "cluster-wide"
        return f"{verb} {self.resource_path} ({group} group, {where})"


_CORE = ""
_BATCH = "batch"
_C, _N = Scope.CLUSTER, Scope.NAMESPACED

PERMISSIONS: tuple[Permission, ...] = (
    Permission(_CORE, "nodes", ("list", "watch"), _C, "inventory: GPU nodes, their labels and capacity"),
    Permission(_CORE, "pods", ("list", "watch"), _C, "inventory (GPUs in use) and gang status"),
    Permission(_CORE, "pods", ("delete",), _N, "removing a failed attempt's leftover pods"),
    Permission(_CORE, "pods", ("get",), _N, "job logs", subresource="log"),
    Permission(
        _CORE, "namespaces", ("create", "patch"), _C, "one namespace per tenant, its pod security labels"
    ),
    Permission(_CORE, "services", ("list",), _C, "garbage collection of rendezvous services"),
    Permission(_CORE, "services", ("create", "delete"), _N, "the gang's headless rendezvous service"),
    Permission(
        _CORE, "secrets", ("create", "delete"), _N, "a job's copy of its tenant's secrets (never read)"
    ),
    Permission(_CORE, "events", ("list", "create"), _N, "describe (events) and recording an eviction"),
    Permission(_BATCH, "jobs", ("list", "watch"), _C, "status of gangs run as Indexed Jobs"),
    Permission(_BATCH, "jobs", ("create", "patch", "delete"), _N, "dispatch, annotate, cancel Indexed Jobs"),
    Permission(VOLCANO_GROUP, "jobs", ("list", "watch"), _C, "status of gangs run as Volcano Jobs"),
    Permission(VOLCANO_GROUP, "jobs", ("create", "patch", "delete"), _N, "dispatch, annotate, cancel vcjobs"),
    Permission(
        _BATCH,
        "jobs",
        ("deletecollection",),
        _N,
        "removing a tick's ended Indexed Jobs of a namespace in one call, by their labels",
        without="it deletes them one by one",
    ),
    Permission(
        _CORE,
        "services",
        ("deletecollection",),
        _N,
        "removing the ended Indexed Jobs' rendezvous services in one call, by their labels",
        without="it deletes them one by one",
    ),
    Permission(
        VOLCANO_GROUP,
        "jobs",
        ("deletecollection",),
        _N,
        "removing a tick's ended vcjobs of a namespace in one call, by their labels",
        without="it deletes them one by one",
    ),
    Permission(VOLCANO_SCHEDULING_GROUP, "queues", ("create",), _C, "one Volcano queue per tenant"),
    Permission(VOLCANO_SCHEDULING_GROUP, "podgroups", ("delete",), _N, "removing a leftover pod group"),
)


# Discovery and the version: non-resource URLs that Kubernetes' default `system:discovery` role opens
# to every authenticated account, so the list needs no entry for them.
DISCOVERY_PATHS = frozenset({"/api", "/apis", "/version"})


def is_discovery(path: str) -> bool:
    """`/apis/<group>/<version>` (a group's resource list) is discovery too; a collection is not."""
    return path in DISCOVERY_PATHS or re.fullmatch(r"/apis/[^/]+(/[^/]+)?/?|/api/v1/?", path) is not None


@dataclass(frozen=True, slots=True)
class Request:
    """One API request reduced to what RBAC decides on."""

    group: str
    resource: str
    subresource: str
    verb: str
    namespaced: bool


_VERB_OF_METHOD = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[^/]+))?$"
)


def request_of(method: str, path: str, *, watch: bool = False) -> Request:
    """What a request (`GET /api/v1/namespaces/{namespace}/events`) asks RBAC for.

    A GET on a collection is `list`, or `watch` with `watch=true`; on one object, `get`. Raises
    ValueError for a path that names no resource (discovery, `/version`: open to every account).
    """
    match = _PATH.match(path)
    if match is None:
        raise ValueError(f"{method} {path} names no API resource")
    named = match["name"] is not None
    if method == "GET":
        verb = "get" if named else ("watch" if watch else "list")
    elif method == "DELETE" and not named:
        verb = "deletecollection"
    else:
        verb = _VERB_OF_METHOD[method]
    return Request(
        group=match["group"] or "",
        resource=match["resource"],
        subresource=match["sub"] or "",
        verb=verb,
        namespaced=match["ns"] is not None,
    )


def granted_to_everyone(request: Request) -> bool:
    """Asking what one may do: Kubernetes' `system:basic-user` role lets every account do it."""
    return (request.group, request.resource, request.verb) == (
        "authorization.k8s.io",
        "selfsubjectaccessreviews",
        "create",
    )


def covering(request: Request, permissions: Iterable[Permission] = PERMISSIONS) -> Permission | None:
    """The entry that grants `request`, if any."""
    scope = Scope.NAMESPACED if request.namespaced else Scope.CLUSTER
    for p in permissions:
        if (
            p.group == request.group
            and p.resource == request.resource
            and p.subresource == request.subresource
            and request.verb in p.verbs
            and p.scope is scope
        ):
            return p
    return None


def checks() -> list[tuple[Permission, str]]:
    """Every (entry, verb) pair, in the list's order: what `cluster check` asks about."""
    return [(p, verb) for p in PERMISSIONS for verb in p.verbs]


def cluster_role_rules() -> list[dict[str, object]]:
    """The list as ClusterRole rules, one rule per (group, resource) with every verb it needs."""
    merged: dict[tuple[str, str], list[str]] = {}
    for p in PERMISSIONS:
        verbs = merged.setdefault((p.group, p.resource_path), [])
        verbs.extend(v for v in p.verbs if v not in verbs)
    return [
        {"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs)}
        for (group, resource), verbs in merged.items()
    ]
