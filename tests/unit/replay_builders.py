"""Small builders for the replay's tests: a config document, a price table and hand-made jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from federation.replay.config import ReplayConfig, parse_config
from federation.replay.prices import PriceTable, parse_prices
from federation.replay.trace import TraceJob
from placement.model import GpuType, JobId, TenantId

PRICES_CSV = """cloud,region,instance_type,accelerator,accel_count,ondemand_usd_hr,spot_usd_hr
AWS,us-east-1,p3.2xlarge,V100,1,3.0,0.9
AWS,us-east-1,p3.8xlarge,V100,4,16.0,
AWS,us-east-1,bogus,V100,1,700.0,700.0
GCP,us-central1,a2,A100,1,4.0,1.2
"""


def a_price_table(text: str = PRICES_CSV) -> PriceTable:
    return parse_prices(text.splitlines(keepends=True), (700.0,), "test-prices")


def a_config(**overrides: Any) -> ReplayConfig:
    """One private cluster of V100s (one node of `gpus_per_node` at size 1), AWS V100 at $3/GPU-hour."""
    doc: dict[str, Any] = {
        "trace": "trace.csv",
        "prices": "prices.csv",
        "seed": 7,
        "period_s": 1000,
        "gpu_mix": [{"types": ["V100"], "share": 1.0}],
        "gpu_speeds": {"V100": 1.0, "A100": 2.0},
        "private": {
            "gpus_per_node": 1,
            "sizes": [1.0],
            "clusters": [
                {
                    "name": "onprem",
                    "type_fractions": {"V100": 1.0},
                    "usd_per_gpu_hour": {"V100": 1.0, "A100": 1.5},
                }
            ],
        },
        "public": {
            "lead_time_s": 10,
            "max_gpus_per_type": 64,
            "clusters": [
                {"name": "aws", "cloud": "AWS", "region": "us-east-1", "accelerators": {"V100": "V100"}}
            ],
        },
        "quotas": {"guarantee_fraction": 1.0, "preemption": True, "grace_period_s": 5},
        "jobs": {"runtime_limit_factor": 1.5, "expected_runtime": "exact"},
        "placer": {"cycle_s": 0},
        "policies": {
            "fixed_waits_s": [50],
            "gpufed": {"private_wait_s_per_gpu_hour": 3600, "private_wait_max_s": 400},
        },
    }
    for key, value in overrides.items():
        doc[key] = value
    return parse_config(doc, Path("/nonexistent"))


def a_job(
    job_id: str,
    submit_s: float,
    duration_s: float,
    gpus: int = 1,
    tenant: str = "t1",
    types: tuple[str, ...] = ("V100",),
) -> TraceJob:
    return TraceJob(
        JobId(job_id), submit_s, duration_s, gpus, TenantId(tenant), tuple(GpuType(t) for t in types)
    )
