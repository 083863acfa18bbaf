"""The replay's one exception root: every error it raises is about its inputs, so none is retryable."""

from __future__ import annotations

from federation.errors import GpufedError


class ReplayError(GpufedError):
    """A config, trace or price file the replay cannot use; the message names the file and field."""

    retryable = False
