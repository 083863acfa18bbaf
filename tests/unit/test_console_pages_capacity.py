"""The capacity page and its plans' timeline from API replies built by hand (no server)."""

from __future__ import annotations

import re

from federation.api import convert
from federation.api.v1 import gpufed_pb2 as pb
from federation.console.capacity import render_capacity, shown_plans, timeline

NOW = 1_800_000_000.0
H = 3600.0
EVIL = "</svg><script>alert(1)</script>"


def plan(plan_id: str, state: str, start_s: float, end_s: float, **kw: object) -> pb.CapacityPlan:
    return pb.CapacityPlan(
        plan_id=plan_id,
        kind="fixed",
        cluster="aws",
        gpu_type="H100",
        gpus=16,
        state=state,
        start=convert.timestamp(start_s),
        end=convert.timestamp(end_s),
        **kw,  # type: ignore[arg-type]
    )


PLANS = [
    plan("plan-active", "active", NOW - 10 * H, NOW + 10 * H, gpus_now=16, usd_per_hour=110.08),
    plan("plan-later", "scheduled", NOW + 48 * H, NOW + 96 * H, reason=EVIL),
    plan("plan-old", "ended", NOW - 30 * 24 * H, NOW - 20 * 24 * H),
    pb.CapacityPlan(
        plan_id="plan-deadline",
        kind="deadline",
        cluster="aws",
        gpu_type="A100",
        job_ids=["a-1", "b-2"],
        state="provisioning",
        created_at=convert.timestamp(NOW - H),
        end=convert.timestamp(NOW + 24 * H),
    ),
]

POOLS = pb.ListCapacityPoolsResponse(
    provisioner="simulated",
    lead_time_seconds=10,
    idle_ttl_seconds=60,
    spend_ceiling_usd_per_hour=1000,
    usd_per_hour=250,
    pools=[
        pb.CapacityPool(
            cluster="aws", pool="h100-od", gpu_type="H100", capacity_kind="on_demand", gpus_per_node=8,
            usd_per_gpu_hour=6.88, nodes=4, ready_nodes=3, busy_nodes=2, min_nodes=2, max_nodes=16,
            usd_per_hour=220.16,
            pending=pb.PendingPoolChange(
                nodes_from=2, nodes_to=4, reason="gang", job_ids=["pretrain-1"], plan_ids=["plan-active"],
                started_at=convert.timestamp(NOW - 60), ready_at=convert.timestamp(NOW + 60),
            ),
        ),
        pb.CapacityPool(
            cluster="aws", pool="a100-spot", gpu_type="A100", capacity_kind="spot", gpus_per_node=8,
            nodes=2, ready_nodes=2, min_nodes=2, max_nodes=16,
            pending=pb.PendingPoolChange(nodes_from=2, nodes_to=6, attempts=3, last_error=EVIL),
        ),
    ],
)  # fmt: skip


def _bar(svg: str, plan_id: str) -> tuple[float, float]:
    found = re.search(
        rf'<g class="plan" data-plan-id="{plan_id}"[^>]*>.*?<rect class="plan-bar[^"]*" x="([\d.]+)" y="[\d.]+" '
        r'width="([\d.]+)"',
        svg,
    )
    assert found, plan_id
    return float(found.group(1)), float(found.group(2))


def test_timeline_has_a_bar_per_plan_from_start_to_end_and_marks_now() -> None:
    spans = shown_plans(PLANS, NOW)
    # A plan that ended weeks ago is left off.
    assert [s.plan.plan_id for s in spans] == ["plan-active", "plan-later", "plan-deadline"]
    svg = timeline(spans, NOW)
    now = re.search(r'<line id="timeline-now" class="now" x1="([\d.]+)"', svg)
    assert now
    now_x = float(now.group(1))
    x, w = _bar(svg, "plan-active")
    # Started ten hours ago and ends in ten: now is in its middle.
    assert abs((x + w / 2) - now_x) < 1.0
    later_x, later_w = _bar(svg, "plan-later")
    assert later_x > now_x
    # 48 hours long against the active plan's 20: the same scale.
    assert abs(later_w - 2.4 * w) < 1.5
    # A deadline plan runs from its creation to its deadline.
    dx, _ = _bar(svg, "plan-deadline")
    assert dx < now_x
    assert 'data-state="provisioning"' in svg


def test_page_shows_pools_operations_and_plans_escaped() -> None:
    html = render_capacity(POOLS, PLANS, NOW)
    assert '<ul id="operations">' in html
    assert re.search(r'<li data-cluster="aws" data-pool="h100-od">.*?2 → 4 nodes.*?pretrain-1', html)
    assert re.search(r'<li data-cluster="aws" data-pool="a100-spot" class="failing">.*?FAILED x3', html)
    assert re.search(r'<table id="plans".*plan-later.*</table>', html)
    assert "plan-old" not in html
    assert EVIL not in html
    assert "&lt;/svg&gt;&lt;script&gt;" in html
    assert "<script" not in html
    assert "style=" not in html
    assert "$250.00/h (ceiling $1,000.00/h)" in html


def test_no_plans_and_no_operations_say_so() -> None:
    html = render_capacity(pb.ListCapacityPoolsResponse(provisioner="simulated"), [], NOW)
    assert 'id="no-plans"' in html
    assert 'id="no-operations"' in html
    assert 'id="timeline-now"' in html


def test_an_operation_names_each_job_once() -> None:
    from federation.console.capacity import _pending_text

    named = pb.PendingPoolChange(nodes_from=2, nodes_to=6, reason="4 node(s) for big-1", job_ids=["big-1"])
    assert _pending_text(named).count("big-1") == 1
    unnamed = pb.PendingPoolChange(
        nodes_from=2, nodes_to=3, reason="deadline", job_ids=["big-2"], plan_ids=["p-1"]
    )
    text = _pending_text(unnamed)
    assert "for big-2" in text
    assert "plans p-1" in text
