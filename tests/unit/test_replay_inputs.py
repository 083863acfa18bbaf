"""The replay's inputs: price tables (placeholders rejected), traces, GPU types assigned reproducibly."""

from __future__ import annotations

import gzip
from collections import Counter
from pathlib import Path

import pytest

from federation.replay.config import GpuChoice
from federation.replay.errors import ReplayError
from federation.replay.prices import read_prices
from federation.replay.trace import assign_gpu_types, read_trace, sample
from placement.model import GpuType, GpuTypePolicy
from tests.unit.replay_builders import a_job, a_price_table

SHARED_PRICES = Path(__file__).resolve().parents[3] / "shared" / "data" / "prices" / "gpu_prices.csv"


def test_placeholder_rows_are_rejected_and_listed() -> None:
    table = a_price_table()
    assert [r.instance_type for r in table.rows] == ["p3.2xlarge", "p3.8xlarge", "a2"]
    assert len(table.rejected) == 1
    assert "placeholder" in table.rejected[0]
    assert ":4:" in table.rejected[0]


@pytest.mark.parametrize(
    ("accelerator", "spot", "price"),
    [
        pytest.param("V100", False, 3.0, id="on-demand-cheapest-per-gpu"),
        pytest.param("V100", True, 0.9, id="spot-only-where-offered"),
        pytest.param("A100", True, None, id="other-region-has-none"),
    ],
)
def test_cheapest_gpu_price_in_region(accelerator: str, spot: bool, price: float | None) -> None:
    row = a_price_table().gpu_price("aws", "us-east-1", accelerator, spot=spot)
    assert (row.per_gpu(spot) if row else None) == price


def test_a_placeholder_is_never_chosen_even_when_cheapest() -> None:
    text = "cloud,region,instance_type,accelerator,accel_count,ondemand_usd_hr,spot_usd_hr\n"
    text += "AWS,r,fake,H100,8,700.0,700.0\nAWS,r,real,H100,8,98.0,\n"
    row = a_price_table(text).gpu_price("AWS", "r", "H100", spot=False)
    assert row is not None
    assert row.instance_type == "real"


def test_missing_columns_are_an_error() -> None:
    with pytest.raises(ReplayError, match="missing columns"):
        a_price_table("cloud,region\nAWS,x\n")


@pytest.mark.skipif(not SHARED_PRICES.exists(), reason="shared/data is absent")
def test_the_shared_price_snapshot_reads() -> None:
    table = read_prices(SHARED_PRICES)
    assert len(table.rows) + len(table.rejected) == 1700
    assert table.gpu_price("AWS", "us-east-1", "V100", spot=False) is not None


def _write_trace(path: Path, rows: list[str]) -> Path:
    header = "job_id,submit_time_s,duration_s,num_gpus,gpu_type,tenant,status,submit_wallclock\n"
    with gzip.open(path, "wt") as handle:
        handle.write(header + "\n".join(rows) + "\n")
    return path


def test_trace_is_read_in_submission_order(tmp_path: Path) -> None:
    trace = _write_trace(tmp_path / "t.csv.gz", ["b,20,5,2,,vc1,,", "a,10,7,16,,vc2,,"])
    jobs = read_trace(trace)
    assert [(j.job_id, j.submit_time_s, j.num_gpus) for j in jobs] == [("a", 10.0, 16), ("b", 20.0, 2)]
    assert jobs[0].replica_gpus(8) == (8, 8)
    assert jobs[1].replica_gpus(8) == (2,)


@pytest.mark.parametrize(
    "row",
    [
        pytest.param("a,10,0,1,,vc,,", id="zero-duration"),
        pytest.param("a,x,5,1,,vc,,", id="unreadable-time"),
        pytest.param("a,10,5,1,,,,", id="no-tenant"),
    ],
)
def test_bad_trace_rows_are_errors(tmp_path: Path, row: str) -> None:
    with pytest.raises(ReplayError):
        read_trace(_write_trace(tmp_path / "t.csv.gz", [row]))


MIX = (
    GpuChoice((GpuType("V100"),), 0.6),
    GpuChoice((GpuType("A100"),), 0.3),
    GpuChoice((GpuType("A100"), GpuType("V100")), 0.1, GpuTypePolicy.ANY),
)


def test_gpu_types_depend_only_on_seed_and_job_id() -> None:
    jobs = [a_job(f"j{i}", i, 10) for i in range(2000)]
    first = {j.job_id: j.gpu_types for j in assign_gpu_types(jobs, MIX, seed=1)}
    again = {j.job_id: j.gpu_types for j in assign_gpu_types(reversed(jobs), MIX, seed=1)}
    sampled = {j.job_id: j.gpu_types for j in assign_gpu_types(sample(jobs, 0, 10), MIX, seed=1)}
    other = {j.job_id: j.gpu_types for j in assign_gpu_types(jobs, MIX, seed=2)}
    assert first == again
    assert all(first[k] == v for k, v in sampled.items())
    assert first != other
    counts = Counter(first.values())
    assert counts[(GpuType("V100"),)] == pytest.approx(1200, abs=120)
    assert counts[(GpuType("A100"), GpuType("V100"))] == pytest.approx(200, abs=60)
