"""A job set as etcd keeps it: its jobs' specs, its members, and whether each is held or released.

One record per set, at `/gpufed/jobsets/<tenant>/<name>` (names are per tenant, like datasets'),
written create-only at submission and by compare-and-swap afterwards. A member is released by one
transaction that creates its job and marks it released together, so a released member always has
its job in etcd until the archiver moves the ended job to the history store: a released member
whose job is gone from etcd has ended.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from federation.spec.jobspec import TrainingJobSpec
from federation.store.jobs import spec_from_dict, spec_to_dict
from federation.store.schema_version import dumps, loads
from placement.model import JobId, TenantId

JOBSETS = b"/gpufed/jobsets/"


def set_key(tenant: str, name: str) -> bytes:
    return JOBSETS + tenant.encode() + b"/" + name.encode()


def tenant_prefix(tenant: str) -> bytes:
    return JOBSETS + tenant.encode() + b"/"


class MemberState(StrEnum):
    # Waiting for the set's limit to leave room; no job exists yet.
    HELD = "held"
    # Its job exists (or existed and was archived once ended).
    RELEASED = "released"
    # The set was cancelled while it was held: it never ran.
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class SetTemplate:
    """One distinct job of the set as submitted and checked: the spec, its priority value and digest."""

    spec: TrainingJobSpec
    priority: int
    digest: str


@dataclass(frozen=True, slots=True)
class SetMember:
    # The array index as text, or the job's name in a set of named jobs.
    key: str
    template: int
    array_index: int | None
    # The job of the member's current run (made when released; fixed in advance, so that a release
    # retried after a crash names the same job).
    job_id: JobId
    state: MemberState
    # The member's earlier jobs, oldest first: failed runs that `resubmit` replaced.
    earlier: tuple[JobId, ...] = ()
    # A sweep's trial: its parameter values as JSON (`sweeps.params_json`); "" for other sets.
    params: str = ""


@dataclass(frozen=True, slots=True)
class JobSetRecord:
    tenant: TenantId
    name: str
    user: str
    created_at_s: float
    # What makes a resubmission "the same set": the members' keys and their manifests' digests, the
    # limit and the array range.
    digest: str
    max_parallel: int
    # The array range as written canonically (`0-199%20`), or "" for a set of named jobs.
    array: str
    templates: tuple[SetTemplate, ...]
    members: tuple[SetMember, ...]
    cancel_requested: bool = False
    cancel_reason: str = ""
    resubmitted_at_s: float | None = None
    # A sweep's search, parameters and metric (`SweepSpec.to_dict`); None for other sets.
    sweep: dict[str, Any] | None = None

    def with_members(self, members: tuple[SetMember, ...], **changes: Any) -> JobSetRecord:
        return replace(self, members=members, **changes)


def member_job_id(tenant: str, set_name: str, key: str, job_name: str, generation: int) -> JobId:
    """The job id of a member's run: readable (the job's name, and the array index) and fixed by
    tenant, set, member and run, so two releases of one member can only make one job."""
    seed = f"{tenant}\n{set_name}\n{key}\n{generation}".encode()
    tag = hashlib.sha256(seed).hexdigest()[:12]
    stem = job_name[:40].rstrip("-")
    return JobId(f"{stem}-{tag}")


def member_job_name(spec: TrainingJobSpec, index: int | None) -> str:
    """The name a member's job id starts with: the job's name, and an array copy's index."""
    return spec.name if index is None else f"{spec.name[:30].rstrip('-')}-{index}"


def set_digest(members: list[tuple[str, str]], max_parallel: int, array: str) -> str:
    """sha256 over (member key, manifest digest) pairs in order, the limit and the array range."""
    h = hashlib.sha256()
    h.update(f"limit={max_parallel}\narray={array}\n".encode())
    for key, digest in members:
        h.update(f"{key}={digest}\n".encode())
    return h.hexdigest()


# ---- codec: explicit, like federation.store.jobs, so a renamed field is a visible change.


def set_to_dict(record: JobSetRecord) -> dict[str, Any]:
    return {
        "tenant": record.tenant,
        "name": record.name,
        "user": record.user,
        "created_at_s": record.created_at_s,
        "digest": record.digest,
        "max_parallel": record.max_parallel,
        "array": record.array,
        "templates": [
            {"spec": spec_to_dict(t.spec), "priority": t.priority, "digest": t.digest}
            for t in record.templates
        ],
        "members": [
            {
                "key": m.key,
                "template": m.template,
                "array_index": m.array_index,
                "job_id": m.job_id,
                "state": m.state.value,
                "earlier": list(m.earlier),
                **({"params": m.params} if m.params else {}),
            }
            for m in record.members
        ],
        "cancel_requested": record.cancel_requested,
        "cancel_reason": record.cancel_reason,
        "resubmitted_at_s": record.resubmitted_at_s,
        **({"sweep": record.sweep} if record.sweep is not None else {}),
    }


def set_from_dict(d: dict[str, Any]) -> JobSetRecord:
    return JobSetRecord(
        tenant=TenantId(d["tenant"]),
        name=str(d["name"]),
        user=str(d["user"]),
        created_at_s=float(d["created_at_s"]),
        digest=str(d["digest"]),
        max_parallel=int(d["max_parallel"]),
        array=str(d.get("array", "")),
        templates=tuple(
            SetTemplate(spec=spec_from_dict(t["spec"]), priority=int(t["priority"]), digest=str(t["digest"]))
            for t in d["templates"]
        ),
        members=tuple(
            SetMember(
                key=str(m["key"]),
                template=int(m["template"]),
                array_index=None if m.get("array_index") is None else int(m["array_index"]),
                job_id=JobId(m["job_id"]),
                state=MemberState(m["state"]),
                earlier=tuple(JobId(j) for j in m.get("earlier") or ()),
                params=str(m.get("params", "")),
            )
            for m in d["members"]
        ),
        cancel_requested=bool(d.get("cancel_requested", False)),
        cancel_reason=str(d.get("cancel_reason", "")),
        resubmitted_at_s=None if d.get("resubmitted_at_s") is None else float(d["resubmitted_at_s"]),
        sweep=None if d.get("sweep") is None else dict(d["sweep"]),
    )


def encode_set(record: JobSetRecord) -> bytes:
    return dumps(set_to_dict(record))


def decode_set(raw: bytes, key: bytes | None = None) -> JobSetRecord:
    return set_from_dict(loads(raw, key))
