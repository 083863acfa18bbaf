"""The job set calls of `JobService` (issue 34): submit, get, list, watch, cancel and resubmit a set.

The servicer authenticates and maps errors (`CallHandlers.unary`); this module checks and stores.
Every member's manifest passes the very checks a single submission does (`JobService.checked`),
before anything is stored; the set record then holds them all, and the first members within the
limit are released at once (`SetController.step`), the rest by the controller as others end.

Isolation is the jobs' rule: a set is its tenant's, read by its members, admins and infra
(`can_read_tenant`), changed by its members and admins (`check_write_job`); any other caller is
told it does not exist, in the same words as a set that does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from clusters.api import ClusterUnreachable, GangInspector, LogOptions, LogUnavailable
from federation.api import convert, history_reads
from federation.api.job_queries import ListFilter
from federation.api.v1 import gpufed_pb2 as pb
from federation.errors import FailedPrecondition, InvalidArgument, InvalidSpec, NotFound, RateLimited
from federation.history.protocol import HistoryStore
from federation.joblogs.archive import LogArchive, LogsSettings, locate
from federation.joblogs.stream import split_line
from federation.jobsets.arrays import parse_array
from federation.jobsets.controller import SetController
from federation.jobsets.decide import rerun
from federation.jobsets.early_stopping import Goal
from federation.jobsets.records import (
    JobSetRecord,
    MemberState,
    SetMember,
    SetTemplate,
    member_job_id,
    member_job_name,
    set_digest,
)
from federation.jobsets.status import MemberView, set_status
from federation.jobsets.stopping import EarlyStopper, LiveLines
from federation.jobsets.store import JobSetStore, trial_key, trial_number
from federation.jobsets.sweeps import (
    MetricSource,
    SweepSpec,
    Trial,
    expand,
    file_metric,
    params_json,
    parse_metric,
    parse_sweep,
    ranked,
    value_text,
)
from federation.ledger.cache import LedgerCache
from federation.ledger.job_cost import job_micro_usd
from federation.scheduling.members import MemberClusters
from federation.security.auth import (
    Principal,
    acting_tenant,
    can_read_tenant,
    check_write_job,
    listable_tenant,
)
from federation.spec.jobspec import TrainingJobSpec
from federation.spec.pod_template import refuse_metric_file_fields
from federation.spec.validate import free_text, name_field, shown
from federation.store.intervals import LedgerInterval
from federation.store.job_cache import JobCache
from federation.store.job_store import JobStore, Stored
from federation.store.jobs import JobRecord
from federation.store.money import format_usd
from federation.store.records import SchedulingSettings, TenantRecord
from placement.model import JobId, JobPhase, TenantId

# The most named jobs one set may hold (an array may have up to `MAX_ARRAY_COPIES`).
MAX_SET_JOBS = 500
MAX_PARALLEL = 100_000
MAX_SWEEP_TEXT = 256 * 1024


@dataclass(frozen=True, slots=True)
class Checked:
    """One manifest after a single submission's checks: for whom, at what priority, its digest."""

    spec: TrainingJobSpec
    tenant: TenantId
    record: TenantRecord
    priority: int
    digest: str


Check = Callable[[Principal, str, SchedulingSettings], Awaitable[Checked]]


@dataclass(frozen=True, slots=True)
class SetListFilter(ListFilter):
    """ListJobs' filters and one more: only the jobs of one set (`gpufed list --set NAME`)."""

    job_set: str = ""

    @classmethod
    def of_set(cls, base: ListFilter, job_set: str) -> SetListFilter:
        return cls(name_prefix=base.name_prefix, user=base.user, cluster=base.cluster, job_set=job_set)

    def wants(self, job: JobRecord) -> bool:
        return job.job_set == self.job_set and ListFilter.wants(self, job)


def _sweep(req: pb.SubmitJobSetRequest) -> SweepSpec | None:
    if not req.sweep:
        return None
    if len(req.sweep) > MAX_SWEEP_TEXT:
        raise InvalidArgument(f"sweep: at most {MAX_SWEEP_TEXT} characters, got {len(req.sweep)}")
    try:
        raw = json.loads(req.sweep)
    except ValueError as error:
        raise InvalidArgument(f"sweep: not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise InvalidArgument("sweep: must be an object (parameters, search, trials, seed, metric)")
    return parse_sweep(raw)


def set_not_found(name: str) -> str:
    """The one answer for a set that does not exist and one the caller may not read."""
    return f"job set {shown(name)} not found"


class JobSetCalls:
    def __init__(
        self,
        *,
        sets: JobSetStore,
        store: JobStore,
        cache: JobCache,
        ledger: LedgerCache | None,
        history: HistoryStore | None,
        clock: Callable[[], float],
        queue_room: Callable[[TenantId], Awaitable[int | None]] | None = None,
    ) -> None:
        self.sets = sets
        self.store = store
        self.cache = cache
        self._store = store
        self._cache = cache
        self._ledger = ledger
        self._history = history
        self._clock = clock
        self._queue_room = queue_room
        self.controller = SetController(
            sets=sets, store=store, cache=cache, clock=clock, queue_room=queue_room
        )

    # ---- submit

    async def submit(
        self,
        who: Principal,
        req: pb.SubmitJobSetRequest,
        *,
        settings: SchedulingSettings,
        check: Check,
        admit: Callable[[TenantId, TenantRecord], None],
        check_dataset: Callable[[TenantId, TrainingJobSpec], Awaitable[None]],
    ) -> pb.SubmitJobSetResponse:
        name = name_field(req.name, "name")
        if not req.manifests:
            raise InvalidArgument("manifests: a job set needs at least one TrainingJob manifest")
        sweep = _sweep(req)
        array = parse_array(req.array) if req.array else None
        if sweep is not None and (array is not None or len(req.manifests) != 1):
            raise InvalidArgument("sweep: give exactly one manifest (the trials' template) and no array")
        if array is not None and len(req.manifests) != 1:
            raise InvalidArgument(
                f"manifests: an array runs one manifest once per index; got {len(req.manifests)}"
            )
        if array is None and len(req.manifests) > MAX_SET_JOBS:
            raise InvalidArgument(
                f"manifests: at most {MAX_SET_JOBS} jobs in one set, got {len(req.manifests)}"
            )
        if not 0 <= req.max_parallel <= MAX_PARALLEL:
            raise InvalidArgument(f"max_parallel: must be between 0 (no limit) and {MAX_PARALLEL}")
        max_parallel = req.max_parallel
        if array is not None and array.max_parallel:
            if max_parallel and max_parallel != array.max_parallel:
                raise InvalidArgument(
                    f"max_parallel: {max_parallel} disagrees with the array's %{array.max_parallel}; give one"
                )
            max_parallel = array.max_parallel
        checked: list[Checked] = []
        for i, text in enumerate(req.manifests):
            try:
                checked.append(await check(who, text, settings))
            except InvalidSpec as error:
                # Which manifest of the set, then the field as a single submission names it.
                raise InvalidSpec(f"manifests[{i}].{error.field}", error.rule) from None
        tenants = {c.tenant for c in checked}
        if len(tenants) != 1:
            raise InvalidArgument(
                f"manifests: every job of a set is for one tenant, these name {', '.join(sorted(tenants))}"
            )
        tenant = checked[0].tenant
        if sweep is not None and sweep.metric_source is MetricSource.FILE:
            for t, task in enumerate(checked[0].spec.tasks):
                refuse_metric_file_fields(task.template, f"manifests[0].spec.tasks[{t}].template")
        # The set itself is the tenant's write: the same rule as a job's submission.
        acting_tenant(who, tenant, action="submit job sets", field="spec.tenant")
        templates: list[SetTemplate] = []
        template_of: dict[str, int] = {}
        pairs: list[tuple[str, int, int | None]] = []  # key, template, array index
        for c in checked:
            if c.digest not in template_of:
                template_of[c.digest] = len(templates)
                templates.append(SetTemplate(spec=c.spec, priority=c.priority, digest=c.digest))
            if array is None:
                pairs.append((c.spec.name, template_of[c.digest], None))
        if array is None:
            names = Counter(key for key, _, _ in pairs)
            twice = sorted(n for n, count in names.items() if count > 1)
            if twice:
                raise InvalidArgument(
                    f"manifests: job names must differ within a set (they name its members); "
                    f"{', '.join(twice)} appear more than once"
                )
        else:
            pairs = [(str(index), 0, index) for index in array.indices]
        trials = [] if sweep is None else expand(sweep)
        params = {trial_key(n): params_json(values) for n, values in enumerate(trials)}
        if sweep is not None:
            pairs = [(key, 0, None) for key in params]
        array_text = "" if array is None else array.text()
        digest_pairs = [(key, templates[t].digest + params.get(key, "")) for key, t, _ in pairs]
        digest = set_digest(digest_pairs, max_parallel, array_text)
        if sweep is not None:
            digest = hashlib.sha256(
                f"{digest}\n{json.dumps(sweep.to_dict(), sort_keys=True)}".encode()
            ).hexdigest()
        try:
            admit(tenant, checked[0].record)
        except RateLimited:
            earlier = await self.sets.get(tenant, name)
            if earlier is None or earlier.value.digest != digest:
                raise
            return pb.SubmitJobSetResponse(created=False, job_set=await self.shown(earlier))
        for template in templates:
            if template.spec.dataset is not None:
                await check_dataset(tenant, template.spec)
        members = tuple(
            SetMember(
                key=key,
                template=t,
                array_index=index,
                job_id=member_job_id(tenant, name, key, member_job_name(templates[t].spec, index), 0),
                state=MemberState.HELD,
                params=params.get(key, ""),
            )
            for key, t, index in pairs
        )
        record = JobSetRecord(
            tenant=tenant,
            name=name,
            user=who.user,
            created_at_s=self._clock(),
            digest=digest,
            max_parallel=max_parallel,
            array=array_text,
            templates=tuple(templates),
            members=members,
            sweep=None if sweep is None else sweep.to_dict(),
        )
        stored, created = await self.sets.create(record)
        if created:
            # The first members within the limit, now; the controller releases the rest.
            held = stored.mod_revision
            stored = await self.controller.step(stored)
            if stored.mod_revision != held:
                # Released members' jobs are at this revision. With none released (a full queue)
                # no job changed at it, and the wait could only time out.
                await self._cache.wait_for_revision(stored.mod_revision, timeout_s=5.0)
        return pb.SubmitJobSetResponse(created=created, job_set=await self.shown(stored))

    # ---- reads

    async def visible(self, who: Principal, name: str, tenant: str) -> Stored[JobSetRecord]:
        if not name:
            raise InvalidArgument("name: required")
        if len(name) > 63:
            raise NotFound(set_not_found(name))
        # Another tenant's name, or one the caller may not read, is answered as a missing set.
        owner = TenantId(tenant) if tenant else who.tenant
        stored = None if not can_read_tenant(who, owner) else await self.sets.get(owner, name)
        if stored is None:
            raise NotFound(set_not_found(name))
        return stored

    async def get(self, who: Principal, req: pb.GetJobSetRequest) -> pb.JobSet:
        return await self.shown(await self.visible(who, req.name, req.tenant))

    async def list_sets(self, who: Principal, req: pb.ListJobSetsRequest) -> pb.ListJobSetsResponse:
        tenant = listable_tenant(who, req.tenant, "job sets")
        found = await self.sets.list_sets(tenant)
        return pb.ListJobSetsResponse(job_sets=[await self.shown(s, with_members=False) for s in found])

    async def watch(self, who: Principal, req: pb.GetJobSetRequest) -> AsyncIterator[pb.JobSet]:
        """The status now, then after each change of one of its jobs (or of the set), until done."""
        stored = await self.visible(who, req.name, req.tenant)
        queue = self._cache.subscribe()
        try:
            last: pb.JobSet | None = None
            while True:
                shown_now = await self.shown(stored)
                if shown_now != last:
                    yield shown_now
                    last = shown_now
                if shown_now.done:
                    return
                try:
                    while True:
                        event = await asyncio.wait_for(queue.get(), timeout=2.0)
                        if event is None:
                            queue = self._cache.subscribe()
                            break
                        if event.job is not None and event.job.job_set == stored.value.name:
                            break
                except TimeoutError:
                    pass  # the set record may have changed (held members released): look again
                fresh = await self.sets.get(stored.value.tenant, stored.value.name)
                stored = stored if fresh is None else fresh
        finally:
            self._cache.unsubscribe(queue)

    async def sweep_results(self, who: Principal, req: pb.GetJobSetRequest) -> pb.SweepResults:
        """A sweep's trials ranked by its metric, read from each trial's kept logs."""
        stored = await self.visible(who, req.name, req.tenant)
        record = stored.value
        if record.sweep is None:
            raise FailedPrecondition(f"job set {record.name} is not a sweep: it has no metric to rank")
        metric = str(record.sweep["metric"]["name"])
        goal = Goal(record.sweep["metric"]["goal"])
        from_file = record.sweep["metric"].get("source") == MetricSource.FILE
        views = await self._views(record)
        status = set_status(record, views, now_s=self._clock())
        trials: list[Trial] = []
        shown: dict[str, pb.SweepTrial] = {}
        for s in status.members:
            m, job = s.view.member, s.view.job
            values = json.loads(m.params or "{}")
            value = None
            if job is not None and m.state is MemberState.RELEASED and job.phase.is_terminal:
                value = await (self._file_metric(job, metric) if from_file else self._metric(job, metric))
            number = trial_number(m.key)
            trials.append(Trial(m.key, number, values, value))
            out = pb.SweepTrial(
                key=m.key,
                number=number,
                job_id=m.job_id,
                parameters=[pb.SweepParameter(name=k, value=value_text(v)) for k, v in values.items()],
                held=m.state is MemberState.HELD,
                # A trial stopped early says why (the median rule's words are its cancel message).
                reason=job.message
                if job is not None and job.phase is JobPhase.CANCELLED and job.message
                else s.reason,
            )
            if m.state is MemberState.CANCELLED:
                out.phase = pb.JOB_PHASE_CANCELLED
            elif job is not None and m.state is MemberState.RELEASED:
                out.phase = convert.phase_to_pb(job.phase)
            micro = job_micro_usd(list(s.view.intervals), now_s=self._clock())
            out.cost_usd = "" if micro is None else format_usd(micro)
            if value is not None:
                out.metric = value
            shown[m.key] = out
        results: list[pb.SweepTrial] = []
        for rank, trial in enumerate(ranked(trials, goal), start=1):
            out = shown[trial.key]
            out.rank = rank if trial.metric is not None else 0
            results.append(out)
        return pb.SweepResults(
            job_set=await self.shown(stored, with_members=False),
            metric=metric,
            goal=goal.value,
            search=str(record.sweep["search"]),
            seed=int(record.sweep.get("seed", 0)),
            trials=results,
        )

    async def _metric(self, job: JobRecord, name: str) -> float | None:
        """The metric from the kept log tails of the job's last attempt: the first replica (in task
        order) that printed it; None when none did or the tails are no longer kept."""
        archive = LogArchive(self.sets.kv, LogsSettings())
        for task in job.spec.tasks:
            for replica in range(task.replicas):
                data = await archive.log(job.job_id, job.attempt, task.name, replica)
                if not data:
                    continue
                lines = (split_line(line)[1] for line in data.decode("utf-8", "replace").splitlines())
                value = parse_metric(lines, name)
                if value is not None:
                    return value
        return None

    async def _file_metric(self, job: JobRecord, name: str) -> float | None:
        """The metric from the termination messages of the job's last attempt, as its kept summary
        holds them (the pods' `state.terminated.message`, read by the kubelet from the metric file):
        the first replica (in task order) whose message gives it; None when none does or the
        summary is no longer kept."""
        kept = await LogArchive(self.sets.kv, LogsSettings()).summary(job.job_id, job.attempt, self._clock())
        if kept is None:
            return None
        slots = [(t.name, r) for t in job.spec.tasks for r in range(t.replicas)]
        order = {slot: i for i, slot in enumerate(slots)}
        for replica in sorted(kept.replicas, key=lambda r: order.get((r.task, r.replica), len(order))):
            value = file_metric(replica.state.message, name)
            if value is not None:
                return value
        return None

    # ---- changes

    async def cancel(self, who: Principal, req: pb.CancelJobSetRequest) -> pb.JobSet:
        reason = free_text(req.reason[:256], "reason") or f"cancelled by {who.user} with its job set"
        for _ in range(5):
            stored = await self.visible(who, req.name, req.tenant)
            record = stored.value
            check_write_job(who, record.tenant, record.name)
            members = tuple(
                replace(m, state=MemberState.CANCELLED) if m.state is MemberState.HELD else m
                for m in record.members
            )
            cancelled = record.with_members(members, cancel_requested=True, cancel_reason=reason)
            if record.cancel_requested:
                cancelled = record
            elif (revision := await self.sets.update(stored, cancelled)) is None:
                continue
            else:
                stored = Stored(cancelled, revision)
            # Asked here, and again by every controller's pass until each job was asked.
            await self.controller.cancel_jobs(cancelled, reason, who.user)
            return await self.shown(stored)
        raise FailedPrecondition(f"job set {req.name} is changing too fast to cancel; try again")

    async def resubmit(self, who: Principal, req: pb.ResubmitJobSetRequest) -> pb.JobSet:
        for _ in range(5):
            stored = await self.visible(who, req.name, req.tenant)
            record = stored.value
            check_write_job(who, record.tenant, record.name)
            if record.cancel_requested:
                raise FailedPrecondition(
                    f"job set {record.name} was cancelled; submit a new set to run its jobs again"
                )
            failed = await self._failed(record)
            if not failed:
                raise FailedPrecondition(f"job set {record.name} has no failed job to resubmit")
            members = tuple(rerun(record, m) if m.job_id in failed else m for m in record.members)
            again = record.with_members(members, resubmitted_at_s=self._clock())
            revision = await self.sets.update(stored, again)
            if revision is None:
                continue
            stepped = await self.controller.step(Stored(again, revision))
            return await self.shown(stepped)
        raise FailedPrecondition(f"job set {req.name} is changing too fast to resubmit; try again")

    async def _failed(self, record: JobSetRecord) -> set[JobId]:
        views = await self._views(record)
        return {
            v.member.job_id
            for v in views
            if v.member.state is MemberState.RELEASED and v.job is not None and v.job.phase is JobPhase.FAILED
        }

    # ---- status

    async def _job(self, job_id: JobId) -> tuple[JobRecord | None, tuple[LedgerInterval, ...]]:
        """A job of the set, live or archived, with its ledger intervals."""
        cached = self._cache.get(job_id)
        stored = cached if cached is not None else await self._store.get_job(job_id)
        if stored is not None:
            intervals = () if self._ledger is None else tuple(self._ledger.for_job(job_id))
            return stored.value, intervals
        if self._history is None:
            return None, ()
        found = await asyncio.to_thread(history_reads.get_job, self._history, job_id)
        return (None, ()) if found is None else (found.record, found.intervals)

    async def _views(self, record: JobSetRecord) -> list[MemberView]:
        views: list[MemberView] = []
        for member in record.members:
            intervals: list[LedgerInterval] = []
            for earlier in member.earlier:
                intervals.extend((await self._job(earlier))[1])
            job: JobRecord | None = None
            if member.state is MemberState.RELEASED:
                job, own = await self._job(member.job_id)
                intervals.extend(own)
            views.append(MemberView(member, job, tuple(intervals)))
        return views

    async def shown(self, stored: Stored[JobSetRecord], *, with_members: bool = True) -> pb.JobSet:
        record = stored.value
        room = None
        if self._queue_room is not None and any(m.state is MemberState.HELD for m in record.members):
            room = await self._queue_room(record.tenant)
        status = set_status(record, await self._views(record), now_s=self._clock(), queue_room=room)
        members: list[pb.JobSetMember] = []
        for s in status.members if with_members else ():
            m, job = s.view.member, s.view.job
            shown = pb.JobSetMember(
                key=m.key,
                job_id=m.job_id,
                earlier_job_ids=list(m.earlier),
                held=m.state is MemberState.HELD,
                reason=s.reason,
            )
            if m.array_index is not None:
                shown.array_index = m.array_index
            if m.state is MemberState.CANCELLED:
                shown.phase = pb.JOB_PHASE_CANCELLED
            elif job is not None and m.state is MemberState.RELEASED:
                shown.phase = convert.phase_to_pb(job.phase)
                shown.cluster = "" if job.placement is None else job.placement.cluster
            members.append(shown)
        out = pb.JobSet(
            name=record.name,
            tenant=record.tenant,
            user=record.user,
            max_parallel=record.max_parallel,
            array=record.array,
            job_count=len(record.members),
            counts=[pb.JobSetPhaseCount(phase=p, jobs=n) for p, n in status.counts.items()],
            gpu_hours=status.gpu_hours,
            cost_usd="" if status.micro_usd is None else format_usd(status.micro_usd),
            cancel_requested=record.cancel_requested,
            cancel_reason=record.cancel_reason,
            members=members,
            done=status.done,
        )
        out.created_at.FromNanoseconds(int(record.created_at_s * 1e9))
        return out


# A running trial's log as early stopping reads it: the last lines of its first replica's pod.
_LIVE_TAIL_LINES = 5000
_LIVE_LIMIT_BYTES = 1024 * 1024


def live_lines_reader(members: MemberClusters) -> LiveLines:
    """How early stopping reads a running trial's log: its first task's first replica's pod, through
    its member cluster, as `gpufed logs` does (not followed: the last lines, now). None when the
    cluster or the pod cannot answer now (the trial is looked at again next pass)."""

    async def read(job: JobRecord) -> Sequence[str] | None:
        if job.placement is None:
            return None
        backend = members.get(job.placement.cluster)
        if not isinstance(backend, GangInspector):
            return None
        first = (job.spec.tasks[0].name, 0)
        try:
            replicas = await backend.replicas(job.tenant, job.job_id, job.attempt)
            chosen = [r for r in replicas if locate(r, job.spec, job.job_id, job.attempt) == first]
            if not chosen:
                return None
            options = LogOptions(tail_lines=_LIVE_TAIL_LINES, limit_bytes=_LIVE_LIMIT_BYTES)
            stream = backend.pod_log(job.tenant, chosen[0], options)
            data = b""
            try:
                async for part in stream:
                    data += part
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()
        except (ClusterUnreachable, LogUnavailable):
            return None
        return data.decode("utf-8", "replace").splitlines()

    return read


@contextlib.asynccontextmanager
async def set_controller_running(servicers: Sequence[object]) -> AsyncIterator[SetController | None]:
    """The set controller of a server's JobService running while the block runs, stopped after it,
    and beside it the early stopping of sweeps when the server reads member clusters' logs. Every
    server runs both (releases and cancels are compare-and-swap, so two never do one twice)."""
    calls = next((getattr(s, "job_sets", None) for s in servicers if getattr(s, "job_sets", None)), None)
    if not isinstance(calls, JobSetCalls):
        yield None
        return
    stop = asyncio.Event()
    tasks = [asyncio.create_task(calls.controller.run(stop), name="gpufed-job-sets")]
    # The logs service's member clusters (`LogsService.members`; not imported here: it imports us).
    found = (getattr(s, "members", None) for s in servicers)
    members = next((m for m in found if isinstance(m, MemberClusters)), None)
    if members is not None:
        stopper = EarlyStopper(
            sets=calls.sets, store=calls.store, cache=calls.cache, live_lines=live_lines_reader(members)
        )
        tasks.append(asyncio.create_task(stopper.run(stop), name="gpufed-sweep-stopping"))
    try:
        yield calls.controller
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
