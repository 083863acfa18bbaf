"""How many examples each property test draws: all of them in `make test`, a quarter in `make check`.

`make check` is the inner loop (docs/testing.md, "Tiers"): it sets `GPUFED_TEST_TIER=check`, and the
property tests draw a quarter of their examples (at least 10), as Hypothesis's own docs suggest for
a development profile. Hypothesis's example database (`.hypothesis/`) still replays every failure
found before, first, so a bug once found in the inner loop stays found there. `make test`, which
`.ci/run` calls, draws every example: nothing the suite checks is weakened where it decides.
"""

from __future__ import annotations

import os

INNER_LOOP = os.environ.get("GPUFED_TEST_TIER") == "check"


def examples(full: int) -> int:
    """The example count for a property test that draws `full` examples in the whole suite."""
    return max(10, full // 4) if INNER_LOOP else full
