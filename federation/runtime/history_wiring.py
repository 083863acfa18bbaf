"""Opening the server's history store from the config: one place that decides which database.

`gpufed up` keeps its history in SQLite under its state directory; `gpufed serve` opens what the
config's `history.dsn` (or the variable `history.dsnEnv` names) says, else SQLite under its state
directory too. Migrations run at open, so a new server version brings the schema up on its first
start. Blocking (it may create tables): call it on a worker thread from the event loop.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine.url import URL, make_url

from federation.history.config import HistorySettings, resolve_dsn
from federation.history.sql_store import SqlHistoryStore
from federation.runtime.config import FederationConfig


def open_history(config: FederationConfig | HistorySettings, state_dir: Path) -> SqlHistoryStore:
    settings = config.history if isinstance(config, FederationConfig) else config
    return SqlHistoryStore.open(resolve_dsn(settings, state_dir))


def history_shown(settings: HistorySettings, state_dir: Path) -> str:
    """Which history store the server uses, for its startup log: the DSN without its password or
    query (which may carry one too), so an operator sees which database it is and nothing secret."""
    url = make_url(resolve_dsn(settings, state_dir))
    # Built anew: `URL.set(password=None)` keeps the password (None there means "unchanged").
    shown = URL.create(url.drivername, url.username, None, url.host, url.port, url.database)
    return shown.render_as_string(hide_password=False)
