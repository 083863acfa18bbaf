"""Logs that outlive pods: the last KiB of each replica's log, and a summary of the attempt, kept in
etcd when an attempt ends; plus the pure rules that name a failure and place a pod in the spec.

Why etcd and not files under the state dir: every API server of an HA federation must be able to
serve `gpufed logs` for any job, and only etcd is shared between them (a file store would hold the
logs on the leader that happened to see the attempt end). The copy is small and bounded by design:
`keep_kib` per replica (256 KiB by default, well under etcd's 1.5 MiB request limit), one key per
replica, written once per attempt under a lease whose TTL is the retention (plus at most an hour:
one lease serves the attempts kept within an hour), so etcd itself forgets them (`retain_hours`, 168
by default); readers cut at the retention by the time kept, which also covers a lease's countdown
starting again when etcd elects a new leader.

Once the job is archived (`federation.scheduling.archiver`, `history.retainInEtcd` after it ended)
the summaries and tails move to the history store with it and leave etcd; readers find them there,
cut at the same retention, and the leader prunes them from SQL after it.

Keys: `/gpufed/logs/<job id>/<attempt>/_attempt` (JSON summary: placement, times, outcome, reason,
replicas' last states) and `/gpufed/logs/<job id>/<attempt>/<task>-<replica>` (log bytes, each line
stamped with its RFC 3339 time as the pod log API gives it with `timestamps=true`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Protocol

from clusters.api import ReplicaState
from clusters.kubernetes.names import object_name, task_name
from federation.errors import InvalidSpec
from federation.spec.jobspec import TrainingJobSpec
from federation.spec.validate import int_field, number_field
from federation.store.group_commit import GroupCommit
from federation.store.kv import MAX_TXN_OPS, KeyValueStore, LeaseNotFound, Put, Txn, cut_by_size
from federation.store.schema_version import loads, unversioned
from placement.model import JobId

PREFIX = b"/gpufed/logs/"
SUMMARY = "_attempt"
SETTINGS_KEY = b"/gpufed/config/logs"
LEASE_REUSE_S = 3600.0
# Bytes of kept logs per transaction: under etcd's 1.5 MiB request limit with room for the keys and
# framing; one tail (at most `_MAX_KEEP_KIB`) always fits alone.
KEEP_TXN_BYTES = 1024 * 1024
# Attempts kept at once share etcd requests (group commit): a tick that ends many attempts sends
# their tails and summaries in a few requests, not one each (each Python gRPC call cost the leader
# more CPU than the bytes it carried). At most this many transactions share a request, so that each
# may have KEEP_TXN_OPS ops: etcd gives a nested transaction what the request's own count leaves of
# MAX_TXN_OPS. A request is bounded in bytes too (group commit's 1 MiB): a transaction that does not
# fit waits for the next, and one of a gang's large tails goes alone.
KEEP_BATCH = 32
KEEP_TXN_OPS = MAX_TXN_OPS - KEEP_BATCH

# Reasons a container waits that no waiting will fix: `list` shows them while the job is DISPATCHED.
WAITING_REASONS = frozenset(
    {
        "ImagePullBackOff",
        "ErrImagePull",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "InvalidImageName",
    }
)
# The order in which a gang's replicas' reasons name the job's: the cause before its echoes (an
# OOM-killed master makes its workers' ends look like errors).
_RANK = ("OOMKilled", "Evicted", "ImagePullBackOff", "ErrImagePull", "CrashLoopBackOff", "DeadlineExceeded")


@dataclass(frozen=True, slots=True)
class LogsSettings:
    """The `logs:` section of the federation config."""

    keep_kib: int = 256
    retain_hours: float = 168.0
    # Per StreamLogs call: bytes sent before the stream ends with RESOURCE_EXHAUSTED.
    max_bytes_per_call: int = 64 * 1024 * 1024
    # Open StreamLogs calls, per tenant and per server.
    max_streams_per_tenant: int = 64
    max_streams_per_server: int = 512
    # How long the reconciler waits for a finished attempt's logs before it moves on.
    keep_timeout_s: float = 10.0

    @property
    def keep_bytes(self) -> int:
        return self.keep_kib * 1024


# The config file's `logs:` keys, by the field each sets.
_KEYS = {
    "keepKiB": "keep_kib",
    "retainHours": "retain_hours",
    "maxBytesPerCall": "max_bytes_per_call",
    "maxStreamsPerTenant": "max_streams_per_tenant",
    "maxStreamsPerServer": "max_streams_per_server",
    "keepTimeoutSeconds": "keep_timeout_s",
}
# etcd refuses a request over 1.5 MiB; one replica's copy is one put.
_MAX_KEEP_KIB = 1024


def parse_logs(doc: dict[str, Any]) -> LogsSettings:
    """The `logs:` section of the federation config; defaults for what it leaves out."""
    section = doc.get("logs") or {}
    if not isinstance(section, dict):
        raise InvalidSpec("logs", "must be a mapping")
    values: dict[str, Any] = {}
    for key, value in section.items():
        name = _KEYS.get(str(key))
        if name is None:
            raise InvalidSpec(f"logs.{key}", f"is not a logs setting (known: {', '.join(_KEYS)})")
        at = f"logs.{key}"
        if name in ("retain_hours", "keep_timeout_s"):
            values[name] = number_field(value, at, minimum=0.001)
        else:
            values[name] = int_field(value, at, minimum=0 if name == "keep_kib" else 1)
    settings = LogsSettings(**values)
    if settings.keep_kib > _MAX_KEEP_KIB:
        raise InvalidSpec("logs.keepKiB", f"must be at most {_MAX_KEEP_KIB} (one etcd request per replica)")
    return settings


async def get_logs_settings(kv: KeyValueStore) -> LogsSettings | None:
    found = await kv.get(SETTINGS_KEY)
    return None if found is None else LogsSettings(**unversioned(loads(found.value, found.key)))


async def put_logs_settings(kv: KeyValueStore, settings: LogsSettings) -> None:
    # Unversioned (version 0), as the attempt summaries: the build before schema versions decodes
    # both with `Record(**doc)`, which refuses a key it does not know (federation.store.schema_version).
    await kv.put(SETTINGS_KEY, json.dumps(asdict(settings), sort_keys=True).encode())


def failure_reason(replicas: Sequence[ReplicaState]) -> str:
    """The one reason shown for a gang, from its pods' (OOMKilled, Error (exit 3), Evicted, ...)."""
    reasons = [r for r in replicas if r.reason]
    for wanted in _RANK:
        if any(r.reason == wanted for r in reasons):
            return wanted
    for r in reasons:
        if r.reason == "Error" and r.exit_code is not None:
            return f"Error (exit {r.exit_code})"
    failed = [r for r in replicas if r.exit_code not in (None, 0)]
    if failed:
        return f"Error (exit {failed[0].exit_code})"
    return reasons[0].reason if reasons else ""


def waiting_reason(replicas: Sequence[ReplicaState]) -> str:
    return next((r.reason for r in replicas if r.reason in WAITING_REASONS), "")


def slots(spec: TrainingJobSpec) -> list[tuple[str, int]]:
    """(task, replica) by gang-wide rank, in the spec's order (rank 0 is the first task's first)."""
    return [(t.name, i) for t in spec.tasks for i in range(t.replicas)]


def locate(replica: ReplicaState, spec: TrainingJobSpec, job_id: JobId, attempt: int) -> tuple[str, int]:
    """The spec's task and replica index of a pod, from its rank or its (possibly shortened) task."""
    if replica.by_rank:
        ranks = slots(spec)
        return ranks[replica.index] if 0 <= replica.index < len(ranks) else (replica.task, replica.index)
    gang = object_name(job_id, attempt)
    for t in spec.tasks:
        if replica.task in (t.name, task_name(gang, t.name, t.replicas)):
            return t.name, replica.index
    return replica.task, replica.index


@dataclass(frozen=True, slots=True)
class KeptReplica:
    task: str
    replica: int
    state: ReplicaState
    size_bytes: int
    # How the kept copy falls short of the pod's whole log, for the marker readers are shown; empty
    # when it is whole ("its first lines were not kept: ...", "copied at ... while the pod was
    # being stopped: ...").
    cut: str = ""


def kept_replica(d: dict[str, Any]) -> KeptReplica:
    """A replica of a summary as `keep` wrote it (summaries from before `cut` have none)."""
    return KeptReplica(
        d["task"], int(d["replica"]), ReplicaState(**d["state"]), int(d["size_bytes"]), str(d.get("cut", ""))
    )


@dataclass(frozen=True, slots=True)
class KeptAttempt:
    """What is kept of an ended attempt, for `describe` once its pods or its cluster are gone."""

    attempt: int
    cluster: str
    gpu_type: str
    capacity_kind: str
    usd_per_gpu_hour: float
    started_at_s: float | None
    finished_at_s: float | None
    outcome: str
    reason: str
    kept_at_s: float
    note: str
    replicas: tuple[KeptReplica, ...]


def _key(job_id: str, attempt: int, name: str = "") -> bytes:
    return PREFIX + f"{job_id}/{attempt}/{name}".encode()


def replica_key(job_id: str, attempt: int, task: str, replica: int) -> bytes:
    return _key(job_id, attempt, f"{task}-{replica}")


def _summary_json(kept: KeptAttempt) -> bytes:
    # What `asdict` gives, built shallowly: asdict deep-copies every value on its way, a few percent
    # of a busy leader's CPU with an attempt kept per job (tests/unit/test_job_logs.py compares).
    data = _fields(kept)
    data["replicas"] = [_fields(r) | {"state": _fields(r.state)} for r in kept.replicas]
    return json.dumps(data, separators=(",", ":")).encode()


def _fields(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(value)}


def _summary_from(raw: bytes, key: bytes | None = None) -> KeptAttempt:
    d: dict[str, Any] = unversioned(loads(raw, key))
    replicas = tuple(kept_replica(r) for r in d.pop("replicas"))
    return KeptAttempt(**d, replicas=replicas)


class SecretMask(Protocol):
    """What `federation.secrets.masking.SecretMask` offers (that room sits beside this one)."""

    def __bool__(self) -> bool: ...
    def data(self, raw: bytes) -> bytes: ...
    def text(self, line: str) -> str: ...


def masked_summary(kept: KeptAttempt, mask: SecretMask) -> KeptAttempt:
    """The summary with the job's secret values masked out of what its pods wrote into it (a
    termination message, a reason): kept copies in etcd and SQL never hold a value."""
    if not mask:
        return kept
    return replace(
        kept,
        reason=mask.text(kept.reason),
        note=mask.text(kept.note),
        replicas=tuple(
            replace(
                r,
                state=replace(r.state, reason=mask.text(r.state.reason), message=mask.text(r.state.message)),
            )
            for r in kept.replicas
        ),
    )


class LogArchive:
    """The kept logs and attempt summaries in etcd.

    `mask_for` gives a job's secret mask (`federation.secrets.jobs.JobSecretMasks`, by job id):
    what is kept is masked first, so that etcd, and the history store it is archived to, never
    hold a secret's value that a program printed. None: nothing is masked (tools that only read)."""

    def __init__(
        self,
        kv: KeyValueStore,
        settings: LogsSettings,
        mask_for: Callable[[str], Awaitable[SecretMask]] | None = None,
    ) -> None:
        self._kv = kv
        self.settings = settings
        self._mask_for = mask_for
        self._lease: tuple[int, float] | None = None
        # One grant at a time: attempts kept together (and retrying together after their batch
        # found the lease gone) share the one lease granted, rather than granting one each.
        self._granting = asyncio.Lock()
        self._group = GroupCommit(kv, max_batch=KEEP_BATCH)

    async def _lease_id(self) -> int:
        """A lease shared by the attempts kept within an hour: one grant an hour, not one per attempt.
        Its TTL is the retention plus that hour; readers cut at the retention by the time kept."""
        async with self._granting:
            now = time.monotonic()
            if self._lease is None or now - self._lease[1] > LEASE_REUSE_S:
                ttl_s = max(1, round(self.settings.retain_hours * 3600 + LEASE_REUSE_S))
                self._lease = (await self._kv.grant_lease(ttl_s), now)
            return self._lease[0]

    def _forget_lease(self, lease: int) -> None:
        if self._lease is not None and self._lease[0] == lease:
            self._lease = None

    async def keep(self, job_id: str, kept: KeptAttempt, logs: dict[tuple[str, int], bytes]) -> None:
        """Write one attempt: its logs and the summary that says they are there, in one transaction
        when they fit in one request (the usual case), a gang whose tails do not fit in several,
        the summary last. Attempts kept at the same time share requests (group commit, bounded in
        transactions and bytes): each transaction still commits on its own, and one too large for
        a shared request goes alone, failing, if etcd refuses it, only its own attempt."""
        if self._mask_for is not None:
            mask = await self._mask_for(job_id)
            if mask:
                kept = masked_summary(kept, mask)
                logs = {where: mask.data(data) for where, data in logs.items()}
        lease = await self._lease_id()
        try:
            await self._put_all(job_id, kept, logs, lease)
        except LeaseNotFound:
            self._forget_lease(lease)
            await self._put_all(job_id, kept, logs, await self._lease_id())

    async def _put_all(
        self, job_id: str, kept: KeptAttempt, logs: dict[tuple[str, int], bytes], lease: int
    ) -> None:
        puts = [
            Put(replica_key(job_id, kept.attempt, task, replica), data, lease)
            for (task, replica), data in sorted(logs.items())
        ]
        puts.append(Put(_key(job_id, kept.attempt, SUMMARY), _summary_json(kept), lease))
        *logs_first, last = cut_by_size(
            puts, lambda p: len(p.key) + len(p.value), KEEP_TXN_BYTES, KEEP_TXN_OPS
        )
        await asyncio.gather(*(self._group.run(Txn((), tuple(run))) for run in logs_first))
        await self._group.run(Txn((), tuple(last)))

    def fresh(self, kept: KeptAttempt, now_s: float) -> bool:
        """Whether an attempt's kept logs are still served: within the retention of when they were
        kept (wherever they are now: etcd, or the history store once the job was archived)."""
        return now_s - kept.kept_at_s <= self.settings.retain_hours * 3600

    async def summary(self, job_id: str, attempt: int, now_s: float) -> KeptAttempt | None:
        found = await self._kv.get(_key(job_id, attempt, SUMMARY))
        if found is None:
            return None
        kept = _summary_from(found.value, found.key)
        return kept if self.fresh(kept, now_s) else None

    async def log(self, job_id: str, attempt: int, task: str, replica: int) -> bytes:
        found = await self._kv.get(replica_key(job_id, attempt, task, replica))
        return b"" if found is None else found.value
