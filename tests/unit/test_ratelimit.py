"""Per-tenant submission limits: a burst, then the configured rate, and a message saying when to retry."""

from __future__ import annotations

import pytest

from federation.errors import InvalidSpec, RateLimited
from federation.security.ratelimit import SubmitRateLimiter, retry_after_s
from federation.store.config_policy import parse_tenant, tenant_document


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_gets_its_burst_then_its_rate_and_others_are_not_affected() -> None:
    clock = Clock()
    limiter = SubmitRateLimiter(clock)
    for _ in range(5):
        limiter.admit("vision", 2.0, 5)
    with pytest.raises(RateLimited, match=r"limit of 2/s \(burst 5\); retry in 0.50s"):
        limiter.admit("vision", 2.0, 5)
    limiter.admit("nlp", 2.0, 5)  # another tenant has its own bucket
    clock.now += 0.5
    limiter.admit("vision", 2.0, 5)
    with pytest.raises(RateLimited):
        limiter.admit("vision", 2.0, 5)


def test_no_limit_means_no_limit() -> None:
    limiter = SubmitRateLimiter(Clock())
    for _ in range(10_000):
        limiter.admit("vision", None, None)


def test_a_lowered_limit_applies_at_once() -> None:
    clock = Clock()
    limiter = SubmitRateLimiter(clock)
    limiter.admit("vision", 100.0, 200)
    limiter.admit("vision", 1.0, 1)
    with pytest.raises(RateLimited):
        limiter.admit("vision", 1.0, 1)


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        pytest.param({"perSecond": 0}, "submitRateLimit.perSecond", id="zero-rate"),
        pytest.param({"perSecond": 5, "burst": 0}, "submitRateLimit.burst", id="zero-burst"),
        pytest.param({"perSecond": 5, "every": 1}, "submitRateLimit", id="unknown-key"),
    ],
)
def test_bad_limits_are_refused_naming_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec) as error:
        parse_tenant({"name": "vision", "submitRateLimit": doc}, "tenant", priority_classes=())
    assert error.value.field.startswith("tenant." + field)


def test_the_limit_round_trips_through_the_tenant_document() -> None:
    tenant = parse_tenant(
        {"name": "vision", "submitRateLimit": {"perSecond": 20}}, "tenant", priority_classes=()
    )
    assert (tenant.submit_rate_per_s, tenant.submit_burst) == (20.0, 40)
    assert parse_tenant(tenant_document(tenant), "tenant", priority_classes=()) == tenant


def test_a_refusal_never_says_retry_in_no_time_and_waiting_what_it_says_is_enough() -> None:
    clock = Clock()
    limiter = SubmitRateLimiter(clock)
    for _ in range(5):
        limiter.admit("vision", 2.0, 5)
    clock.now += 0.4999  # a hair short of the next token
    with pytest.raises(RateLimited, match=r"retry in 0\.01s") as refused:
        limiter.admit("vision", 2.0, 5)
    said = float(str(refused.value).rsplit("retry in ", 1)[1].rstrip("s"))
    clock.now += said
    limiter.admit("vision", 2.0, 5)


@pytest.mark.parametrize("wait_s", [1e-9, 0.004, 0.01, 0.0100001, 0.333, 2.0])
def test_the_wait_told_is_rounded_up_to_what_it_shows(wait_s: float) -> None:
    told = retry_after_s(wait_s)
    assert told >= wait_s - 1e-12
    assert told >= 0.01
    assert f"{told:.2f}" != "0.00"


def test_a_refunded_submission_is_available_again() -> None:
    """A retry of an accepted idempotency key is admitted, then refunded when it created nothing."""
    limiter = SubmitRateLimiter(Clock())
    limiter.admit("vision", 1.0, 1)
    limiter.refund("vision")
    limiter.admit("vision", 1.0, 1)
    with pytest.raises(RateLimited):
        limiter.admit("vision", 1.0, 1)
