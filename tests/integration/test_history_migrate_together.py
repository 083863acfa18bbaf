"""Servers that start at once on one PostgreSQL (the replicas of a Deployment) migrate its history
schema one at a time: without the migration lock, two of them both created Alembic's version table
and the second died on a unique violation (seen in the history soak once its second server started
a second after the first). Processes, not threads: Alembic's context is one per process."""

from __future__ import annotations

import subprocess
import sys

import pytest
from sqlalchemy import text

from federation.history.engine import NEWEST_REVISION, open_engine
from federation.runtime.postgres_process import PostgresProcess

pytestmark = pytest.mark.integration

SERVERS = 3
ROUNDS = 3
# Each process imports everything first, then migrates each database named on its input the moment
# the line arrives: the test sends each new database to all of them at once.
MIGRATOR = """
import sys
from federation.history.engine import migrate, open_engine
import alembic.command
print("ready", flush=True)
for line in sys.stdin:
    engine = open_engine(line.strip())
    migrate(engine)
    engine.dispose()
    print("migrated", flush=True)
"""


def test_servers_migrating_one_new_database_at_once_all_succeed(postgres_process: PostgresProcess) -> None:
    migrators = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATOR],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(SERVERS)
    ]
    try:
        for migrator in migrators:
            assert migrator.stdout is not None
            assert migrator.stdout.readline().strip() == "ready"
        for round_ in range(ROUNDS):
            dsn = postgres_process.create_database(f"migrate_together_{round_}")
            for migrator in migrators:  # the starting gun, as close together as pipes allow
                assert migrator.stdin is not None
                migrator.stdin.write(dsn + "\n")
                migrator.stdin.flush()
            for migrator in migrators:
                assert migrator.stdout is not None
                answer = migrator.stdout.readline().strip()
                if answer != "migrated":
                    migrator.kill()
                    _, err = migrator.communicate(timeout=30)
                    raise AssertionError(f"round {round_}: a server failed to migrate: {err[-3000:]}")
            engine = open_engine(dsn)
            with engine.connect() as connection:
                versions = [
                    row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))
                ]
            engine.dispose()
            assert versions == [NEWEST_REVISION]
    finally:
        for migrator in migrators:
            migrator.kill()
            migrator.communicate(timeout=30)
