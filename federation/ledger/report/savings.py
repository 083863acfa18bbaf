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
from dataclasses import dataclass
from enum import StrEnum

from federation.ledger.report.query import Bucket, bucket_end_s, bucket_start_s
from federation.store.intervals import LedgerInterval, SetKind
from federation.store.jobs import BurstOffer
from federation.store.money import day_pieces, format_usd, micro_per_gpu_hour, piece_micro_usd
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


_SET_DIMS = frozenset({SavingsDim.SET, SavingsDim.SWEEP})


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
        # A set's name is its tenant's own (as in the usage report, `query.with_set_tenant`): by set
        # or sweep without the tenant, it goes just before the first of them, so two tenants' sets
        # of one name are never one row.
        dims = tuple(self.group_by)
        if SavingsDim.TENANT not in dims and _SET_DIMS & set(dims):
            at = next(i for i, d in enumerate(dims) if d in _SET_DIMS)
            dims = (*dims[:at], SavingsDim.TENANT, *dims[at:])
        object.__setattr__(self, "group_by", dims)

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


@dataclass(frozen=True, slots=True)
class SavingsReport:
    query: SavingsQuery
    rows: tuple[SavingsRow, ...]
    total: SavingsRow


def compute_savings(intervals: Iterable[LedgerInterval], query: SavingsQuery) -> SavingsReport:
    """The savings report over `intervals` (etcd's and the archived ones, each once), grouped by the
    query's dimensions and bucket, for the tenants it may see.

    The arithmetic is `attempt_saving`'s, inlined (a month of 100,000 attempts spent most of its
    time building one `AttemptSaving` per piece): each day piece costs
    `round(gpus x seconds x price_micro / 3600)` at the paid price and at the offer's."""
    since, until = query.start_s, query.until_s
    tenants, dims, bucket = query.tenants, query.group_by, query.bucket
    rows: dict[tuple[tuple[str, ...], float | None], SavingsRow] = {}
    total = SavingsRow(keys=(), bucket_start_s=None)
    for iv in intervals:
        if tenants is not None and iv.tenant not in tenants:
            continue
        end = until if iv.end_s is None else min(iv.end_s, until)
        if iv.start_s >= until or end <= since:
            continue
        keys = tuple([_dim_value(iv, d) for d in dims])
        gpus = float(iv.gpu_count)
        price = float(micro_per_gpu_hour(iv.usd_per_gpu_hour))
        offer = iv.burst_offer
        offer_price = None if offer is None else float(micro_per_gpu_hour(offer.usd_per_gpu_hour))
        public = iv.kind is not CapacityKind.PRIVATE
        waited = extra_wait_s(iv)
        first = True
        for a, b in _bucket_pieces(max(iv.start_s, since), end, bucket):
            seconds = 0.0
            cost = burst = 0
            for x, y in day_pieces(a, b):
                span = y - x
                seconds += span
                cost += round(gpus * span * price / 3600.0)
                if offer_price is not None:
                    burst += round(gpus * span * offer_price / 3600.0)
            paid = cost if public else 0
            if offer_price is None:
                burst = paid
            # The wait belongs to the piece the start falls in, so an attempt begun before the
            # period adds none.
            wait = waited if a <= iv.start_s < b else 0.0
            at = None if bucket is None else bucket_start_s(a, bucket)
            row = rows.get((keys, at))
            if row is None:
                row = rows[(keys, at)] = SavingsRow(keys=keys, bucket_start_s=at)
            # Each piece of an attempt is in another bucket, so in another row: a row counts each
            # attempt once; the total counts it on its first piece.
            for target, count in ((row, True), (total, first)):
                target.gpu_seconds += gpus * seconds
                target.paid_micro += paid
                target.private_micro += 0 if public else cost
                target.burst_micro += burst
                target.extra_wait_s += wait
                if count:
                    target.attempts += 1
                    target.attempts_no_offer += offer is None
            first = False
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
