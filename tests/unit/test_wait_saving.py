"""`clock` words a moment by arithmetic (it runs for every waiting gang in every cycle); it must give
the very text that two datetimes and a strftime give, at every moment, edges included."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.wait_saving import _datetime_clock, clock

DAY = 86_400.0
# 2017-10-16 00:00 UTC, the replay's first week.
WEEK = 1_508_112_000.0


def _either(at_s: float, now_s: float) -> tuple[str, str]:
    """Both wordings, or the same exception's name for both."""
    out = []
    for words in (clock, _datetime_clock):
        try:
            out.append(words(at_s, now_s))
        except (ValueError, OverflowError, OSError) as error:
            out.append(type(error).__name__)
    return out[0], out[1]


@pytest.mark.parametrize(
    ("at_s", "now_s"),
    [
        pytest.param(WEEK + 59.9999995, WEEK, id="half-a-microsecond-before-a-minute-rounds-up"),
        pytest.param(WEEK + 59.99999949, WEEK, id="just-under-half-stays"),
        pytest.param(WEEK + DAY - 0.0000004, WEEK, id="rounds-into-the-next-day"),
        pytest.param(WEEK, WEEK + DAY - 0.0000004, id="now-rounds-into-the-next-day"),
        pytest.param(WEEK + 3 * DAY + 754.25, WEEK, id="another-day-names-the-date"),
        pytest.param(WEEK - 1.0, WEEK, id="the-day-before"),
        pytest.param(0.0, 0.0, id="the-epoch"),
        pytest.param(-30.0, 0.0, id="before-the-epoch"),
        pytest.param(253_402_300_799.0, 0.0, id="the-last-second-of-9999"),
        pytest.param(253_402_300_800.0, 0.0, id="past-9999"),
        pytest.param(math.nan, 0.0, id="nan"),
        pytest.param(math.inf, 0.0, id="inf"),
        pytest.param(1_800_000_000, 1_800_000_000, id="whole-seconds-as-ints"),
    ],
)
def test_clock_words_edges_as_datetime_does(at_s: float, now_s: float) -> None:
    fast, reference = _either(at_s, now_s)
    assert fast == reference


@settings(max_examples=3000, deadline=None)
@given(
    day=st.integers(min_value=0, max_value=2_932_000),
    second=st.integers(min_value=0, max_value=86_399),
    fraction=st.one_of(
        st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
        st.sampled_from([0.4999995, 0.9999994, 0.9999995, 0.99999949999, 0.9999996]),
    ),
    now_offset=st.one_of(
        st.floats(min_value=-3 * DAY, max_value=3 * DAY), st.sampled_from([0.0, 1e-7, -1e-7, DAY, -DAY])
    ),
)
def test_clock_is_the_datetime_wording_everywhere(
    day: int, second: int, fraction: float, now_offset: float
) -> None:
    at_s = day * DAY + second + fraction
    fast, reference = _either(at_s, at_s + now_offset)
    assert fast == reference
