"""API discovery documents: what kubectl and the python client read to find resources and verbs.

kubectl resolves `vcjob`, `po` or `pg` through these lists, and gpufed's backend decides between a
Volcano Job and an Indexed Job by whether `/apis` lists `batch.volcano.sh`. Answered as plain
`application/json` (the legacy, unaggregated form), which current kubectl falls back to.
"""

from __future__ import annotations

from typing import Any

from clusters.sim.resources import ALL, BY_GROUP_VERSION, VERBS, VOLCANO_GROUPS, ResourceType

Obj = dict[str, Any]

_SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "eviction": ["create"], "log": ["get"]}


def version(kubernetes_version: str) -> Obj:
    major, minor = kubernetes_version.lstrip("v").split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"{kubernetes_version}-gpufed-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def core_versions(server_address: str) -> Obj:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }


def _group(name: str, versions: list[str]) -> Obj:
    listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": listed, "preferredVersion": listed[0]}


def groups(volcano: bool = True) -> Obj:
    by_group: dict[str, list[str]] = {}
    for rt in ALL:
        if not volcano and rt.group in VOLCANO_GROUPS:
            continue
        if rt.group and rt.version not in by_group.setdefault(rt.group, []):
            by_group[rt.group].append(rt.version)
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [_group(name, versions) for name, versions in by_group.items()],
    }


def group(name: str) -> Obj | None:
    versions = [v for g, v in BY_GROUP_VERSION if g == name]
    if not name or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def _resource(rt: ResourceType) -> list[Obj]:
    main: Obj = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(VERBS),
        "storageVersionHash": "",
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    out = [main]
    for sub in rt.subresources:
        entry: Obj = {
            "name": f"{rt.plural}/{sub}",
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": _SUBRESOURCE_VERBS[sub],
        }
        if sub == "eviction":
            entry.update(group="policy", version="v1", kind="Eviction")
        out.append(entry)
    return out


def resources(group_name: str, group_version: str) -> Obj | None:
    types = BY_GROUP_VERSION.get((group_name, group_version))
    if types is None:
        return None
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group_name}/{group_version}" if group_name else group_version,
        "resources": [entry for rt in types.values() for entry in _resource(rt)],
    }
