"""Waiting for an attempt's pods to be gone before the job moves on, and removing them meanwhile.

A gang object can end (or vanish: a third party deletes it, `--cascade=orphan` keeps its pods) while
pods of its attempt still run. Starting the next attempt then would run two copies of the job, and
closing the ledger interval would stop charging GPUs the cloud still bills. So the reconciler holds
such a job where it is until its cluster reports no live pod of the attempt (`GangStatus.live_pods`),
and this module sees that the pods are deleted: at once when their gang object is gone (nothing
else will stop them), after `patience_s` when the gang's own controller is stopping them, and again
without a grace period if they outlast the first deletion by as long.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import structlog

from clusters.api import ClusterError, GangPhase, GangStatus
from federation.scheduling.members import GangKey, MemberClusters
from placement.model import ClusterName, JobId

log = structlog.get_logger("gpufed.leftovers")


def pods_outlive(gang: GangStatus | None) -> bool:
    """The attempt is over by its gang, but pods of it are still there (a success keeps its result)."""
    return (
        gang is not None
        and gang.live_pods > 0
        and (gang.orphaned or gang.phase.is_final)
        and gang.phase is not GangPhase.SUCCEEDED
    )


def holding_attempts(
    statuses: Mapping[ClusterName, Mapping[GangKey, GangStatus] | None],
) -> dict[JobId, list[tuple[ClusterName, int]]]:
    """Per job, the attempts whose gangs may still hold pods on a reachable cluster (not ended, or
    ended with live pods), and where: the next attempt of the job is not dispatched beside them."""
    found: dict[JobId, list[tuple[ClusterName, int]]] = {}
    for cluster, gangs in statuses.items():
        for (job_id, attempt), gang in (gangs or {}).items():
            if not gang.phase.is_final or gang.live_pods > 0:
                found.setdefault(job_id, []).append((cluster, attempt))
    return found


class Leftovers:
    def __init__(self, members: MemberClusters, clock: Callable[[], float], patience_s: float) -> None:
        self._members = members
        self._clock = clock
        self._patience_s = patience_s
        # When each attempt's leftovers were last deleted, by this process. A new leader deletes
        # again, which the cluster treats as a no-op for pods already stopping.
        self._sent: dict[GangKey, float] = {}
        # Attempts the reconciler held back for their pods: their interval ends when the pods went.
        self._waiting: set[GangKey] = set()

    async def remove(self, cluster: ClusterName, gang: GangStatus) -> None:
        """Delete the attempt's pods when it is time to (see the module docstring)."""
        now = self._clock()
        # Attempts long settled (moved on, or collected) need no memory.
        for old in [k for k, at_s in self._sent.items() if now - at_s > 10 * self._patience_s]:
            del self._sent[old]
        key = (gang.job_id, gang.attempt)
        sent = self._sent.get(key)
        if sent is None:
            ended = gang.finished_at_s if gang.finished_at_s is not None else now
            if not gang.orphaned and now - ended < self._patience_s:
                return
            grace_s = self._patience_s
        elif now - sent >= self._patience_s:
            grace_s = 0.0
        else:
            return
        backend = self._members.get(cluster)
        if backend is None:
            return
        try:
            await backend.cancel(gang.job_id, gang.attempt, grace_s)
        except ClusterError as error:
            log.warning("leftover_pods_removal_failed", cluster=cluster, job_id=gang.job_id, error=str(error))
            return
        self._sent[key] = now
        log.info(
            "leftover_pods_removed",
            cluster=cluster,
            job_id=gang.job_id,
            attempt=gang.attempt,
            live_pods=gang.live_pods,
            grace_period_s=grace_s,
        )

    def note_wait(self, key: GangKey) -> None:
        self._waiting.add(key)

    def waited(self, key: GangKey) -> bool:
        return key in self._waiting

    def forget(self, key: GangKey) -> None:
        self._sent.pop(key, None)
        self._waiting.discard(key)
