"""Job set records in etcd, and the one transaction that releases members as jobs.

`JobSetStore` writes a set create-only (a second submission of the same set finds the first) and
changes it only by compare-and-swap on the revision it read. `release` creates the members' jobs
and marks them released in one transaction: after a crash either both happened or neither, so no
accepted member is lost and none is made twice.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from federation.errors import IdempotencyConflict, InvalidArgument
from federation.jobsets.records import (
    JOBSETS,
    JobSetRecord,
    SetMember,
    decode_set,
    encode_set,
    set_key,
    tenant_prefix,
)
from federation.jobsets.sweeps import MetricSource, params_json, trial_env
from federation.spec.jobspec import TrainingJobSpec
from federation.spec.pod_template import template_text
from federation.store.job_store import Stored, job_key
from federation.store.jobs import JobRecord, job_to_dict
from federation.store.kv import Compare, Get, KeyValueStore, Put
from federation.store.schema_version import dumps
from placement.model import JobPhase

# A set record holds every member and every distinct spec; etcd refuses a value over 1.5 MiB, and
# a release writes the record beside up to 40 jobs in one request.
MAX_SET_RECORD_BYTES = 1024 * 1024

ARRAY_INDEX_ENV = "GPUFED_ARRAY_INDEX"
ARRAY_COUNT_ENV = "GPUFED_ARRAY_COUNT"
ARRAY_MIN_ENV = "GPUFED_ARRAY_MIN"
ARRAY_MAX_ENV = "GPUFED_ARRAY_MAX"
JOB_SET_ENV = "GPUFED_JOB_SET"
# Where a sweep trial's values are in its pods (docs/jobsets.md, "Sweeps").
PARAMS_ANNOTATION = "gpufed.io/sweep-params"
PARAMS_VOLUME = "gpufed-sweep-params"
PARAMS_DIR = "/etc/gpufed-sweep"
PARAMS_FILE = "params.json"
PARAMS_PATH = f"{PARAMS_DIR}/{PARAMS_FILE}"


class JobSetStore:
    def __init__(self, kv: KeyValueStore) -> None:
        self._kv = kv

    @property
    def kv(self) -> KeyValueStore:
        """The etcd the sets are in (and the jobs, and their kept logs)."""
        return self._kv

    async def create(self, record: JobSetRecord) -> tuple[Stored[JobSetRecord], bool]:
        """Create the set unless the tenant has one of that name. The same set again (same digest)
        returns the first; a different one under the name raises IdempotencyConflict."""
        key = set_key(record.tenant, record.name)
        value = encode_set(record)
        if len(value) > MAX_SET_RECORD_BYTES:
            raise InvalidArgument(
                f"job set {record.name!r} is {len(value)} bytes stored, over the limit of "
                f"{MAX_SET_RECORD_BYTES}: split it into smaller sets"
            )
        result = await self._kv.txn((Compare.absent(key),), (Put(key, value),), (Get(key),))
        if result.succeeded:
            return Stored(record, result.revision), True
        (existing,) = result.gets
        assert existing is not None  # the compare said it exists
        first = decode_set(existing.value, existing.key)
        if first.digest != record.digest:
            raise IdempotencyConflict(
                f"job set {record.name!r} already exists in tenant {record.tenant} with other jobs or "
                "limits; choose another name (set names are per tenant and never reused)"
            )
        return Stored(first, existing.mod_revision), False

    async def get(self, tenant: str, name: str) -> Stored[JobSetRecord] | None:
        found = await self._kv.get(set_key(tenant, name))
        return None if found is None else Stored(decode_set(found.value, found.key), found.mod_revision)

    async def list_sets(self, tenant: str | None) -> list[Stored[JobSetRecord]]:
        """Every set of a tenant (None: of all tenants), by tenant and name."""
        prefix = JOBSETS if tenant is None else tenant_prefix(tenant)
        out: list[Stored[JobSetRecord]] = []
        start: bytes | None = None
        while True:
            page = await self._kv.range_prefix(prefix, limit=200, start=start)
            out.extend(Stored(decode_set(kv.value, kv.key), kv.mod_revision) for kv in page.kvs)
            if not page.more or not page.kvs:
                return out
            start = page.kvs[-1].key + b"\0"

    async def list_active(self) -> list[Stored[JobSetRecord]]:
        """The sets a controller has work in: members still held, or cancelled. A set whose members
        were all released is not decoded (a check of its bytes), however many jobs it had."""
        out: list[Stored[JobSetRecord]] = []
        start: bytes | None = None
        while True:
            page = await self._kv.range_prefix(JOBSETS, limit=200, start=start)
            for kv in page.kvs:
                if b'"state":"held"' in kv.value or b'"cancel_requested":true' in kv.value:
                    out.append(Stored(decode_set(kv.value, kv.key), kv.mod_revision))
            if not page.more or not page.kvs:
                return out
            start = page.kvs[-1].key + b"\0"

    async def list_stopping(self) -> list[Stored[JobSetRecord]]:
        """The sweeps with early stopping that are not cancelled; other sets are not decoded."""
        out: list[Stored[JobSetRecord]] = []
        start: bytes | None = None
        while True:
            page = await self._kv.range_prefix(JOBSETS, limit=200, start=start)
            for kv in page.kvs:
                if b'"earlyStopping"' in kv.value and b'"cancel_requested":true' not in kv.value:
                    out.append(Stored(decode_set(kv.value, kv.key), kv.mod_revision))
            if not page.more or not page.kvs:
                return out
            start = page.kvs[-1].key + b"\0"

    async def update(self, stored: Stored[JobSetRecord], record: JobSetRecord) -> int | None:
        """Write `record` if the set is still at the revision read; the new revision, or None."""
        key = set_key(record.tenant, record.name)
        result = await self._kv.txn(
            (Compare.mod_revision_is(key, stored.mod_revision),), (Put(key, encode_set(record)),)
        )
        return result.revision if result.succeeded else None

    async def release(
        self, stored: Stored[JobSetRecord], record: JobSetRecord, jobs: Sequence[JobRecord]
    ) -> int | None:
        """Create `jobs` and write `record` (their members marked released) in one transaction, if
        the set is still at the revision read and none of the jobs exists; else None, nothing written."""
        key = set_key(record.tenant, record.name)
        compares = [Compare.mod_revision_is(key, stored.mod_revision)]
        compares += [Compare.absent(job_key(j.job_id)) for j in jobs]
        puts = [Put(job_key(j.job_id), dumps(job_to_dict(j))) for j in jobs]
        result = await self._kv.txn(tuple(compares), (*puts, Put(key, encode_set(record))))
        return result.revision if result.succeeded else None


def member_job(record: JobSetRecord, member: SetMember, *, now_s: float) -> JobRecord:
    """The job a member becomes when released: the set's spec for it (with the array's index in
    every task's environment), queued now, with the priority checked at submission."""
    template = record.templates[member.template]
    spec = template.spec
    env = {JOB_SET_ENV: record.name}
    if member.array_index is not None:
        indices = [m.array_index for m in record.members if m.array_index is not None]
        env |= {
            ARRAY_INDEX_ENV: str(member.array_index),
            ARRAY_COUNT_ENV: str(len(indices)),
            ARRAY_MIN_ENV: str(min(indices)),
            ARRAY_MAX_ENV: str(max(indices)),
        }
    if record.sweep is not None:
        values = json.loads(member.params or "{}")
        env |= trial_env(record.name, trial_number(member.key), values)
        spec = with_params_file(spec, params_json(values))
        metric = record.sweep.get("metric") or {}
        if metric.get("source") == MetricSource.FILE:
            spec = with_metric_file(spec, str(metric["path"]))
    return JobRecord(
        job_id=member.job_id,
        tenant=record.tenant,
        user=record.user,
        spec=with_env(spec, env),
        phase=JobPhase.QUEUED,
        submitted_at_s=now_s,
        queued_at_s=now_s,
        priority=template.priority,
        job_set=record.name,
        array_index=member.array_index,
    )


def trial_key(number: int) -> str:
    """A sweep member's key: `trial-7`."""
    return f"trial-{number}"


def trial_number(key: str) -> int:
    return int(key.rpartition("-")[2])


def with_params_file(spec: TrainingJobSpec, text: str) -> TrainingJobSpec:
    """`spec` whose every pod carries the trial's values as an annotation, projected into each of its
    containers as the file PARAMS_PATH by a downward API volume (as the rendezvous hostfile is): no
    ConfigMap to create or clean up, and readable only where the pod is. A user's template may not
    set a gpufed.io annotation, so a trial cannot be handed another's values."""
    tasks = []
    for task in spec.tasks:
        template: dict[str, Any] = (
            json.loads(task.template) if task.template else {"spec": {"containers": [{}]}}
        )
        metadata = template.setdefault("metadata", {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}), PARAMS_ANNOTATION: text}
        pod = template.setdefault("spec", {})
        if not pod.get("containers"):
            pod["containers"] = [{}]
        pod["volumes"] = [
            *(v for v in pod.get("volumes") or [] if v.get("name") != PARAMS_VOLUME),
            {
                "name": PARAMS_VOLUME,
                "downwardAPI": {
                    "items": [
                        {
                            "path": PARAMS_FILE,
                            "fieldRef": {"fieldPath": f"metadata.annotations['{PARAMS_ANNOTATION}']"},
                        }
                    ]
                },
            },
        ]
        for container in pod["containers"]:
            mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != PARAMS_VOLUME]
            container["volumeMounts"] = [
                *mounts,
                {"name": PARAMS_VOLUME, "mountPath": PARAMS_DIR, "readOnly": True},
            ]
        tasks.append(replace(task, template=template_text(template)))
    return replace(spec, tasks=tuple(tasks))


def with_metric_file(spec: TrainingJobSpec, path: str) -> TrainingJobSpec:
    """`spec` whose every task's main container has `path` as its termination message file, read by
    the kubelet when the container ends into its terminated state's message (policy File: only the
    file, never the log). The sweep's submission refused a template that sets either field."""
    tasks = []
    for task in spec.tasks:
        template: dict[str, Any] = (
            json.loads(task.template) if task.template else {"spec": {"containers": [{}]}}
        )
        pod = template.setdefault("spec", {})
        if not pod.get("containers"):
            pod["containers"] = [{}]
        pod["containers"][0] |= {"terminationMessagePath": path, "terminationMessagePolicy": "File"}
        tasks.append(replace(task, template=template_text(template)))
    return replace(spec, tasks=tuple(tasks))


def with_env(spec: TrainingJobSpec, env: dict[str, str]) -> TrainingJobSpec:
    """`spec` with `env` set in every task (the set's values win over the manifest's own)."""
    tasks = tuple(
        replace(task, env=(*((k, v) for k, v in task.env if k not in env), *env.items()))
        for task in spec.tasks
    )
    return replace(spec, tasks=tasks)
