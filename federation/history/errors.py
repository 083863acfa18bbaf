"""The history store's errors, under federation's one tree (`federation.errors`)."""

from __future__ import annotations

from federation.errors import StoreUnavailable


class HistoryUnavailable(StoreUnavailable):
    """The history database did not answer or refused the connection. Retryable: nothing was
    half-written (every write is one transaction), and writes are idempotent."""

    public_message = (
        "the history database is unavailable; retry shortly (jobs not yet archived still answer; "
        "the server's log says why)"
    )
