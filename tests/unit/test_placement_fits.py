"""`fit.fits` answers as `fit.fit_replicas` does, without working out where (the victim search's
question, asked of many node lists per search)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.fit import fit_replicas, fits, gang_shape
from tests.properties import examples


@settings(max_examples=examples(400), deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=9), max_size=12),
    st.lists(st.integers(min_value=0, max_value=9), max_size=16),
)
def test_fits_is_whether_fit_replicas_finds_a_fit(replicas: list[int], nodes: list[int]) -> None:
    shape = gang_shape(replicas)
    assert fits(shape, nodes) == (fit_replicas(shape, nodes) is not None)


def test_fits_refuses_negative_free_gpus_as_fit_replicas_does() -> None:
    with pytest.raises(ValueError, match="negative"):
        fit_replicas((1,), [2, -1])
    with pytest.raises(ValueError, match="negative"):
        fits((1,), [2, -1])
