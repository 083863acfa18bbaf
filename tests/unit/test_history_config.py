"""The `history:` config section: defaults, DSNs from the file or a variable, and clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from federation.errors import InvalidSpec
from federation.history.config import HistorySettings, parse_history, resolve_dsn


def test_without_a_section_the_history_is_sqlite_in_the_state_dir(tmp_path: Path) -> None:
    settings = parse_history({})
    assert settings == HistorySettings()
    assert settings.retain_in_etcd_s == 3600.0
    assert resolve_dsn(settings, tmp_path) == f"sqlite:///{(tmp_path / 'history.sqlite3').resolve()}"


@pytest.mark.parametrize(
    ("retain", "seconds"),
    [
        pytest.param("30m", 1800.0, id="minutes"),
        pytest.param("2d", 172_800.0, id="days"),
        pytest.param(90, 90.0, id="seconds"),
    ],
)
def test_retain_in_etcd_reads_durations(retain: Any, seconds: float) -> None:
    assert parse_history({"history": {"retainInEtcd": retain}}).retain_in_etcd_s == seconds


def test_a_dsn_from_a_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = parse_history({"history": {"dsnEnv": "GPUFED_TEST_HISTORY_DSN"}})
    monkeypatch.setenv("GPUFED_TEST_HISTORY_DSN", "postgresql://gpufed:secret@db:5432/gpufed")
    assert resolve_dsn(settings, tmp_path) == "postgresql://gpufed:secret@db:5432/gpufed"
    monkeypatch.delenv("GPUFED_TEST_HISTORY_DSN")
    with pytest.raises(InvalidSpec, match="GPUFED_TEST_HISTORY_DSN, which is not set"):
        resolve_dsn(settings, tmp_path)


@pytest.mark.parametrize(
    ("section", "names"),
    [
        pytest.param({"dsn": "mysql://db/x"}, "history.dsn: backend 'mysql' is not supported", id="backend"),
        pytest.param({"dsn": "postgresql://u:pw@db/x"}, "history.dsn: carries a password", id="password"),
        pytest.param({"dsn": "sqlite:///a", "dsnEnv": "X"}, "not both", id="both"),
        pytest.param(
            {"retainInEtcd": "soon"}, "history.retainInEtcd: must be seconds or a duration", id="duration"
        ),
        pytest.param({"retainInEtcd": -1}, "history.retainInEtcd", id="negative"),
        pytest.param({"dns": "sqlite:///a"}, "history.dns: is not a history setting", id="typo"),
    ],
)
def test_bad_settings_name_the_field(section: dict[str, Any], names: str) -> None:
    with pytest.raises(InvalidSpec, match=names):
        parse_history({"history": section})
