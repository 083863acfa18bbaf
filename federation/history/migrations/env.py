"""Alembic's entry point: migrate the connection `federation.history.engine.migrate` hands over.

No alembic.ini and no URL here: the caller owns the engine (with its SQLite pragmas or its
PostgreSQL DSN), so migrations run on exactly the connection the store will use.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from federation.history.schema import metadata


def _run(connection: Connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things in place; batch mode copies the table.
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


_connection = context.config.attributes.get("connection")
if not isinstance(_connection, Connection):
    raise RuntimeError("history migrations run only through federation.history.engine.migrate")
_run(_connection)
