"""Which burst-at-once alternative the scheduler records on a job's attempt (`JobRecord.burst_offer`).

The placer reports, for each gang that could not start on private GPUs at once, the cheapest cloud
offer it would burst to now (`Plan.bursts`: the offer its private wait was priced against, or the
pool asked to grow for it). A gang admitted straight to a cloud offer burst at once: that offer is
the alternative. A gang admitted to private GPUs at once has none (bursting at once would have put it
there too, at no saving), unless an earlier cycle of the attempt recorded one while it waited.

Recorded once per attempt, in the first cycle that reports one: later cycles of the same attempt
keep it unchanged, and a new attempt (after a preemption, a lost cluster, a retry) gets its own. So
the scheduler writes it in the admission's compare-and-swap where the job is admitted, and otherwise
with one write for the attempt, never one per cycle.
"""

from __future__ import annotations

from federation.store.jobs import BurstOffer, JobRecord
from placement.model import Admission, Alternative, CapacityKind


def needs_burst_offer(job: JobRecord) -> bool:
    """Whether the job's current attempt has no alternative recorded yet."""
    return job.burst_offer is None or job.burst_offer.attempt != job.attempt


def burst_offer_for(
    job: JobRecord, alternative: Alternative | None, admission: Admission | None, now_s: float
) -> BurstOffer | None:
    """The alternative to record on the job for this cycle (None: nothing new to record)."""
    if not needs_burst_offer(job):
        return None
    if alternative is not None:
        return BurstOffer(
            alternative.cluster,
            alternative.gpu_type,
            alternative.kind,
            alternative.usd_per_gpu_hour,
            now_s,
            job.attempt,
        )
    if admission is not None and admission.kind is not CapacityKind.PRIVATE:
        return BurstOffer(
            admission.cluster,
            admission.gpu_type,
            admission.kind,
            admission.usd_per_gpu_hour,
            now_s,
            job.attempt,
        )
    return None
