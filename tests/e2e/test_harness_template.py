"""The e2e harness's migrated history template (`seed_history`) outlives a cleaned temporary
directory: it sits in the shared /tmp, where a script clearing /tmp/gpufed-history-template-* before
its own run removed it under a running suite, and every server a worker started after that failed
its setup."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from federation.history.engine import DEFAULT_FILE
from tests.e2e import harness

pytestmark = pytest.mark.e2e


def test_a_template_removed_under_the_worker_is_made_again(tmp_path: Path) -> None:
    shutil.rmtree(harness._migrated_history().parent)
    harness.seed_history(tmp_path)
    assert (tmp_path / DEFAULT_FILE).stat().st_size > 0
    assert harness._migrated_history().exists()
