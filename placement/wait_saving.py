"""What a wait for private GPUs buys, in the words `explain` shows: the estimated saving against
bursting now, the cloud offer it would burst to and its price per hour, and until when it waits.

    saving = expected cost on the cloud offer now - expected cost on the private offer

both from the cost model (`cost.GangCost.cost`: price per GPU-hour of useful work x GPUs x hours of
work at the type's speed, plus egress and the staging delay's value). The hourly figure is the cloud
offer's list price for the whole gang (price per GPU-hour x GPUs), what a finance reader compares
with an invoice. Times are written as a UTC clock (`clock`), with the date when it is not `now`'s day.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Final

from placement.model_ids import CapacityKind, ClusterName, GpuType
from placement.model_plan import Alternative


@dataclass(frozen=True, slots=True)
class WaitSaving:
    """One gang's wait for private GPUs, priced against bursting now."""

    private_cluster: ClusterName
    private_gpu_type: GpuType
    private_cost_usd: float
    # The cloud offer it would burst to now (the cheapest that fits), and its expected cost there.
    burst: Alternative
    gpu_count: int
    until_s: float

    @property
    def saving_usd(self) -> float:
        return max(0.0, self.burst.expected_cost_usd - self.private_cost_usd)

    @property
    def burst_usd_per_hour(self) -> float:
        """The whole gang's price per hour on the cloud offer."""
        return self.burst.usd_per_gpu_hour * self.gpu_count

    def words(self, now_s: float) -> str:
        """'waiting for private A100 on cluster onprem until 14:05 UTC: saves an estimated $312.00
        against bursting now to aws-us-east-1 (A100, on_demand) at $32.77/h; bursts then if no room frees'."""
        burst = self.burst
        return (
            f"waiting for private {self.private_gpu_type} on cluster {self.private_cluster} until "
            f"{clock(self.until_s, now_s)}: saves an estimated ${self.saving_usd:,.2f} against bursting now "
            f"to {burst.cluster} ({burst.gpu_type}, {_kind(burst.kind)}) "
            f"at ${self.burst_usd_per_hour:,.2f}/h; bursts then if no room frees"
        )


def _kind(kind: CapacityKind) -> str:
    return kind.value.replace("_", "-")


def clock(at_s: float, now_s: float) -> str:
    """A moment as explain writes it: '14:05 UTC' on `now_s`'s day (UTC), else '2026-12-01 14:05 UTC'.

    Worded for every waiting gang in every cycle, so by arithmetic on whole seconds rather than two
    datetimes and a strftime (a replay words it some 200,000 times per week and policy); the same
    text as `_datetime_clock` for every moment (tests/unit/test_wait_saving.py)."""
    if not (0 <= at_s < _LAST_S and 0 <= now_s < _LAST_S):
        return _datetime_clock(at_s, now_s)
    # `datetime.fromtimestamp` rounds to the microsecond, half to even: 59.9999995 is the next second.
    at, now = int(at_s), int(now_s)
    at += (at_s - at) * 1e6 >= 999_999.5
    now += (now_s - now) * 1e6 >= 999_999.5
    day, second = divmod(at, _DAY_S)
    text = _minute(second // 60)
    return text if day == now // _DAY_S else f"{_date(day)} {text}"


# Moments from 1970 to a day before the end of 9999 take the arithmetic; the rest `datetime` itself.
_DAY_S: Final = 86_400
_LAST_S: Final = 253_402_300_800 - _DAY_S


@lru_cache(maxsize=1440)
def _minute(minute_of_day: int) -> str:
    return f"{minute_of_day // 60:02d}:{minute_of_day % 60:02d} UTC"


@lru_cache(maxsize=64)
def _date(day: int) -> str:
    return datetime.fromtimestamp(day * _DAY_S, UTC).strftime("%Y-%m-%d")


def _datetime_clock(at_s: float, now_s: float) -> str:
    """The definition `clock` follows."""
    moment = datetime.fromtimestamp(at_s, UTC)
    same_day = moment.date() == datetime.fromtimestamp(now_s, UTC).date()
    return moment.strftime("%H:%M UTC" if same_day else "%Y-%m-%d %H:%M UTC")
