"""Cloud GPU prices from a price table (the columns of `shared/data/prices/gpu_prices.csv`).

A row prices one instance type (all its GPUs) in one region, on demand and, where offered, spot.
Some snapshots carry placeholder prices (for example exactly 700.0 for both): such a row is not a
price, so the reader rejects it and says so, rather than letting a replay buy at a made-up rate.
Rows with a missing or non-positive price for a kind simply do not offer that kind.

The price of a GPU type in a region is the cheapest per-GPU price among the instance types that
carry that accelerator there: a control plane buying capacity picks the cheapest shape that fits.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from federation.replay.errors import ReplayError

COLUMNS = ("cloud", "region", "instance_type", "accelerator", "accel_count", "ondemand_usd_hr", "spot_usd_hr")

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PriceRow:
    cloud: str
    region: str
    instance_type: str
    accelerator: str
    accel_count: float
    ondemand_usd_per_hour: float | None
    spot_usd_per_hour: float | None

    def per_gpu(self, spot: bool) -> float | None:
        price = self.spot_usd_per_hour if spot else self.ondemand_usd_per_hour
        return None if price is None else price / self.accel_count


@dataclass(frozen=True, slots=True)
class PriceTable:
    rows: tuple[PriceRow, ...]
    # Rows refused, with why: "file:line: reason".
    rejected: tuple[str, ...]

    def gpu_price(self, cloud: str, region: str, accelerator: str, *, spot: bool) -> PriceRow | None:
        """The row with the cheapest per-GPU price for this accelerator in the region (None: no offer)."""
        best: tuple[float, str, PriceRow] | None = None
        for row in self.rows:
            if (row.cloud.lower(), row.region, row.accelerator) != (cloud.lower(), region, accelerator):
                continue
            price = row.per_gpu(spot)
            if price is not None and (best is None or (price, row.instance_type) < best[:2]):
                best = (price, row.instance_type, row)
        return None if best is None else best[2]


def _price(text: str) -> float | None:
    text = text.strip()
    if not text:
        return None
    value = float(text)
    return value if math.isfinite(value) and value > 0 else None


def parse_prices(
    lines: Iterable[str], placeholders: Sequence[float] = (700.0,), name: str = "prices"
) -> PriceTable:
    reader = csv.DictReader(lines)
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise ReplayError(f"{name}: missing columns {', '.join(missing)}")
    rows: list[PriceRow] = []
    rejected: list[str] = []
    for line, raw in enumerate(reader, start=2):
        try:
            ondemand, spot = _price(raw["ondemand_usd_hr"]), _price(raw["spot_usd_hr"])
            count = float(raw["accel_count"])
        except (TypeError, ValueError):
            rejected.append(f"{name}:{line}: unreadable price or accelerator count")
            continue
        if count <= 0 or not math.isfinite(count):
            rejected.append(f"{name}:{line}: accelerator count must be positive")
            continue
        if any(p in placeholders for p in (ondemand, spot) if p is not None):
            rejected.append(f"{name}:{line}: placeholder price ({ondemand}, {spot})")
            continue
        rows.append(
            PriceRow(
                raw["cloud"],
                raw["region"],
                raw["instance_type"],
                raw["accelerator"],
                count,
                ondemand,
                spot,
            )
        )
    for reason in rejected:
        log.warning("price_row_rejected", reason=reason)
    return PriceTable(tuple(rows), tuple(rejected))


def read_prices(path: Path, placeholders: Sequence[float] = (700.0,)) -> PriceTable:
    """A price table from a CSV in the shared columns; placeholder rows are rejected and listed."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            return parse_prices(handle, placeholders, str(path))
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise ReplayError(f"{path}: cannot read prices: {error}") from error
