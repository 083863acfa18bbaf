"""The console's usage-by-set table and the CLI's `--by set` (issue 34), without a server: the page
from the API's JSON as the report code renders it, and the CLI's grouping check.

The end-to-end test (`tests/e2e/test_report_by_set.py`) reads the same page and its CSV as finance
and as a member of a real server; here, what the table says of its rows."""

from __future__ import annotations

import json
import re
from dataclasses import replace

from click.testing import CliRunner

from federation.cli.main import cli
from federation.console.finance import USAGE_GROUPINGS, period_bounds, render_finance, report_from_json
from federation.ledger.report import Dim, ReportQuery, compute_report, render_json
from placement.model import JobId
from tests.unit.test_console_pages_finance import EVIL, INTERVALS, NOW, TENANTS, VIEW, api_json

START, END, WORDS = period_bounds("month", NOW)
IN_SETS = [
    replace(INTERVALS[0], job_set="lr", set_kind="sweep"),
    replace(INTERVALS[1], job_set="lr", set_kind="array"),
    replace(INTERVALS[2], job_set=EVIL, set_kind="set"),
    replace(INTERVALS[0], job_id=JobId("alone"), attempt=2),
]


def _by_set_rows() -> list[dict[str, object]]:
    query = ReportQuery(start_s=START, end_s=END, now_s=NOW, group_by=(Dim.SET,))
    rows: list[dict[str, object]] = json.loads(render_json(compute_report(IN_SETS, TENANTS, query)))["rows"]
    return rows


def _page() -> str:
    fv = report_from_json(api_json(), start_s=START, end_s=END, now_s=NOW, period="month", words=WORDS)
    return render_finance(fv, VIEW, by_set=_by_set_rows())


def test_the_table_has_a_row_per_tenant_and_set_with_its_hours_and_cost() -> None:
    page = _page()
    table = page[page.index('id="usage-sets"') :]
    # vision's and nlp's `lr` are two rows; vision's job alone is under "-".
    vision_lr = re.search(r'<tr data-tenant="vision" data-set="lr">(.*?)</tr>', table)
    nlp_lr = re.search(r'<tr data-tenant="nlp" data-set="lr">(.*?)</tr>', table)
    assert vision_lr is not None
    assert nlp_lr is not None
    # 8 GPUs x 1 h at $2, and 16 GPUs x 2 h at $1.
    assert '<td class="num gpu-hours">8.00</td>' in vision_lr.group(1)
    assert '<td class="num cost">$16.00</td>' in vision_lr.group(1)
    assert '<td class="num gpu-hours">32.00</td>' in nlp_lr.group(1)
    assert '<tr data-tenant="vision" data-set="-">' in table
    assert 'href="/finance.csv?period=month&amp;by=set"' in page


def test_a_set_name_is_escaped() -> None:
    page = _page()
    assert EVIL not in page
    assert "&lt;b onclick=&quot;x&quot;&gt;" in page[page.index('id="usage-sets"') :]


def test_the_page_without_the_by_set_rows_has_no_table() -> None:
    fv = report_from_json(api_json(), start_s=START, end_s=END, now_s=NOW, period="month", words=WORDS)
    assert 'id="usage-sets"' not in render_finance(fv, VIEW)


def test_the_csv_groupings_are_by_tenant_and_day_by_set_and_by_sweep() -> None:
    assert USAGE_GROUPINGS == {
        "tenant": (("tenant",), "day"),
        "set": (("set",), ""),
        "sweep": (("sweep",), ""),
    }


def test_the_cli_accepts_set_and_sweep_and_names_them_for_an_unknown_grouping() -> None:
    bad = CliRunner().invoke(cli, ["--server", "127.0.0.1:1", "report", "--by", "tenant,pipeline"])
    assert bad.exit_code == 2
    assert "unknown grouping pipeline" in bad.output
    assert "set, sweep" in bad.output
    # A known grouping gets past the check and on to the (absent) server.
    done = CliRunner().invoke(
        cli, ["--server", "127.0.0.1:1", "--timeout", "1", "report", "--by", "set,gpu_type"]
    )
    assert "unknown grouping" not in done.output
    assert "--by" not in done.output
