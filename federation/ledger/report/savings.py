"""What waiting for private GPUs saved, for finance (issue 35), and finance by job set and sweep
(issue 34): pure, from the ledger's intervals and the burst-at-once offers they carry.

Each ledger interval is one attempt that ran. Its `burst_offer` is the cheapest public offer the
placer saw for the gang in the first cycle that considered that attempt (`JobRecord.burst_offer`):
what it would have cost to burst there and then instead of waiting. The rules:

* **paid** (`paid_usd`): the attempt's cloud cost as the ledger charges it, GPU-hours x the price
  in force when it started, for attempts on on-demand or spot capacity. Private GPUs are owned:
  their internal rate is shown apart (`private_usd`) and is not cloud spend.
* **burst at once** (`burst_usd`): the same GPU-hours (the attempt's run, as the ledger measured it)
  at the offer's price. An attempt that ran on public capacity anyway saves (offer price - paid
  price) x GPU-hours, which is negative when it ended up somewhere dearer than the first offer.
* **no offer** (`attempts_no_offer`): nothing public fitted when the placer first saw the attempt
  (or it ran before offers were recorded): its counterfactual is what it did, so its saving is 0
  and it adds no waiting time. It is counted, not hidden.
* **saved** (`saved_usd`) = burst at once - paid.
* **extra queueing** (`extra_wait_hours`): the attempt's start (the cluster's gang start) minus
  `seen_at_s` (when it could have burst), never below zero. It includes the startup a burst would
  have had too (pods pulled and scheduled), so it overstates the wait by that.

Money follows the ledger's rule (`federation.store.money`): each attempt is cut at UTC midnights and
each piece rounded once to whole micro-dollars, at the paid price and at the offer's price, so
`paid_usd` equals the usage report's cost of the same intervals to the micro-dollar.

Periods and buckets: an attempt's GPU-hours and money are split at the period's and the buckets'
edges as the usage report splits them (a job running across midnight of a month's end counts its
hours on each side); its extra queueing time is counted once, in the bucket and period its start
falls in. A row's `attempts` counts the attempts with any time in it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from federation.ledger.report.query import Bucket, bucket_end_s, bucket_start_s
from federation.store.intervals import LedgerInterval, SetKind
from federation.store.jobs import BurstOffer
from federation.store.money import day_pieces, format_usd, piece_micro_usd
from placement.model import CapacityKind, TenantId


class SavingsDim(StrEnum):
    TENANT = "tenant"
    USER = "user"
    CLUSTER = "cluster"
    GPU_TYPE = "gpu_type"
    KIND = "kind"
    # The job set an attempt's job was released from ("" for a job submitted alone), and the same
    # for sweeps only ("" for every job not a sweep's trial).
    SET = "set"
    SWEEP = "sweep"


@dataclass(frozen=True, slots=True)
class SavingsQuery:
    start_s: float
    end_s: float
    now_s: float
    group_by: tuple[SavingsDim, ...] = (SavingsDim.TENANT, SavingsDim.GPU_TYPE)
    bucket: Bucket | None = None
    # None: every tenant; otherwise only these (a member's report names its own tenant only).
    tenants: frozenset[TenantId] | None = None

    def __post_init__(self) -> None:
        if self.end_s <= self.start_s:
            raise ValueError("a report's period must end after it starts")
        if not self.group_by:
            raise ValueError("a savings report groups by at least one dimension")

    @property
    def until_s(self) -> float:
        """Nothing counts after now."""
        return min(self.end_s, max(self.now_s, self.start_s))


@dataclass(frozen=True, slots=True)
class AttemptSaving:
    """One attempt's figures within a window, in whole micro-dollars."""

    gpu_seconds: float
    paid_micro: int
    private_micro: int
    burst_micro: int
    # Seconds between when it could have burst and when it started; 0 without an offer.
    extra_wait_s: float
    offer: BurstOffer | None

    @property
    def saved_micro(self) -> int:
        return self.burst_micro - self.paid_micro


def _dim_value(iv: LedgerInterval, dim: SavingsDim) -> str:
    match dim:
        case SavingsDim.TENANT:
            return iv.tenant
        case SavingsDim.USER:
            return iv.user
        case SavingsDim.CLUSTER:
            return iv.cluster
        case SavingsDim.GPU_TYPE:
            return iv.gpu_type
        case SavingsDim.KIND:
            return iv.kind.value
        case SavingsDim.SET:
            return iv.job_set
        case SavingsDim.SWEEP:
            return iv.job_set if iv.set_kind == SetKind.SWEEP.value else ""


def extra_wait_s(iv: LedgerInterval) -> float:
    """How much later the attempt started than it could have burst (0 without an offer)."""
    offer = iv.burst_offer
    return 0.0 if offer is None else max(0.0, iv.start_s - offer.seen_at_s)


def attempt_saving(iv: LedgerInterval, *, since_s: float = float("-inf"), until_s: float) -> AttemptSaving:
    """The attempt's paid, private and burst-at-once cost within [since_s, until_s) (an open one up
    to `until_s`), and its extra queueing time if it started inside the window."""
    start = max(iv.start_s, since_s)
    end = until_s if iv.end_s is None else min(iv.end_s, until_s)
    paid = private = burst = 0
    seconds = 0.0
    offer = iv.burst_offer
    public = iv.kind is not CapacityKind.PRIVATE
    for a, b in day_pieces(start, end):
        seconds += b - a
        piece = piece_micro_usd(iv.gpu_count, a, b, iv.usd_per_gpu_hour)
        if public:
            paid += piece
        else:
            private += piece
        if offer is not None:
            burst += piece_micro_usd(iv.gpu_count, a, b, offer.usd_per_gpu_hour)
    if offer is None:
        burst = paid
    waited = extra_wait_s(iv) if since_s <= iv.start_s < until_s else 0.0
    return AttemptSaving(
        gpu_seconds=iv.gpu_count * seconds,
        paid_micro=paid,
        private_micro=private,
        burst_micro=burst,
        extra_wait_s=waited,
        offer=offer,
    )


@dataclass(slots=True)
class SavingsRow:
    keys: tuple[str, ...]
    # The bucket's calendar start, None without buckets.
    bucket_start_s: float | None
    gpu_seconds: float = 0.0
    paid_micro: int = 0
    private_micro: int = 0
    burst_micro: int = 0
    extra_wait_s: float = 0.0
    attempts: int = 0
    attempts_no_offer: int = 0
    # The attempts counted so far (an attempt split across days of one bucket counts once).
    _seen: set[tuple[str, int]] = field(default_factory=set, repr=False)

    @property
    def saved_micro(self) -> int:
        return self.burst_micro - self.paid_micro

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def extra_wait_hours(self) -> float:
        return self.extra_wait_s / 3600.0

    @property
    def saved_share(self) -> float | None:
        """The saving as a share of bursting at once; None when bursting would have cost nothing."""
        return None if self.burst_micro == 0 else self.saved_micro / self.burst_micro

    def add(self, iv: LedgerInterval, s: AttemptSaving) -> None:
        self.gpu_seconds += s.gpu_seconds
        self.paid_micro += s.paid_micro
        self.private_micro += s.private_micro
        self.burst_micro += s.burst_micro
        self.extra_wait_s += s.extra_wait_s
        attempt = (iv.job_id, iv.attempt)
        if attempt not in self._seen:
            self._seen.add(attempt)
            self.attempts += 1
            if s.offer is None:
                self.attempts_no_offer += 1


@dataclass(frozen=True, slots=True)
class SavingsReport:
    query: SavingsQuery
    rows: tuple[SavingsRow, ...]
    total: SavingsRow


def compute_savings(intervals: Iterable[LedgerInterval], query: SavingsQuery) -> SavingsReport:
    """The savings report over `intervals` (etcd's and the archived ones, each once), grouped by the
    query's dimensions and bucket, for the tenants it may see."""
    since, until = query.start_s, query.until_s
    rows: dict[tuple[tuple[str, ...], float | None], SavingsRow] = {}
    total = SavingsRow(keys=(), bucket_start_s=None)
    for iv in intervals:
        if query.tenants is not None and iv.tenant not in query.tenants:
            continue
        end = until if iv.end_s is None else min(iv.end_s, until)
        if iv.start_s >= until or end <= since:
            continue
        keys = tuple(_dim_value(iv, d) for d in query.group_by)
        for a, b in _bucket_pieces(max(iv.start_s, since), end, query.bucket):
            # The wait belongs to the piece the start falls in: `attempt_saving` counts it only
            # when the start is inside [a, b), so an attempt begun before the period adds none.
            piece = attempt_saving(iv, since_s=a, until_s=b)
            bucket = None if query.bucket is None else bucket_start_s(a, query.bucket)
            row = rows.get((keys, bucket))
            if row is None:
                row = rows[(keys, bucket)] = SavingsRow(keys=keys, bucket_start_s=bucket)
            row.add(iv, piece)
            total.add(iv, piece)
    ordered = sorted(rows.values(), key=lambda r: (r.keys, r.bucket_start_s or 0.0))
    return SavingsReport(query=query, rows=tuple(ordered), total=total)


def _bucket_pieces(start_s: float, end_s: float, bucket: Bucket | None) -> list[tuple[float, float]]:
    """[start, end) cut at the bucket edges (one piece without buckets)."""
    if bucket is None:
        return [(start_s, end_s)] if end_s > start_s else []
    out = []
    at = start_s
    while at < end_s:
        edge = bucket_end_s(bucket_start_s(at, bucket), bucket)
        out.append((at, min(edge, end_s)))
        at = min(edge, end_s)
    return out


def attempt_savings_text(iv: LedgerInterval) -> str:
    """An ended attempt's line for `describe` (issue 35), from its whole interval; "" while it runs."""
    if iv.end_s is None:
        return ""
    s = attempt_saving(iv, until_s=iv.end_s)
    paid = dollars(s.paid_micro)
    if s.private_micro:
        paid += f" in cloud (private GPUs, {dollars(s.private_micro)} at the internal rate)"
    offer = s.offer
    if offer is None:
        return f"paid {paid}; no public offer was recorded for it (nothing to burst to): no saving counted"
    minutes = round(s.extra_wait_s / 60.0)
    return (
        f"paid {paid}; bursting at once to {offer.cluster} at ${offer.usd_per_gpu_hour:.2f}/GPU-hour "
        f"would have cost {dollars(s.burst_micro)} (saved {dollars(s.saved_micro)}, waited +{minutes}m)"
    )


def dollars(micro: int) -> str:
    """'$12.35', '-$6.00': to the cent, half to even on the integer."""
    text = format_usd(abs(micro), places=2)
    return f"-${text}" if micro < 0 else f"${text}"
