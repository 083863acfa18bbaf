"""Opening the history database from a DSN, and migrating it.

Two backends, one schema: `sqlite:///<path>` (the embedded default, a file under the state
directory) and `postgresql://...` (production; psycopg 3). SQLite runs in WAL mode so that readers
(reports, `gpufed get`) never wait for the archiver's write transaction, with `synchronous=NORMAL`,
which in WAL mode loses at most the last transactions on power loss and never corrupts: the archiver
deletes from etcd only after its SQL commit returned, and re-archiving is idempotent.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import event, text
from sqlalchemy.engine import Engine, create_engine
from sqlalchemy.engine.url import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

if TYPE_CHECKING:
    from alembic.config import Config

from federation.errors import InvalidArgument

HEAD = "head"
# The newest migration's revision under migrations/versions. A database already there is opened
# without Alembic, whose import and script directory scan cost every restart about half a second of
# CPU for nothing (tests/unit/test_history_migrations.py checks this against Alembic's own head).
NEWEST_REVISION = "0007"
DEFAULT_FILE = "history.sqlite3"
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# How long a SQLite writer waits for another's lock before failing, rather than failing at once.
_SQLITE_BUSY_TIMEOUT_MS = 10_000
# PostgreSQL advisory lock taken while migrating (any 64-bit number no other user of the database
# takes: "gpufed" in ASCII).
_MIGRATION_LOCK_KEY = 0x677066656400


def default_dsn(state_dir: Path) -> str:
    return f"sqlite:///{(Path(state_dir) / DEFAULT_FILE).resolve()}"


def parse_dsn(dsn: str) -> URL:
    """The DSN as SQLAlchemy reads it, with PostgreSQL pinned to psycopg 3. Raises InvalidArgument."""
    try:
        url = make_url(dsn)
    except ArgumentError as error:
        raise InvalidArgument(f"history.dsn: not a database URL ({dsn!r})") from error
    backend = url.get_backend_name()
    if backend == "sqlite":
        if url.drivername != "sqlite":
            raise InvalidArgument(f"history.dsn: use plain sqlite:///<path>, not {url.drivername}")
        return url
    if backend in ("postgresql", "postgres"):
        if url.drivername not in ("postgresql", "postgres", "postgresql+psycopg"):
            raise InvalidArgument(
                f"history.dsn: PostgreSQL goes through psycopg 3; use postgresql://, not {url.drivername}"
            )
        return url.set(drivername="postgresql+psycopg")
    raise InvalidArgument(f"history.dsn: backend {backend!r} is not supported (sqlite or postgresql)")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={_SQLITE_BUSY_TIMEOUT_MS}")
    cursor.close()


def open_engine(dsn: str) -> Engine:
    """An engine for the DSN (the database must exist; a SQLite file is created with its directory)."""
    url = parse_dsn(dsn)
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # pool_pre_ping: a PostgreSQL restarted under a long-lived leader would otherwise hand out dead
    # connections once each.
    return create_engine(url, pool_pre_ping=True)


def _alembic_config(engine: Engine) -> Config:
    from alembic.config import Config  # only when migrating: see NEWEST_REVISION

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.set_main_option("path_separator", "os")
    return config


def migrate(engine: Engine, revision: str = HEAD) -> None:
    """Bring the schema to `revision` (default: the newest), in one transaction per revision."""
    from alembic import command  # only when migrating: see NEWEST_REVISION

    config = _alembic_config(engine)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # Servers sharing one PostgreSQL (replicas of a Deployment, started together) migrate
            # one at a time: two at once both created the version table, and the second died on a
            # unique violation. The lock is the transaction's, so it goes with a server that dies;
            # the next finds the schema where the first left it and has nothing to do.
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> list[str]:
    """Take the schema back to `revision` (an earlier one), for a rollback to the release whose
    newest revision it is: the revisions undone, newest first. Each revision's `downgrade` drops
    what it added, with what it held. Refuses a revision this build does not know, or one that is
    not earlier than the database's (InvalidArgument, naming the known ones)."""
    from alembic import command  # only when migrating: see NEWEST_REVISION
    from alembic.script import ScriptDirectory

    config = _alembic_config(engine)
    script = ScriptDirectory.from_config(config)
    known = [r.revision for r in reversed(list(script.walk_revisions()))]
    if revision not in known:
        raise InvalidArgument(f"--to: no history revision {revision!r}; this build knows {', '.join(known)}")
    current = current_revision(engine)
    if current is None or known.index(revision) >= known.index(current):
        raise InvalidArgument(
            f"--to: the database is at revision {current or 'none'}: {revision!r} is not earlier than it"
        )
    undone = known[known.index(revision) + 1 : known.index(current) + 1][::-1]
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
        config.attributes["connection"] = connection
        command.downgrade(config, revision)
    return undone


def at_newest_revision(engine: Engine) -> bool:
    """Whether the schema is at NEWEST_REVISION, read without Alembic (its version table holds one
    row on a linear history; a missing table is a database never migrated)."""
    try:
        with engine.connect() as connection:
            rows = connection.execute(text("SELECT version_num FROM alembic_version")).all()
    except DBAPIError:
        return False
    return [row[0] for row in rows] == [NEWEST_REVISION]


def migrate_if_behind(engine: Engine) -> None:
    """`migrate` to the newest revision unless the schema is there already."""
    if not at_newest_revision(engine):
        migrate(engine)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext  # see NEWEST_REVISION

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
