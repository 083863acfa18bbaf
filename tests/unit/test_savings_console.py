"""The console's finance page shows the savings report (issue 35) and cost by job set (issue 34) from
the API's JSON, computed here by the report code itself (no server)."""

from __future__ import annotations

import json
import re

from federation.console.finance import SavingsView, period_bounds, render_finance, report_from_json
from federation.ledger.report.savings import SavingsDim, SavingsQuery, compute_savings
from federation.ledger.report.savings_render import render_savings_json
from placement.model import CapacityKind
from tests.unit.test_console_pages_finance import EVIL, NOW, VIEW, api_json
from tests.unit.test_savings import attempt, offer

H = 3600.0
START, END, WORDS = period_bounds("month", NOW)
ATTEMPTS = [
    attempt("w", start_s=NOW - 5 * H, hours=3, burst=offer(4.0, NOW - 6 * H), job_set="lr", set_kind="sweep"),
    attempt(
        "d",
        start_s=NOW - 5 * H,
        hours=1,
        kind=CapacityKind.ON_DEMAND,
        price=9.0,
        burst=offer(4.0, NOW - 5 * H),
    ),
    attempt("x", start_s=NOW - 5 * H, hours=1, job_set=EVIL, set_kind="set"),
]


def _json(*dims: SavingsDim) -> dict[str, object]:
    q = SavingsQuery(start_s=START, end_s=END, now_s=NOW, group_by=dims)
    loaded: dict[str, object] = json.loads(render_savings_json(compute_savings(ATTEMPTS, q)))
    return loaded


def _page() -> str:
    fv = report_from_json(api_json(), start_s=START, end_s=END, now_s=NOW, period="month", words=WORDS)
    savings = SavingsView(by_type=_json(SavingsDim.TENANT, SavingsDim.GPU_TYPE), by_set=_json(SavingsDim.SET))
    return render_finance(fv, VIEW, savings)


def test_the_page_says_what_waiting_saved_and_what_it_cost_in_time() -> None:
    page = _page()
    # 2 GPUs x 3 h at $4 (private, waited 1 h) + 2 GPUs x 1 h at $4 against $9 paid: 24 + 8 - 18.
    assert re.search(r'id="savings-paid">\$18\.00<', page)
    assert re.search(r'id="savings-burst">\$32\.00<', page)
    assert re.search(r'id="savings-saved">\$14\.00<', page)
    assert re.search(r'id="savings-extra-wait">1\.00<', page)
    row = re.search(r'<tr data-tenant="vision" data-gpu-type="A100">(.*?)</tr>', page)
    assert row is not None
    assert '<td class="num no-offer">1</td>' in row.group(1)
    assert 'href="/finance-savings.csv?period=month&amp;by=tenant%2Cgpu_type"' in page


def test_by_set_rows_name_each_set_escaped_and_lone_jobs_as_a_dash() -> None:
    page = _page()
    sets = page[page.index('id="finance-sets"') :]
    assert '<tr data-tenant="vision" data-set="lr">' in sets
    assert '<tr data-tenant="vision" data-set="-">' in sets
    assert EVIL not in page
    assert "&lt;b onclick=&quot;x&quot;&gt;" in sets


def test_a_negative_saving_is_marked() -> None:
    fv = report_from_json(api_json(), start_s=START, end_s=END, now_s=NOW, period="month", words=WORDS)

    def dear(*dims: SavingsDim) -> dict[str, object]:
        q = SavingsQuery(start_s=START, end_s=END, now_s=NOW, group_by=dims)
        loaded: dict[str, object] = json.loads(render_savings_json(compute_savings(ATTEMPTS[1:2], q)))
        return loaded

    savings = SavingsView(by_type=dear(SavingsDim.TENANT, SavingsDim.GPU_TYPE), by_set=dear(SavingsDim.SET))
    page = render_finance(fv, VIEW, savings)
    assert 'id="savings-saved">-$10.00<' in page
    assert '<td class="num saved negative">-$10.00</td>' in page
