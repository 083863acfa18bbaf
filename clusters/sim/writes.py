"""The write verbs (create, update, patch, delete) with the options a real API server honours.

`dryRun=All` runs a write all the way through admission, validation and the merge, and returns
the object as it would be, but stores nothing: no resourceVersion is used, no watch event is sent
and so no controller acts (kubectl's `--dry-run=server` and `kubectl diff` rely on exactly that).
A dry-run create comes back without a resourceVersion, a dry-run update with the current one.
`fieldManager` and `fieldValidation` are read and checked here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from clusters.sim import apply, canonical, errors, immutable, patch, podstatus
from clusters.sim.clock import rfc3339
from clusters.sim.engine import Engine
from clusters.sim.errors import ApiError
from clusters.sim.reads import selectors
from clusters.sim.resources import PODS, VOLCANO_GROUPS, ResourceType
from clusters.sim.store import clone

Obj = dict[str, Any]


def dry_run(query: Mapping[str, str], body: Any = None) -> bool:
    """`dryRun=All` from the query or from a DeleteOptions body; any other value is refused."""
    values: list[str] = list(getattr(query, "getall", lambda _k, _d: [])("dryRun", [])) or (
        [query["dryRun"]] if "dryRun" in query else []
    )
    if isinstance(body, dict) and isinstance(body.get("dryRun"), list):
        values += [str(v) for v in body["dryRun"]]
    for value in values:
        if value != "All":
            raise ApiError(
                400, "BadRequest", f'dryRun: Unsupported value: "{value}": supported values: "All"'
            )
    return bool(values)


def check_name(body: Any, name: str) -> Obj:
    if not isinstance(body, dict):
        raise errors.bad_request("the body must be a JSON object")
    body_name = (body.get("metadata") or {}).get("name")
    if body_name and body_name != name:
        raise errors.bad_request(
            f"the name of the object ({body_name}) does not match the name on the URL ({name})"
        )
    body.setdefault("metadata", {})["name"] = name
    checked: Obj = body
    return checked


def merge_for_update(rt: ResourceType, old: Obj, new: Obj, sub: str | None) -> Obj:
    """Status is written only through `/status`, and `/status` writes nothing else."""
    if sub == "status":
        merged = clone(old)
        merged["status"] = new.get("status") or {}
        merged["metadata"]["resourceVersion"] = (new.get("metadata") or {}).get("resourceVersion")
        return merged
    merged = clone(new)
    m = merged.setdefault("metadata", {})
    for kept in ("deletionTimestamp", "deletionGracePeriodSeconds"):
        if kept in old["metadata"]:
            m[kept] = old["metadata"][kept]
    if rt.has_status:
        merged["status"] = clone(old.get("status") or {})
    if rt is PODS and podstatus.node_name(old):
        merged.setdefault("spec", {})["nodeName"] = podstatus.node_name(old)
    return merged


class Writes:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def create(self, rt: ResourceType, namespace: str | None, body: Any, query: Mapping[str, str]) -> Obj:
        dry = dry_run(query)
        # The request's body, parsed for this create alone (ApiServer._create).
        obj = self._engine.admission.admit_create(rt, body, namespace, owned=True)
        apply.record_update(obj, None, query, "Update")
        return self._engine.store.create(rt, obj, dry_run=dry)

    def replace(
        self, rt: ResourceType, ns: str, name: str, sub: str | None, body: Any, query: Mapping[str, str]
    ) -> Obj:
        dry = dry_run(query)
        body = check_name(body, name)
        store = self._engine.store
        old = store.require(rt, ns, name)
        merged = merge_for_update(rt, old, body, sub)
        if sub is None:
            canonical.quantities(rt, merged)  # decoded before validated, as on a real server
            immutable.check_update(rt, old, merged)
        expect = (body.get("metadata") or {}).get("resourceVersion")
        merged["metadata"]["namespace"] = old["metadata"].get("namespace")
        apply.record_update(merged, old, query, "Update", sub)
        return store.update(rt, merged, expect_rv=expect, dry_run=dry)

    def patch(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        sub: str | None,
        content_type: str,
        body: Any,
        query: Mapping[str, str],
    ) -> tuple[Obj, bool]:
        """The patched object and whether it was created (a server-side apply may create)."""
        dry = dry_run(query)
        store = self._engine.store
        media = content_type.split(";", 1)[0].strip()
        if media == patch.STRATEGIC and rt.group in VOLCANO_GROUPS:
            raise errors.unsupported_media(
                f"{media}: strategic merge patch is not supported for custom resources; accepted media "
                "types include: application/json-patch+json, application/merge-patch+json, "
                "application/apply-patch+yaml"
            )
        if media == patch.APPLY:
            old = store.get(rt, ns, name)
            if old is None:
                if sub is not None:
                    raise errors.not_found(rt, name)
                obj = apply.apply_create(rt, check_name(body, name), query)
                admitted = self._engine.admission.admit_create(rt, obj, ns or None)
                return store.create(rt, admitted, dry_run=dry), True
            patched = apply.apply_patch(rt, old, body, query)
        else:
            old = store.require(rt, ns, name)
            patched = patch.apply(content_type, old, body)
        patched = check_name(patched, name)
        expect = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
        merged = merge_for_update(rt, old, patched, sub)
        if sub is None:
            canonical.quantities(rt, merged)  # decoded before validated, as on a real server
            immutable.check_update(rt, old, merged)
        merged["metadata"]["namespace"] = old["metadata"].get("namespace")
        if media != patch.APPLY:
            apply.record_update(merged, old, query, "Update", sub)
        return store.update(rt, merged, expect_rv=expect, dry_run=dry), False

    def delete_options(
        self, body: Any, query: Mapping[str, str]
    ) -> tuple[float | None, str | None, Obj, bool]:
        options: Obj = body if isinstance(body, dict) else {}
        grace = options.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        policy = options.get("propagationPolicy", query.get("propagationPolicy"))
        orphan = options.get("orphanDependents", query.get("orphanDependents"))
        if policy is None and orphan is not None:
            policy = "Orphan" if str(orphan).lower() == "true" else "Background"
        try:
            grace_s = None if grace is None else float(grace)
        except ValueError as exc:
            raise errors.bad_request(f"invalid gracePeriodSeconds: {grace}") from exc
        if policy not in (None, "Foreground", "Background", "Orphan"):
            raise errors.bad_request(f"invalid propagationPolicy: {policy}")
        return grace_s, policy, options.get("preconditions") or {}, dry_run(query, options)

    def delete(self, rt: ResourceType, ns: str, name: str, body: Any, query: Mapping[str, str]) -> Obj:
        grace_s, policy, preconditions, dry = self.delete_options(body, query)
        current = self._engine.store.require(rt, ns, name)
        for field in ("uid", "resourceVersion"):
            wanted = preconditions.get(field)
            if wanted and wanted != current["metadata"].get(field):
                raise errors.conflict(
                    rt,
                    name,
                    f"Precondition failed: {field} in precondition: {wanted}, "
                    f"{field} in object meta: {current['metadata'].get(field)}",
                )
        if dry:
            return self._delete_preview(rt, current, grace_s)
        return self._engine.lifecycle.delete(rt, ns, name, grace_s=grace_s, propagation=policy)

    def _delete_preview(self, rt: ResourceType, current: Obj, grace_s: float | None) -> Obj:
        """What a dry-run delete answers: a running pod as it would be marked for graceful
        deletion; anything else as it is. Nothing is marked, nothing is told."""
        preview = clone(current)
        if rt is not PODS or podstatus.is_deleting(current) or not podstatus.node_name(current):
            return preview
        if (current.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return preview
        spec_grace = (current.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        grace = int(spec_grace if grace_s is None else grace_s)
        if grace > 0:
            m = preview["metadata"]
            m["deletionTimestamp"] = rfc3339(self._engine.clock.wall_s() + grace)
            m["deletionGracePeriodSeconds"] = grace
        return preview

    def delete_collection(
        self, rt: ResourceType, namespace: str | None, body: Any, query: Mapping[str, str]
    ) -> Obj:
        grace_s, policy, _, dry = self.delete_options(body, query)
        labels, fields = selectors(rt, query)
        store = self._engine.store
        removed = []
        for obj in store.list(rt, namespace, labels, fields):
            ns, name = obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
            if dry:
                removed.append(clone(obj))
                continue
            try:
                removed.append(
                    self._engine.lifecycle.delete(rt, ns, name, grace_s=grace_s, propagation=policy)
                )
            except ApiError:
                continue
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(store.resource_version)},
            "items": removed,
        }
