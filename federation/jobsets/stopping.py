"""Early stopping of a sweep's losing trials (median stopping or successive halving), run beside the
set controller.

Each pass reads, for every sweep with `earlyStopping` that is not cancelled, the intermediate
values its trials printed (`gpufed-metric: NAME=VALUE step=N`): a running trial's from its live
log (its first replica's pod, read through the member cluster as `gpufed logs` reads it), an ended
trial's from its kept log tail (read once: it never changes). A running trial that the sweep's rule
condemns (`sweeps.median_stop`, `sweeps.halving_stop`) is cancelled as `gpufed cancel` does it, the
rule's reason as its message, so `gpufed sweep results` and `gpufed get` say why it ended. The
decision is pure; this module only reads and writes.

A trial whose cluster cannot be reached is left running this pass; one stopped by two servers at
once is cancelled once (the cancel is a compare-and-swap on the job's revision).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import structlog

from federation.joblogs.archive import LogArchive, LogsSettings
from federation.jobsets.early_stopping import EarlyStopping, Goal, MedianStopping, SuccessiveHalving
from federation.jobsets.early_stopping import stop_reason as decide
from federation.jobsets.records import JobSetRecord, MemberState
from federation.jobsets.store import JobSetStore
from federation.jobsets.sweeps import history
from federation.store.job_cache import JobCache
from federation.store.job_store import JobStore
from federation.store.jobs import JobRecord
from placement.model import JobId

log = structlog.get_logger("gpufed.jobsets.stopping")

# A running trial's log, as lines (None when it cannot be read now).
LiveLines = Callable[[JobRecord], Awaitable[Sequence[str] | None]]

DEFAULT_INTERVAL_S = 2.0


def rule_of(record: JobSetRecord) -> EarlyStopping | None:
    raw = (record.sweep or {}).get("earlyStopping")
    if not isinstance(raw, dict):
        return None
    if raw.get("type") == "successiveHalving":
        return SuccessiveHalving(
            min_trials=int(raw["minTrials"]),
            min_step=int(raw["minStep"]),
            reduction_factor=int(raw["reductionFactor"]),
        )
    return MedianStopping(min_trials=int(raw["minTrials"]), min_step=int(raw["minStep"]))


class EarlyStopper:
    def __init__(
        self,
        *,
        sets: JobSetStore,
        store: JobStore,
        cache: JobCache,
        live_lines: LiveLines,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self._sets = sets
        self._store = store
        self._cache = cache
        self._live_lines = live_lines
        self._archive = LogArchive(sets.kv, LogsSettings())
        self._interval_s = interval_s
        # Ended trials' histories, by job: their kept logs never change.
        self._ended: dict[JobId, dict[int, float]] = {}
        self._seen: set[JobId] = set()
        self.stopped = 0

    async def _kept(self, job: JobRecord, metric: str) -> dict[int, float]:
        if job.job_id in self._ended:
            return self._ended[job.job_id]
        task = job.spec.tasks[0].name
        data = await self._archive.log(job.job_id, job.attempt, task, 0)
        # A kept line starts with its stamp; the metric is found wherever it is on the line.
        values = history(data.decode("utf-8", "replace").splitlines(), metric)
        if data:
            self._ended[job.job_id] = values
        return values

    async def sweep_pass(self, record: JobSetRecord, rule: EarlyStopping) -> int:
        """Stop what the rule condemns in one sweep now; how many trials were stopped."""
        metric = str(record.sweep["metric"]["name"]) if record.sweep else ""
        goal = Goal(record.sweep["metric"]["goal"]) if record.sweep else Goal.MINIMIZE
        jobs = [
            cached.value
            for m in record.members
            if m.state is MemberState.RELEASED and (cached := self._cache.get(m.job_id)) is not None
        ]  # a job not in the cache was archived: ended long ago, its kept copy gone with it
        if not any(not j.phase.is_terminal and not j.cancel_requested for j in jobs):
            return 0  # nothing to stop: no log is read (a finished sweep costs a cache look a pass)
        running: list[tuple[JobRecord, dict[int, float]]] = []
        histories: dict[JobId, dict[int, float]] = {}
        for job in jobs:
            self._seen.add(job.job_id)
            if job.phase.is_terminal:
                histories[job.job_id] = await self._kept(job, metric)
                continue
            if job.cancel_requested:
                continue
            lines = await self._live_lines(job)
            if lines is None:
                continue
            values = history(lines, metric)
            histories[job.job_id] = values
            running.append((job, values))
        stopped = 0
        for job, values in running:
            others = [h for j, h in histories.items() if j != job.job_id]
            reason = decide(values, others, goal, rule)
            if reason is not None and await self._cancel(job.job_id, reason):
                stopped += 1
                log.info(
                    "sweep_trial_stopped",
                    tenant=record.tenant,
                    sweep=record.name,
                    job_id=job.job_id,
                    why=reason,
                )
        return stopped

    async def _cancel(self, job_id: JobId, reason: str) -> bool:
        for _ in range(5):
            stored = await self._store.get_job(job_id)
            if stored is None or stored.value.phase.is_terminal or stored.value.cancel_requested:
                return False
            updated = replace(stored.value, cancel_requested=True, message=reason)
            if await self._store.commit([(updated, stored.mod_revision)]) is not None:
                return True
        return False

    async def pass_once(self) -> int:
        stopped = 0
        self._seen = set()
        for stored in await self._sets.list_stopping():
            record = stored.value
            rule = rule_of(record)
            if rule is None or record.cancel_requested:
                continue
            try:
                stopped += await self.sweep_pass(record, rule)
            except Exception:
                # One sweep's trouble must not stop the others' (the next pass tries it again).
                log.exception("sweep_stopping_pass_failed", tenant=record.tenant, sweep=record.name)
        # Only the histories of sweeps still running are kept from one pass to the next.
        self._ended = {j: h for j, h in self._ended.items() if j in self._seen}
        self.stopped += stopped
        return stopped

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.pass_once()
            except Exception:
                log.exception("sweep_stopping_failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)
