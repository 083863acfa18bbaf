"""The one exception tree of datasync: every error that leaves the package is a `DatasyncError`.

Each class says whether retrying can help (`retryable`): the sync engine retries those with backoff and
gives up at once on the others; federation maps them to a failed or requeued job by the same flag.

    DatasyncError
    ├── StoreUnavailable        retryable: timeouts, 5xx, connection refused, throttling
    ├── ObjectNotFound          permanent
    ├── AccessDenied            permanent: bad or missing credentials, forbidden
    ├── StoreConfigError        permanent: a store configuration that cannot work
    ├── SourceChanged           permanent: the source no longer matches the manifest
    ├── VerificationFailed      retryable: the target's bytes differ from the manifest (re-copy)
    └── SyncFailed              the sync ended with objects that could not be copied (retryable if any was)
"""

from __future__ import annotations

from collections.abc import Sequence


class DatasyncError(Exception):
    """Root of every datasync error."""

    retryable: bool = False


class StoreUnavailable(DatasyncError):
    retryable = True


class ObjectNotFound(DatasyncError):
    retryable = False


class AccessDenied(DatasyncError):
    retryable = False


class StoreConfigError(DatasyncError):
    retryable = False


class SourceChanged(DatasyncError):
    """The bytes read from the source do not hash to the manifest's sha256: the version was modified."""

    retryable = False


class VerificationFailed(DatasyncError):
    retryable = True


class SyncFailed(DatasyncError):
    """Raised at the end of a sync that could not copy every object; `failures` maps path -> reason."""

    def __init__(self, failures: Sequence[tuple[str, DatasyncError]]) -> None:
        # The SyncReport of the run, when it got that far (set by run_sync).
        self.report: object | None = None
        self.failures = tuple(failures)
        self.retryable = all(e.retryable for _, e in failures)
        shown = "; ".join(f"{p}: {e}" for p, e in self.failures[:5])
        more = f" (and {len(self.failures) - 5} more)" if len(self.failures) > 5 else ""
        super().__init__(f"{len(self.failures)} object(s) failed to sync: {shown}{more}")
