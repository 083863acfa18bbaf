"""`gpufed admin history-downgrade`: the schema back to an earlier revision for a rollback, what each
later revision added dropped, and bad revisions refused with the known ones named."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from federation.errors import InvalidArgument
from federation.history.engine import NEWEST_REVISION, current_revision, downgrade, migrate, open_engine


def test_a_downgrade_undoes_the_later_revisions_newest_first_and_an_upgrade_redoes_them(
    tmp_path: Path,
) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'history.db'}")
    try:
        migrate(engine)
        assert current_revision(engine) == NEWEST_REVISION
        assert "job_set" in {c["name"] for c in inspect(engine).get_columns("history_intervals")}
        assert downgrade(engine, "0005") == ["0007", "0006"]
        assert current_revision(engine) == "0005"
        assert "job_set" not in {c["name"] for c in inspect(engine).get_columns("history_intervals")}
        assert "job_set" not in {c["name"] for c in inspect(engine).get_columns("history_usage_days")}
        migrate(engine)
        assert current_revision(engine) == NEWEST_REVISION
    finally:
        engine.dispose()


def test_an_unknown_or_not_earlier_revision_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    engine = open_engine(f"sqlite:///{tmp_path / 'history.db'}")
    try:
        migrate(engine)
        with pytest.raises(
            InvalidArgument, match=r"--to: no history revision '9'; this build knows 0001, .*0007"
        ):
            downgrade(engine, "9")
        with pytest.raises(
            InvalidArgument, match=rf"at revision {NEWEST_REVISION}: '{NEWEST_REVISION}' is not earlier"
        ):
            downgrade(engine, NEWEST_REVISION)
        assert current_revision(engine) == NEWEST_REVISION
    finally:
        engine.dispose()
