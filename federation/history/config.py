"""The `history:` section of the federation config: which database keeps the history, and how long
an ended job stays in etcd before the archiver moves it there.

    history:
      dsn: postgresql://gpufed@db.internal:5432/gpufed   # or dsnEnv: GPUFED_HISTORY_DSN
      retainInEtcd: 1h
      archive: true          # the leader's archiver (federation.scheduling.archiver); false: keep all in etcd
      archiveBatch: 100      # jobs (or audit records) per SQL write and etcd delete
      archiveRatePerS: 200   # at most this many jobs (and as many audit records) a second

Without a DSN the history is SQLite, `history.sqlite3` in the state directory. A DSN that carries a
password belongs in an environment variable (`dsnEnv`), never in the config file, as with object
stores' credentials.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from federation.errors import InvalidArgument, InvalidSpec
from federation.history.engine import default_dsn, parse_dsn
from federation.spec.validate import int_field, number_field

DEFAULT_RETAIN_IN_ETCD_S = 3600.0
DEFAULT_ARCHIVE_BATCH = 100
# About 1.2 jobs a second arrive at 100,000 a day: 200 drains a day's backlog in under ten minutes
# and keeps the archiver's etcd deletes a small share of what etcd takes (about 6,000 writes/s).
DEFAULT_ARCHIVE_RATE_PER_S = 200.0
# One job's deletes are one nested transaction, and one etcd request carries at most 128 of them.
MAX_ARCHIVE_BATCH = 128
_KEYS = ("dsn", "dsnEnv", "retainInEtcd", "archive", "archiveBatch", "archiveRatePerS")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0}


@dataclass(frozen=True, slots=True)
class HistorySettings:
    dsn: str | None = None
    # The name of an environment variable that holds the DSN.
    dsn_env: str | None = None
    retain_in_etcd_s: float = DEFAULT_RETAIN_IN_ETCD_S
    # False: the leader archives nothing and everything stays in etcd, as before the archiver.
    archive: bool = True
    archive_batch: int = DEFAULT_ARCHIVE_BATCH
    archive_rate_per_s: float = DEFAULT_ARCHIVE_RATE_PER_S


def _duration_s(value: Any, field: str) -> float:
    if isinstance(value, str):
        match = _DURATION.match(value.strip())
        if match is None:
            raise InvalidSpec(field, f"must be seconds or a duration like 30m, 1h, 2d, got {value!r}")
        return float(match.group(1)) * _UNIT_S[match.group(2)]
    return number_field(value, field, minimum=0.0)


def _batch(value: Any) -> int:
    batch = int_field(value, "history.archiveBatch", minimum=1)
    if batch > MAX_ARCHIVE_BATCH:
        raise InvalidSpec("history.archiveBatch", f"must be at most {MAX_ARCHIVE_BATCH}, got {batch}")
    return batch


def parse_history(doc: dict[str, Any]) -> HistorySettings:
    section = doc.get("history") or {}
    if not isinstance(section, dict):
        raise InvalidSpec("history", "must be a mapping")
    for key in section:
        if key not in _KEYS:
            raise InvalidSpec(f"history.{key}", f"is not a history setting (known: {', '.join(_KEYS)})")
    dsn, dsn_env = section.get("dsn"), section.get("dsnEnv")
    if dsn is not None and dsn_env is not None:
        raise InvalidSpec("history.dsn", "give dsn or dsnEnv, not both")
    if dsn is not None:
        if not isinstance(dsn, str):
            raise InvalidSpec("history.dsn", "must be a database URL")
        try:
            parse_dsn(dsn)
        except InvalidArgument as error:
            raise InvalidSpec("history.dsn", str(error).removeprefix("history.dsn: ")) from error
        if has_password(dsn):
            raise InvalidSpec(
                "history.dsn", "carries a password; put the DSN in a variable and name it in dsnEnv"
            )
    if dsn_env is not None and (not isinstance(dsn_env, str) or not dsn_env):
        raise InvalidSpec("history.dsnEnv", "must name an environment variable")
    retain = section.get("retainInEtcd", DEFAULT_RETAIN_IN_ETCD_S)
    archive = section.get("archive", True)
    if not isinstance(archive, bool):
        raise InvalidSpec("history.archive", f"must be true or false, got {archive!r}")
    rate = number_field(
        section.get("archiveRatePerS", DEFAULT_ARCHIVE_RATE_PER_S), "history.archiveRatePerS", minimum=0.0
    )
    if rate <= 0:
        raise InvalidSpec(
            "history.archiveRatePerS", "must be above 0 (turn the archiver off with archive: false)"
        )
    return HistorySettings(
        dsn=dsn,
        dsn_env=dsn_env,
        retain_in_etcd_s=_duration_s(retain, "history.retainInEtcd"),
        archive=archive,
        archive_batch=_batch(section.get("archiveBatch", DEFAULT_ARCHIVE_BATCH)),
        archive_rate_per_s=rate,
    )


def has_password(dsn: str) -> bool:
    """Whether the DSN spells out a password."""
    return bool(parse_dsn(dsn).password)


def resolve_dsn(settings: HistorySettings, state_dir: Path) -> str:
    """The DSN to open: the config's, the named variable's, else SQLite under the state directory."""
    if settings.dsn is not None:
        return settings.dsn
    if settings.dsn_env is not None:
        value = os.environ.get(settings.dsn_env)
        if not value:
            raise InvalidSpec("history.dsnEnv", f"names {settings.dsn_env}, which is not set")
        parse_dsn(value)
        return value
    return default_dsn(state_dir)
