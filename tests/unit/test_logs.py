"""The server's log lines (`federation.logs`): the same bytes as structlog's stock JSON renderer and
`PrintLogger` wrote, each line whole, with every field (operators and tests read them)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from federation.logs import LineLogger, _dumps, configure_logging


class _Own:
    def __structlog__(self) -> str:
        return "own form"


@pytest.fixture
def restored() -> Iterator[None]:
    saved = structlog.get_config()
    try:
        yield
    finally:
        structlog.contextvars.clear_contextvars()
        structlog.configure(**saved)


def test_a_rendered_line_is_what_structlogs_json_renderer_writes() -> None:
    event = {
        "job_id": "train-1a2b3c4d",
        "tenant": "t1",
        "user": 'ünïcode "quoted"\n',
        "path": Path("/var/lib/gpufed"),
        "own": _Own(),
        "figures": [1, 2.5, None, True],
        "event": "job_submitted",
        "level": "info",
    }
    stock = structlog.processors.JSONRenderer()(None, "info", dict(event))
    assert _dumps(dict(event)) == stock
    assert json.loads(stock)["own"] == "own form"


def test_a_line_is_written_whole_and_flushed_as_print_did() -> None:
    ours, stock = io.StringIO(), io.StringIO()
    for logger in (LineLogger(ours), structlog.PrintLogger(stock)):
        logger.info('{"event": "a"}')
        logger.error("second")
    assert ours.getvalue() == stock.getvalue() == '{"event": "a"}\nsecond\n'


def test_job_submitted_keeps_its_fields_and_the_workers_context(
    restored: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    configure_logging(json=True)
    structlog.contextvars.bind_contextvars(api_worker="api-1")
    log = structlog.get_logger("federation.api.service")
    log.info("job_submitted", job_id="train-1a2b3c4d", tenant="t1", user="alice")
    log.debug("not at info")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed", job_id="x")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert {k: first[k] for k in ("event", "job_id", "tenant", "user", "level", "api_worker")} == {
        "event": "job_submitted",
        "job_id": "train-1a2b3c4d",
        "tenant": "t1",
        "user": "alice",
        "level": "info",
        "api_worker": "api-1",
    }
    assert first["timestamp"].endswith("Z")
    assert second["event"] == "failed"
    assert second["level"] == "error"
    assert "ValueError: boom" in second["exception"]
