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

from federation.ledger import LedgerInterval
from federation.report.compute import pieces
from federation.report.query import Bucket, ReportQuery, iso_utc

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
    q_end = min(query.end_s, max(query.now_s, query.start_s))
    rows = []
    for iv in sorted(intervals, key=lambda i: (i.start_s, i.job_id, i.attempt)):
        if query.tenants is not None and iv.tenant not in query.tenants:
            continue
        end = query.now_s if iv.end_s is None else min(iv.end_s, query.now_s)
        start, end = max(iv.start_s, query.start_s), min(end, q_end)
        for day, a, b in pieces(start, end, Bucket.DAY) if end > start else ():
            hours = iv.gpu_count * (b - a) / 3600.0
            cost = hours * iv.usd_per_gpu_hour
            rows.append(
                {
                    "ChargePeriodStart": iso_utc(day),
                    "ChargePeriodEnd": iso_utc(day + 86400.0),
                    "BilledCost": round(cost, 6),
                    "EffectiveCost": round(cost, 6),
                    "ListCost": round(cost, 6),
                    "BillingCurrency": "USD",
                    "ConsumedQuantity": round(hours, 6),
                    "ConsumedUnit": "GPU-Hours",
                    "PricingQuantity": round(hours, 6),
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
            )
    return rows


def render_focus_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    tags = COLUMNS.index("Tags")
    for row in rows:
        cells = [row[c] for c in COLUMNS]
        cells[tags] = json.dumps(cells[tags], sort_keys=True)
        writer.writerow(cells)
    return out.getvalue()


def render_focus_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, indent=1, sort_keys=True) + "\n"
