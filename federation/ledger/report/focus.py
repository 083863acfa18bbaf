"""The ledger as FOCUS-style cost rows, for finance tools that read FinOps FOCUS exports.

One row per interval and UTC day (charge periods of a day), clipped to the export's period, with the
columns such tools expect: charge period, billed and effective cost, the consumed quantity in
GPU-hours, the list unit price, the provider and region, a SKU-like id (GPU type and capacity kind),
and tags naming the tenant, user, cluster, GPU type and job.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from typing import Any

from federation.ledger.report.columns import Columns, split
from federation.ledger.report.query import Bucket, ReportQuery, bucket_edges, iso_utc
from federation.store.intervals import LedgerInterval

COLUMNS = (
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "BilledCost",
    "EffectiveCost",
    "ListCost",
    "BillingCurrency",
    "ConsumedQuantity",
    "ConsumedUnit",
    "PricingQuantity",
    "PricingUnit",
    "ListUnitPrice",
    "ChargeCategory",
    "ChargeDescription",
    "ResourceType",
    "ResourceId",
    "ProviderName",
    "RegionName",
    "SkuId",
    "ServiceName",
    "SubAccountName",
    "Tags",
)


def focus_rows(intervals: Iterable[LedgerInterval], query: ReportQuery) -> list[dict[str, Any]]:
    """One row per interval and UTC day it held GPUs in, clipped to the query's period and filter.

    Rows come in the order of the intervals' starts (then job and attempt), each interval's days
    in order.
    """
    import numpy as np  # see columns.py's imports

    listed = [iv for iv in intervals if query.tenants is None or iv.tenant in query.tenants]
    listed.sort(key=lambda i: (i.start_s, i.job_id, i.attempt))
    cols = Columns(listed, now_s=query.now_s)
    edges = bucket_edges(query.start_s, query.until_s, Bucket.DAY)
    got = split(cols, np.array(edges), query.start_s, query.until_s)
    days = [iso_utc(e) for e in edges]
    # What does not change from one day of an interval to the next, built once per interval.
    fixed: dict[int, dict[str, Any]] = {}
    rows = []
    for i, bucket, hours, cost in zip(
        got.row.tolist(), got.bucket.tolist(), got.gpu_hours.tolist(), got.cost_usd.tolist(), strict=True
    ):
        same = fixed.get(i)
        if same is None:
            same = fixed[i] = _fixed(listed[i])
        billed, used = round(cost, 6), round(hours, 6)
        row = dict(same)
        row["ChargePeriodStart"] = days[bucket]
        row["ChargePeriodEnd"] = days[bucket + 1]
        row["BilledCost"] = row["EffectiveCost"] = row["ListCost"] = billed
        row["ConsumedQuantity"] = row["PricingQuantity"] = used
        row["Tags"] = dict(same["Tags"])
        rows.append(row)
    return rows


def _fixed(iv: LedgerInterval) -> dict[str, Any]:
    return {
        "ChargePeriodStart": "",
        "ChargePeriodEnd": "",
        "BilledCost": 0.0,
        "EffectiveCost": 0.0,
        "ListCost": 0.0,
        "BillingCurrency": "USD",
        "ConsumedQuantity": 0.0,
        "ConsumedUnit": "GPU-Hours",
        "PricingQuantity": 0.0,
        "PricingUnit": "GPU-Hours",
        "ListUnitPrice": iv.usd_per_gpu_hour,
        "ChargeCategory": "Usage",
        "ChargeDescription": (
            f"{iv.gpu_count} x {iv.gpu_type} ({iv.kind.value}), {iv.job_id} attempt {iv.attempt}"
        ),
        "ResourceType": "GPU",
        "ResourceId": f"{iv.cluster}/{iv.job_id}/a{iv.attempt}",
        "ProviderName": iv.provider,
        "RegionName": iv.region,
        "SkuId": f"{iv.gpu_type}-{iv.kind.value}",
        "ServiceName": "gpufed",
        "SubAccountName": iv.tenant,
        "Tags": {
            "tenant": iv.tenant,
            "user": iv.user,
            "cluster": iv.cluster,
            "gpu_type": iv.gpu_type,
            "job": iv.job_id,
        },
    }


def render_focus_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    plain = COLUMNS[:-1]
    assert COLUMNS[-1] == "Tags"
    for row in rows:
        writer.writerow([*(row[c] for c in plain), json.dumps(row["Tags"], sort_keys=True)])
    return out.getvalue()


def render_focus_json(rows: list[dict[str, Any]]) -> str:
    """A JSON array with one row per line and sorted keys (one line each keeps the C encoder)."""
    if not rows:
        return "[]\n"
    return "[\n" + ",\n".join(json.dumps(r, sort_keys=True) for r in rows) + "\n]\n"
