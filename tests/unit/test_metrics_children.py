"""The kept children of the per-call metrics count in the same series, by the same names and labels."""

from __future__ import annotations

from federation.metrics import Metrics


def test_calls_and_submissions_count_under_their_labels() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.observe_call("SubmitJob", "OK", 0.002)
    metrics.observe_call("SubmitJob", "RESOURCE_EXHAUSTED", 0.2)
    metrics.observe_call("GetJob", "OK", 0.0005)
    metrics.job_submitted("t0")
    metrics.job_submitted("t0")
    metrics.job_submitted("t1")
    value = metrics.registry.get_sample_value
    assert value("gpufed_api_request_seconds_count", {"method": "SubmitJob", "code": "OK"}) == 3
    assert value("gpufed_api_request_seconds_sum", {"method": "SubmitJob", "code": "OK"}) == 0.006
    assert (
        value("gpufed_api_request_seconds_count", {"method": "SubmitJob", "code": "RESOURCE_EXHAUSTED"}) == 1
    )
    assert value("gpufed_api_request_seconds_bucket", {"method": "GetJob", "code": "OK", "le": "0.001"}) == 1
    assert value("gpufed_jobs_submitted_total", {"tenant": "t0"}) == 2
    assert value("gpufed_jobs_submitted_total", {"tenant": "t1"}) == 1
    # The same series the labelled metric itself reads (one child per label set, not two).
    metrics.jobs_submitted.labels(tenant="t0").inc()
    assert value("gpufed_jobs_submitted_total", {"tenant": "t0"}) == 3


def test_each_server_keeps_its_own_children() -> None:
    first, second = Metrics(), Metrics()
    first.job_submitted("t0")
    assert second.registry.get_sample_value("gpufed_jobs_submitted_total", {"tenant": "t0"}) is None
