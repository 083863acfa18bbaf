"""Alembic migrations of the history store; run them with `federation.history.engine.migrate`."""
