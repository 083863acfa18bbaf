"""The index's views keep their keys in sorted chunks (federation.store.job_cache_index._Ordered):
against a plain sorted list, with chunks of 4 keys so that splits, joins and emptied chunks happen
within a few dozen operations, every read (forward and back, from any key) gives the same keys."""

from __future__ import annotations

import bisect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from federation.store import job_cache_index
from federation.store.job_cache_index import ListKey, _Ordered

KEYS = st.tuples(st.integers(0, 60).map(float), st.sampled_from(["a", "b", "c"]))
OPS = st.lists(st.tuples(st.booleans(), KEYS), max_size=300)


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_cache_index, "CHUNK_KEYS", 4)


def _reads(view: _Ordered, start: ListKey | None) -> tuple[list[ListKey], list[ListKey]]:
    return [k for k, _ in view.after(start)], [k for k, _ in view.before(start)]


@settings(max_examples=300, deadline=None)
@given(initial=st.lists(KEYS, unique=True, max_size=40), ops=OPS, probes=st.lists(KEYS, max_size=5))
def test_a_chunked_view_reads_as_a_sorted_list(
    initial: list[ListKey], ops: list[tuple[bool, ListKey]], probes: list[ListKey]
) -> None:
    model = sorted(initial)
    items = {key[1]: object() for key in [*initial, *(k for _, k in ops)]}
    view = _Ordered(items, list(model))  # type: ignore[arg-type]
    for add, key in ops:
        at = bisect.bisect_left(model, key)
        present = at < len(model) and model[at] == key
        if add:
            view.put(key)
            if not present:
                model.insert(at, key)
        else:
            view.remove(key)
            if present:
                del model[at]
        assert view.keys() == model
        assert len(view) == len(model)
        # No chunk is empty and each records its last key: what the bisections rely on.
        assert all(view._chunks)
        assert view._lasts == [c[-1] for c in view._chunks]
        assert all(len(c) <= 2 * job_cache_index.CHUNK_KEYS for c in view._chunks)
    for start in [None, *probes, *model[:3]]:
        forward, back = _reads(view, start)
        assert forward == [k for k in model if start is None or k > start]
        assert back == [k for k in reversed(model) if start is None or k < start]
