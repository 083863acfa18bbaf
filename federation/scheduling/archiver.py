"""The leader's archiver: ended jobs and old audit records move from etcd to the history store.

Why: etcd keeps what the federation is doing now; without this, every job, interval and audit
record stays there forever and etcd outgrows its quota (issue 19). The archiver runs on the leader
only, as a task of its own beside the scheduling loop, and never holds it up: its reads are a few
etcd transactions per batch, its SQL runs on a worker thread (one `HistoryStore` call per batch),
and it sleeps between batches to keep to `archiveRatePerS`.

Per batch of jobs ended more than `retainInEtcd` ago, oldest first:

1. read each job's record, ledger intervals, wait reasons and kept attempt summaries, one
   transaction per job (`federation.store.archive_txn`); then the kept log tails the summaries
   name (`/gpufed/logs/<job id>/<attempt>/<task>-<replica>`), a few transactions of at most
   `TAIL_READ_BYTES` each (gRPC's 4 MiB answer limit), a sub-batch of at most `TAIL_BATCH_BYTES`
   of tails at a time (the leader's memory);
2. write them to SQL (`write_jobs`: one transaction, idempotent by primary key, tails included);
3. only then delete the record, its intervals, its wait key, its idempotency key and its kept-log
   keys (summaries and tails) from etcd, one nested transaction per job, fenced by the leader's
   lease and guarded by the job's mod revision and each kept-log key's.

A crash between 2 and 3 leaves a job in both stores; the next pass writes it again (a no-op: the
first copy stays) and deletes it. A job whose SQL copy differs from etcd's (changed after a crashed
pass wrote it, or a tail SQL does not hold byte for byte) is never deleted, so nothing leaves etcd
that SQL does not hold as etcd held it. So after `retainInEtcd` a job leaves nothing in etcd, and
etcd's size is flat in the number of jobs archived.

One removal must fit etcd's per-transaction op limit (MAX_TXN_OPS): a job with more attempts than
MAX_ARCHIVED_ATTEMPTS stays in etcd, with a warning; a job whose kept-log keys would take its
removal past the limit (a gang of more than about 120 replicas) is archived without its tails,
which stay in etcd under their own lease (`logs.retainHours`), with a warning, and are read there.

Kept tails in SQL are served for `logs.retainHours` from when they were kept, like etcd's copy; the
leader deletes older ones from SQL here, `archive_batch` rows per short transaction at the
archiver's rate (`prune_kept_logs`), after each pass's archiving.

Audit records older than `retainInEtcd` follow the same order: `write_audit`, then a fenced delete.

A succeeded job that declares outputs stays in etcd until each output's record
(`federation.datasets.outputs`) is settled: the outputs controller reads succeeded jobs from the
job cache, so one archived first would never have its outputs registered (its object store was down
past `retainInEtcd`, say). Past OUTPUT_HOLD_S more it goes anyway, each unsettled output recorded as
refused with the reason, so that etcd does not keep it for good and its owner can read why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import structlog

from federation.datasets.outputs import (
    SETTLED_STATES,
    OutputRaced,
    OutputRecord,
    OutputRecords,
    OutputState,
    version_of,
)
from federation.errors import InvalidArgument, NotLeader
from federation.history.config import HistorySettings
from federation.history.model import ArchivedAttempt, ArchivedAudit, ArchivedJob, KeptLog, WaitSnapshot
from federation.history.protocol import HistoryStore
from federation.history.rows import record_from_row, record_json
from federation.joblogs.archive import PREFIX as LOGS_PREFIX
from federation.joblogs.archive import SUMMARY, replica_key
from federation.metrics import Metrics
from federation.security.tokens import AUDIT
from federation.store.archive_txn import (
    MAX_REMOVAL_OPS,
    JobKeys,
    fence_holds,
    idempotency_keys,
    read_jobs,
    remove,
)
from federation.store.job_cache import ENDED_PHASES, JobCache
from federation.store.job_store import Fence, Stored, paused_gc
from federation.store.jobs import JobRecord, job_to_dict
from federation.store.kv import MAX_TXN_OPS, Delete, Get, KeyValue, KeyValueStore, cut_by_size
from federation.store.schema_version import loads, unversioned
from placement.model import JobId, JobPhase

log = structlog.get_logger("gpufed.archiver")


# How long the archiver waits between passes once it has caught up: at most this, and a quarter of
# the retention when that is shorter (at least a second), so a short retention is kept to.
IDLE_S = 30.0
MIN_IDLE_S = 1.0
# A job with more attempts than this has more keys than one transaction may read or delete; it stays
# in etcd (with a warning) rather than being archived in pieces.
MAX_ARCHIVED_ATTEMPTS = (MAX_TXN_OPS - 2) // 2 - 1
# Kept tails per etcd read: well under gRPC's default 4 MiB answer (one tail is at most 1 MiB,
# `logs.keepKiB`'s bound), so a read never fails on size.
TAIL_READ_BYTES = 2 * 1024 * 1024
# Kept tails held at once between the etcd read and the SQL write: a batch of large gangs is moved
# in sub-batches of about this much, not all at once.
TAIL_BATCH_BYTES = 64 * 1024 * 1024
# Batches of expired tails pruned from SQL per pass at most, so a long backlog (a leader that was
# down for days) is worked off over several passes and archiving gets its turn between them.
MAX_PRUNE_BATCHES = 100


def ended_at_s(job: JobRecord) -> float:
    """When an ended job ended: its last event (the one that ended it)."""
    return job.events[-1].at_s if job.events else job.submitted_at_s


def due_jobs(jobs: Sequence[Stored[JobRecord]], *, now_s: float, retain_s: float) -> list[Stored[JobRecord]]:
    """The jobs that ended more than `retain_s` before `now_s`, oldest end first (job id breaks
    ties). Jobs not ended are never due. Pure, so it runs on a worker thread over a copy."""
    cutoff = now_s - retain_s
    due = [s for s in jobs if s.value.phase.is_terminal and ended_at_s(s.value) < cutoff]
    due.sort(key=lambda s: (ended_at_s(s.value), s.value.job_id))
    return due


# How long past `retainInEtcd` a succeeded job waits in etcd for its outputs to be registered.
OUTPUT_HOLD_S = 7 * 24 * 3600.0


def summary_key(job_id: str, attempt: int) -> bytes:
    return LOGS_PREFIX + f"{job_id}/{attempt}/{SUMMARY}".encode()


@dataclass(frozen=True, slots=True)
class _Tail:
    """A kept tail an attempt summary names: where it is in etcd and what the summary says of it."""

    key: bytes
    attempt: int
    task: str
    replica: int
    kept_at_s: float
    size_bytes: int


def named_tails(job_id: str, summaries: dict[int, bytes]) -> list[_Tail]:
    """The tails the attempts' summaries name (`joblogs.archive` writes one key per replica whose
    log it read, and lists the replica with its size). A summary of another shape names none: its
    tails, if any, stay under their lease."""
    out: list[_Tail] = []
    for attempt, raw in sorted(summaries.items()):
        try:
            d = json.loads(raw)
            kept_at = float(d["kept_at_s"])
            replicas = [(str(r["task"]), int(r["replica"]), int(r["size_bytes"])) for r in d["replicas"]]
        except (KeyError, TypeError, ValueError):
            continue
        for task, replica, size in replicas:
            key = replica_key(job_id, attempt, task, replica)
            out.append(_Tail(key, attempt, task, replica, kept_at, size))
    return out


def tail_reads(tails: Sequence[_Tail]) -> list[list[_Tail]]:
    """The tails cut into etcd reads: at most MAX_TXN_OPS keys and about TAIL_READ_BYTES each."""
    return cut_by_size(tails, lambda t: t.size_bytes, TAIL_READ_BYTES, MAX_TXN_OPS)


@dataclass(frozen=True, slots=True)
class PassReport:
    jobs_due: int
    jobs_archived: int
    audit_archived: int
    # Jobs left in etcd this pass: open interval, changed since read, SQL copy differs, too large.
    jobs_left: int
    took_s: float
    # Kept tails moved to SQL with their jobs, and expired ones deleted from SQL.
    tails_archived: int = 0
    tails_pruned: int = 0


class Archiver:
    def __init__(
        self,
        *,
        kv: KeyValueStore,
        cache: JobCache,
        history: HistoryStore,
        settings: HistorySettings,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        idle_s: float | None = None,
        logs_retain_s: float | None = None,
    ) -> None:
        self._kv = kv
        self._cache = cache
        self._history = history
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        # `logs.retainHours`: tails kept longer ago are pruned from SQL. None: no prune (tests of
        # the move alone).
        self._logs_retain_s = logs_retain_s
        self._idle_s = (
            idle_s if idle_s is not None else min(IDLE_S, max(settings.retain_in_etcd_s / 4, MIN_IDLE_S))
        )

    async def run(self, fence: Fence, lost: asyncio.Event) -> None:
        """Pass after pass until leadership is lost."""
        while not lost.is_set():
            try:
                await self.archive_once(fence, lost)
            except NotLeader:
                log.warning("archiver_stopped", reason="leader fence no longer holds")
                return
            except Exception:
                # etcd or the database hiccuped: nothing was deleted that SQL does not hold, and the
                # next pass repeats whatever was half done. The archiver must never take the leader
                # down with it.
                log.exception("archive_pass_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), self._idle_s)

    async def archive_once(self, fence: Fence, lost: asyncio.Event | None = None) -> PassReport:
        """One pass: every due job and audit record, in batches at the bounded rate."""
        started = time.monotonic()
        now = self._clock()
        retain = self._settings.retain_in_etcd_s
        # The first pass after a restart reads every ended job's record, which the cache listed
        # undecoded (`Stored.decoded_on_read`): decoded with the collector held off, as the list
        # decodes, else it walks the growing heap again and again (2.5 s of CPU at 100,000 jobs).
        # Only the ended jobs, from the cache's phase index: a copy of every job (a million queued
        # ones at depth) at every pass was a scan of all jobs for the few that ended.
        ended = list(self._cache.ordered(phases=ENDED_PHASES))
        with paused_gc():
            due = await asyncio.to_thread(due_jobs, ended, now_s=now, retain_s=retain)
        due = await self._outputs_settled(due, now - retain - OUTPUT_HOLD_S)
        if self._metrics is not None:
            self._metrics.archive_backlog.set(len(due))
        archived = left = tails_moved = 0
        if due:
            idem = await idempotency_keys(self._kv, [s.value for s in due])
            size = self._settings.archive_batch
            for start in range(0, len(due), size):
                if lost is not None and lost.is_set():
                    break
                began = time.monotonic()
                batch = due[start : start + size]
                moved, tails = await self._archive_jobs(batch, idem, fence)
                archived += moved
                tails_moved += tails
                left += len(batch) - moved
                if self._metrics is not None:
                    self._metrics.archive_backlog.set(len(due) - start - len(batch))
                await self._keep_rate(len(batch), began)
        audit = await self._archive_audit(fence, now - retain, lost)
        pruned = await self._prune_tails(now, lost)
        took = time.monotonic() - started
        if self._metrics is not None:
            self._metrics.archive_pass_seconds.set(took)
        report = PassReport(len(due), archived, audit, left, took, tails_moved, pruned)
        if archived or audit or left or pruned:
            log.info(
                "archive_pass_done",
                jobs_due=len(due),
                jobs_archived=archived,
                jobs_left=left,
                audit_archived=audit,
                tails_archived=tails_moved,
                tails_pruned=pruned,
                took_s=round(took, 3),
            )
        return report

    async def _prune_tails(self, now_s: float, lost: asyncio.Event | None) -> int:
        """Delete the tails kept more than `logs.retainHours` ago from SQL, a batch per short
        transaction at the archiver's rate, at most MAX_PRUNE_BATCHES a pass."""
        if self._logs_retain_s is None:
            return 0
        before = now_s - self._logs_retain_s
        size = self._settings.archive_batch
        total = 0
        for _ in range(MAX_PRUNE_BATCHES):
            if lost is not None and lost.is_set():
                break
            began = time.monotonic()
            gone = await asyncio.to_thread(self._history.prune_kept_logs, kept_before_s=before, limit=size)
            total += gone
            if self._metrics is not None and gone:
                self._metrics.archived.labels(kind="tails_pruned").inc(gone)
            if gone < size:
                break
            await self._keep_rate(gone, began)
        return total

    async def _keep_rate(self, count: int, began: float) -> None:
        wait = count / self._settings.archive_rate_per_s - (time.monotonic() - began)
        # Even a batch that already took its share yields, so the loop's other tasks run between batches.
        await asyncio.sleep(max(wait, 0.0))

    async def _outputs_settled(
        self, due: list[Stored[JobRecord]], give_up_before_s: float
    ) -> list[Stored[JobRecord]]:
        """`due` without the succeeded jobs whose outputs are not all settled yet; those that ended
        before `give_up_before_s` go anyway, each unsettled output recorded as refused."""
        records = OutputRecords(self._kv)
        kept: list[Stored[JobRecord]] = []
        held = 0
        for stored in due:
            job = stored.value
            if job.phase is not JobPhase.SUCCEEDED or not job.spec.outputs:
                kept.append(stored)
                continue
            unsettled = []
            for index, output in enumerate(job.spec.outputs):
                record, read_at = await records.read(job.job_id, index)
                if record is None or record.state not in SETTLED_STATES:
                    unsettled.append((index, output, record, read_at))
            if not unsettled:
                kept.append(stored)
            elif ended_at_s(job) < give_up_before_s:
                abandoned = 0
                try:
                    for index, output, record, read_at in unsettled:
                        dataset = record.dataset if record is not None else output.dataset
                        reason = "not registered before the job was archived; submit the job again to make it"
                        refused = OutputRecord(
                            OutputState.REFUSED, dataset, version_of(output, job.job_id), reason=reason
                        )
                        # Over what was read only: a registrar that registered it meanwhile wins.
                        abandoned += await records.settle(job.job_id, index, refused, read_at) is refused
                except OutputRaced:
                    held += 1
                    continue
                if abandoned:
                    log.warning("outputs_abandoned", job_id=job.job_id, outputs=abandoned)
                kept.append(stored)
            else:
                held += 1
        if held:
            log.info("jobs_held_for_outputs", jobs=held)
        return kept

    async def _archive_jobs(
        self, batch: Sequence[Stored[JobRecord]], idem: dict[JobId, KeyValue], fence: Fence
    ) -> tuple[int, int]:
        """The batch moved to SQL and out of etcd: how many jobs and tails."""
        wanted: list[Stored[JobRecord]] = []
        for s in batch:
            if s.value.attempt > MAX_ARCHIVED_ATTEMPTS:
                log.warning("job_not_archived", job_id=s.value.job_id, reason="too many attempts")
            else:
                wanted.append(s)
        reads = await read_jobs(
            self._kv,
            [(s.value.job_id, s.value.attempt) for s in wanted],
            [[summary_key(s.value.job_id, a) for a in range(1, s.value.attempt + 1)] for s in wanted],
            # The cache's records, decoded for `due_jobs`: not decoded again where etcd holds them
            # at the same mod revision (the same bytes).
            known=wanted,
        )
        ready: list[tuple[JobKeys, list[_Tail]]] = []
        for read in reads:
            if read is None:
                continue  # already gone: an earlier pass deleted it and the cache had not caught up
            job = read.job.value
            if not job.phase.is_terminal:
                continue
            if any(iv.end_s is None for iv in read.intervals):
                log.warning("job_not_archived", job_id=job.job_id, tenant=job.tenant, reason="open interval")
                continue
            found = idem.get(job.job_id)
            keys = read if found is None else replace(read, idem=found)
            summaries = [kv for kv in read.extra.values() if kv is not None]
            tails = named_tails(job.job_id, {_attempt_of(kv.key): kv.value for kv in summaries})
            keys = replace(keys, logs=tuple(summaries))
            if keys.removal_ops() > MAX_REMOVAL_OPS:
                # MAX_ARCHIVED_ATTEMPTS keeps this from happening; said rather than sent to etcd.
                log.warning("job_not_archived", job_id=job.job_id, tenant=job.tenant, reason="too many keys")
                continue
            if keys.removal_ops() + len(tails) > MAX_REMOVAL_OPS:
                # Too many keys for one removal: the job goes, its tails stay under their lease.
                log.warning(
                    "kept_logs_left_in_etcd",
                    job_id=job.job_id,
                    tenant=job.tenant,
                    tails=len(tails),
                    reason=f"more keys than one etcd transaction takes ({MAX_TXN_OPS})",
                )
                tails = []
            ready.append((keys, tails))
        jobs_moved = tails_moved = 0
        for group in cut_by_size(ready, lambda item: sum(t.size_bytes for t in item[1]), TAIL_BATCH_BYTES):
            jobs, tails_count = await self._move(group, fence)
            jobs_moved += jobs
            tails_moved += tails_count
        return jobs_moved, tails_moved

    async def _move(self, group: Sequence[tuple[JobKeys, list[_Tail]]], fence: Fence) -> tuple[int, int]:
        """Read the group's tails, write the jobs with them to SQL, then remove them from etcd; how
        many jobs and tails left etcd."""
        found: dict[bytes, KeyValue] = {}
        for part in tail_reads([t for _, tails in group for t in tails]):
            result = await self._kv.txn([], [Get(t.key) for t in part])
            found.update({kv.key: kv for kv in result.gets if kv is not None})
        jobs: list[ArchivedJob] = []
        keys: list[JobKeys] = []
        for read, tails in group:
            job = read.job.value
            here = [t for t in tails if t.key in found]
            logs = tuple(
                KeptLog(job.job_id, t.attempt, t.task, t.replica, t.kept_at_s, found[t.key].value)
                for t in here
            )
            try:
                jobs.append(_archived(read, logs))
            except InvalidArgument as error:
                # A record the history refuses stays in etcd, said once per pass, rather than
                # holding up every batch behind it.
                log.error("job_not_archived", job_id=job.job_id, tenant=job.tenant, reason=str(error))
                continue
            keys.append(replace(read, logs=read.logs + tuple(found[t.key] for t in here)))
        if not jobs:
            return 0, 0
        new = await asyncio.to_thread(self._write_jobs, jobs)
        differ: set[JobId] = set()
        if new < len(jobs):
            # Some were there already (a pass that crashed before its delete): delete them only if
            # SQL holds them as etcd does now.
            differ = await asyncio.to_thread(self._differing, jobs)
            for job_id in differ:
                log.error("job_not_archived", job_id=job_id, reason="history holds an older copy")
        # Only what SQL now holds as etcd does may leave etcd.
        written = {j.record.job_id for j in jobs} - differ
        removals = [k for k in keys if k.job.value.job_id in written]
        done = await remove(self._kv, [k.removal(fence) for k in removals])
        if not all(done) and not await fence_holds(self._kv, fence):
            raise NotLeader("the leader key is no longer ours; archived jobs left in etcd")
        moved = sum(done)
        by_id = {j.record.job_id: j for j in jobs}
        moved_tails = sum(
            len(by_id[k.job.value.job_id].logs) for k, ok in zip(removals, done, strict=True) if ok
        )
        if self._metrics is not None:
            self._metrics.archived.labels(kind="jobs").inc(moved)
            self._metrics.archived.labels(kind="tails").inc(moved_tails)
        return moved, moved_tails

    def _write_jobs(self, jobs: list[ArchivedJob]) -> int:
        """One transaction for the batch; if the database refuses it as a whole, job by job, so that
        one bad record never stops the jobs behind it (the refused ones are dropped from `jobs` and
        stay in etcd)."""
        try:
            return self._history.write_jobs(jobs)
        except InvalidArgument:
            pass
        new = 0
        kept: list[ArchivedJob] = []
        for job in jobs:
            try:
                new += self._history.write_jobs([job])
            except InvalidArgument as error:
                log.error("job_not_archived", job_id=job.record.job_id, reason=str(error))
            else:
                kept.append(job)
        jobs[:] = kept
        return new

    def _differing(self, jobs: Sequence[ArchivedJob]) -> set[JobId]:
        """The jobs SQL does not hold as etcd does now: record or any tail about to leave etcd.
        One read for the batch (`held_copies`): a `get_job` and a `kept_logs` per job and attempt
        were a quarter of a busy leader's CPU once a pass found jobs already written."""
        held = self._history.held_copies([j.record.job_id for j in jobs])
        out: set[JobId] = set()
        for job in jobs:
            copy = held.get(job.record.job_id)
            if copy is None or not _same_record(copy.record_json, job.record):
                out.add(job.record.job_id)
                continue
            # Each tail about to leave etcd must be in SQL byte for byte (a crashed pass wrote them).
            if any(copy.logs.get((t.attempt, t.task, t.replica)) != t.data for t in job.logs):
                out.add(job.record.job_id)
        return out

    async def _archive_audit(self, fence: Fence, cutoff_s: float, lost: asyncio.Event | None) -> int:
        """Audit records older than the cutoff, oldest first; their keys sort by time."""
        cutoff_ns = int(cutoff_s * 1e9)
        total = 0
        while lost is None or not lost.is_set():
            began = time.monotonic()
            page = await self._kv.range_prefix(AUDIT, limit=self._settings.archive_batch)
            due = [kv for kv in page.kvs if _audit_ns(kv.key) < cutoff_ns]
            if not due:
                break
            records = [_audit(kv.key, kv.value) for kv in due]
            await asyncio.to_thread(self._history.write_audit, records)
            # Audit records are written once and never changed, so the fence is the only compare.
            result = await self._kv.txn([fence.compare()], [Delete(kv.key) for kv in due])
            if not result.succeeded:
                raise NotLeader("the leader key is no longer ours; archived audit records left in etcd")
            total += len(due)
            if self._metrics is not None:
                self._metrics.archived.labels(kind="audit").inc(len(due))
            await self._keep_rate(len(due), began)
            if len(due) < len(page.kvs) or not page.more:
                break
        return total


def _same_record(stored_json: str, record: JobRecord) -> bool:
    """Whether the history's copy is this record: the text this build writes, or (written by
    another build, or before a field was added) the same record once read."""
    if stored_json == record_json(record):
        return True
    return job_to_dict(record_from_row(stored_json)) == job_to_dict(record)


def _attempt_of(key: bytes) -> int:
    """The attempt of a kept-log key `/gpufed/logs/<job id>/<attempt>/<name>`."""
    return int(key.rsplit(b"/", 2)[1])


def _archived(read: JobKeys, logs: tuple[KeptLog, ...] = ()) -> ArchivedJob:
    job = read.job.value
    attempts = tuple(
        ArchivedAttempt(a, unversioned(loads(kv.value, kv.key)))
        for a in range(1, job.attempt + 1)
        if (kv := read.extra.get(summary_key(job.job_id, a))) is not None
    )
    waits: tuple[WaitSnapshot, ...] = ()
    if read.waits:
        at = next((r.at_s for r in read.waits if r.at_s is not None), ended_at_s(job))
        waits = (WaitSnapshot(at, read.waits),)
    return ArchivedJob(
        record=job,
        ended_at_s=ended_at_s(job),
        attempts=attempts,
        intervals=read.intervals,
        waits=waits,
        logs=logs,
    )


def _audit_ns(key: bytes) -> int:
    stamp = key[len(AUDIT) :].split(b"-", 1)[0]
    return int(stamp) if stamp.isdigit() else 0


def _audit(key: bytes, value: bytes) -> ArchivedAudit:
    d = loads(value, key)
    return ArchivedAudit(
        audit_id=key[len(AUDIT) :].decode(),
        at_s=float(d["at_s"]),
        user=str(d.get("user", "")),
        role=str(d.get("role", "")),
        action=str(d.get("action", "")),
        target=str(d.get("target", "")),
        detail=str(d.get("detail", "")),
    )
