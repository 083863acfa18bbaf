"""What `gpufed cluster check` finds on a member cluster, through gpufed's own kubeconfig.

Each finding says what was looked at, whether it is fine, and if not how to fix it: the API answers
and its version is one gpufed supports, GPU nodes carry the labels inventory reads, Volcano's kinds
are served (else gangs run as Indexed Jobs, which works but without gang scheduling), and the
account may do every entry of `permissions.PERMISSIONS`, asked of the API itself with one
SelfSubjectAccessReview per verb (what the cluster's authorizer answers, whatever made the roles).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from clusters.kubernetes.errors import NO_ANSWER, reason_of
from clusters.kubernetes.inventory import GPU_RESOURCE, PRODUCT_LABEL, node_info
from clusters.kubernetes.kube import Json, api_client, call, json_of
from clusters.kubernetes.manifests import VOLCANO_GROUP, VOLCANO_SCHEDULING_GROUP, VOLCANO_VERSION
from clusters.kubernetes.permissions import Permission, checks
from placement.model import Provider

_FAILURES: tuple[type[BaseException], ...] = (ApiException, *NO_ANSWER)
# Indexed Jobs with pod failure policies and per-index backoff are GA from 1.29 on.
MIN_VERSION = (1, 29)
_VOLCANO_KINDS = (
    (VOLCANO_GROUP, VOLCANO_VERSION, "jobs"),
    (VOLCANO_SCHEDULING_GROUP, "v1beta1", "podgroups"),
    (VOLCANO_SCHEDULING_GROUP, "v1beta1", "queues"),
)


class Verdict(StrEnum):
    OK = "ok"
    # gpufed works, with less: reported, but `check` still passes.
    WARNING = "warning"
    MISSING = "missing"


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    verdict: Verdict
    detail: str
    fix: str = ""


@dataclass(frozen=True, slots=True)
class Report:
    cluster: str
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return all(f.verdict is not Verdict.MISSING for f in self.findings)

    def missing(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict is Verdict.MISSING]

    def as_dict(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "ok": self.ok,
            "findings": [
                {"check": f.check, "verdict": f.verdict.value, "detail": f.detail, "fix": f.fix}
                for f in self.findings
            ],
        }


class _Api:
    def __init__(self, client: Any, timeout_s: float) -> None:
        self._client = client
        self._timeout = (min(5.0, timeout_s), timeout_s)

    def version(self) -> Json:
        return json_of(call(self._client, "GET", "/version", timeout=self._timeout))

    def groups(self) -> Json:
        return json_of(call(self._client, "GET", "/apis", timeout=self._timeout))

    def group_resources(self, group: str, version: str) -> Json:
        return json_of(
            call(
                self._client,
                "GET",
                "/apis/{group}/{version}",
                timeout=self._timeout,
                path_params={"group": group, "version": version},
            )
        )

    def nodes(self) -> Json:
        return json_of(
            call(self._client, "GET", "/api/v1/nodes", timeout=self._timeout, query=[("limit", 500)])
        )

    def may(self, p: Permission, verb: str) -> Json:
        attributes = {"group": p.group, "resource": p.resource, "subresource": p.subresource, "verb": verb}
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        return json_of(
            call(
                self._client,
                "POST",
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                timeout=self._timeout,
                body=body,
            )
        )


def _failed(error: BaseException) -> str:
    if isinstance(error, ApiException):
        return f"HTTP {error.status} {reason_of(error)}"
    return f"no answer ({error})"


def check(
    cluster: str,
    kubeconfig: Path,
    context: str | None,
    *,
    role: str = "gpufed-member",
    timeout_s: float = 10.0,
) -> Report:
    try:
        client = api_client(kubeconfig, context, pool_size=2)
    except Exception as error:  # the client raises ConfigException, OSError or YAML errors
        finding = Finding("kubeconfig", Verdict.MISSING, f"cannot load {kubeconfig}: {error}", "join again")
        return Report(cluster, (finding,))
    try:
        return Report(cluster, tuple(_findings(_Api(client, timeout_s), cluster, role)))
    finally:
        client.close()


def _findings(api: _Api, cluster: str, role: str) -> list[Finding]:
    try:
        version = api.version()
    except _FAILURES as error:
        fix = "check the server address and the network path; a 401 means the token was revoked: join again"
        return [Finding("reachable", Verdict.MISSING, f"the API did not answer: {_failed(error)}", fix)]
    found = [Finding("reachable", Verdict.OK, "the API answered")]
    found.append(_version(version))
    found.append(_gpu_nodes(api))
    found.append(_volcano(api))
    found += _permissions(api, cluster, role)
    return found


def _version(version: Json) -> Finding:
    text = str(version.get("gitVersion") or "")
    try:
        have = (int(str(version.get("major"))), int(str(version.get("minor")).rstrip("+")))
    except ValueError:
        return Finding("version", Verdict.WARNING, f"server version {text!r} could not be read")
    if have < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        return Finding(
            "version",
            Verdict.MISSING,
            f"Kubernetes {text}; gpufed needs {need} or newer",
            f"upgrade to {need}+",
        )
    return Finding("version", Verdict.OK, f"Kubernetes {text}")


def _gpu_nodes(api: _Api) -> Finding:
    try:
        nodes = list(api.nodes().get("items") or ())
    except _FAILURES as error:
        return Finding(
            "gpu-nodes", Verdict.MISSING, f"nodes could not be listed: {_failed(error)}", "see permissions"
        )
    gpu = [n for n in nodes if ((n.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)]
    # Named by GPU feature discovery, or (without it) by a cloud label the registry reads: how the
    # inventory counts a node (`inventory.node_info`).
    labelled = [n for n in gpu if node_info(n, Provider.PRIVATE) is not None]
    if not gpu:
        return Finding(
            "gpu-nodes",
            Verdict.MISSING,
            f"none of {len(nodes)} nodes offers {GPU_RESOURCE}",
            "install the NVIDIA device plugin (or the GPU operator) on the GPU nodes",
        )
    if len(labelled) < len(gpu):
        bare = sorted(str((n.get("metadata") or {}).get("name")) for n in gpu if n not in labelled)
        return Finding(
            "gpu-nodes",
            Verdict.MISSING,
            f"{len(bare)} of {len(gpu)} GPU nodes lack the {PRODUCT_LABEL} label "
            f"(or a cloud's GPU label gpufed reads): {', '.join(bare[:5])}",
            "install GPU feature discovery (part of the NVIDIA GPU operator), or label them: "
            f"kubectl label node NAME {PRODUCT_LABEL}=NVIDIA-H100-80GB-HBM3",
        )
    return Finding("gpu-nodes", Verdict.OK, f"{len(gpu)} GPU nodes, each with a GPU product label")


def _volcano(api: _Api) -> Finding:
    fix = "install Volcano (its CRDs and scheduler) for gang scheduling; until then gangs run as Indexed Jobs"
    try:
        groups = {str(g.get("name")) for g in api.groups().get("groups") or ()}
        absent = []
        for group, version, plural in _VOLCANO_KINDS:
            served = (
                {str(r.get("name")) for r in api.group_resources(group, version).get("resources") or ()}
                if group in groups
                else set()
            )
            if plural not in served:
                absent.append(f"{plural}.{group}/{version}")
    except _FAILURES as error:
        return Finding("volcano", Verdict.WARNING, f"discovery failed: {_failed(error)}", fix)
    if absent:
        return Finding(
            "volcano", Verdict.WARNING, f"Volcano's kinds are not served: {', '.join(absent)}", fix
        )
    return Finding("volcano", Verdict.OK, "Volcano's Job, PodGroup and Queue kinds are served")


def _permissions(api: _Api, cluster: str, role: str) -> list[Finding]:
    found = []
    for permission, verb in checks():
        name = f"permission: {permission.describe(verb)}"
        try:
            allowed = bool((api.may(permission, verb).get("status") or {}).get("allowed"))
        except _FAILURES as error:
            found.append(Finding(name, Verdict.MISSING, f"could not be asked: {_failed(error)}", ""))
            continue
        if allowed:
            found.append(Finding(name, Verdict.OK, f"granted ({permission.why})"))
            continue
        rule = json.dumps(
            {"apiGroups": [permission.group], "resources": [permission.resource_path], "verbs": [verb]}
        )
        found.append(
            Finding(
                name,
                Verdict.WARNING if permission.without else Verdict.MISSING,
                f"refused: gpufed uses it for {permission.why}; without it {permission.without}"
                if permission.without
                else f"refused: gpufed needs it for {permission.why}",
                f"run `gpufed cluster join {cluster} --kubeconfig ADMIN_KUBECONFIG` again, which restores "
                f"ClusterRole {role}, or add this rule to it: {rule}",
            )
        )
    return found
