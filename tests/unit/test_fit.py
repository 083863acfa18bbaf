"""Best-fit decreasing of a gang's replicas into nodes, on node lists and on histograms."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.fit import FreeHistogram, combine_node_lists, fit_replicas, gang_shape
from placement.model import CapacityKind, GpuType, NodePool
from tests.properties import examples


@pytest.mark.parametrize(
    ("replicas", "free", "expected"),
    [
        pytest.param((8,), (8,), (8,), id="one-replica-fills-one-node"),
        pytest.param((8,), (4, 4), None, id="replica-cannot-span-two-half-free-nodes"),
        pytest.param((4, 4), (4, 4), (4, 4), id="two-replicas-on-two-half-free-nodes"),
        pytest.param((4,), (8, 4), (0, 4), id="best-fit-prefers-the-partly-used-node"),
        pytest.param((2,), (8, 3, 2, 4), (0, 0, 2, 0), id="best-fit-takes-the-smallest-node-that-holds-it"),
        pytest.param((4, 4), (8, 8), (8, 0), id="second-replica-joins-the-node-the-gang-already-uses"),
        pytest.param((1, 8), (8, 1), (8, 1), id="small-replica-goes-to-the-small-node"),
        pytest.param((8, 8, 8), (8, 8), None, id="more-replicas-than-nodes"),
        pytest.param((0, 0), (), (), id="zero-gpu-replicas-fit-with-no-nodes"),
        pytest.param((0, 8), (8,), (8,), id="zero-gpu-replica-takes-nothing"),
        pytest.param((), (3, 5), (0, 0), id="empty-gang-takes-nothing"),
        pytest.param((5, 3), (3, 5), (3, 5), id="largest-first"),
        pytest.param((1,), (2, 2), (1, 0), id="ties-go-to-the-lowest-index"),
        pytest.param((6, 2), (4, 4), None, id="enough-gpus-in-total-but-no-node-holds-six"),
        pytest.param((3, 3, 2), (4, 4), None, id="fragmented-total-is-not-enough"),
    ],
)
def test_fit_replicas(
    replicas: tuple[int, ...], free: tuple[int, ...], expected: tuple[int, ...] | None
) -> None:
    assert fit_replicas(replicas, free) == expected


@pytest.mark.parametrize(
    ("replicas", "free"),
    [
        pytest.param((-1,), (8,), id="negative-replica"),
        pytest.param((1,), (8, -1), id="negative-free"),
    ],
)
def test_fit_replicas_rejects_negative_numbers(replicas: tuple[int, ...], free: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="negative"):
        fit_replicas(replicas, free)


def test_gang_shape_drops_zero_gpu_replicas_and_sorts_largest_first() -> None:
    assert gang_shape((1, 0, 8, 4, 8)) == (8, 8, 4, 1)


def test_combine_node_lists_concatenates_pools_in_order() -> None:
    pools = [
        NodePool("a", GpuType("A100"), CapacityKind.PRIVATE, 1.0, 8, (8, 2)),
        NodePool("b", GpuType("A100"), CapacityKind.PRIVATE, 1.0, 4, (4,)),
    ]
    assert combine_node_lists(pools) == (8, 2, 4)


@pytest.mark.parametrize(
    ("shape", "free", "stranded", "touched"),
    [
        pytest.param((4,), (8,), 4, 1, id="half-a-node-strands-four"),
        pytest.param((4,), (8, 4), 0, 1, id="fills-the-partly-used-node"),
        pytest.param((4, 4), (8, 8), 0, 1, id="both-replicas-on-one-node"),
        pytest.param((8, 8), (8, 8, 8), 0, 2, id="two-whole-nodes"),
        pytest.param((2, 2), (2, 2, 8), 0, 2, id="fills-fragments-before-a-whole-node"),
        pytest.param((), (8,), 0, 0, id="empty-gang"),
    ],
)
def test_histogram_fit_reports_packing(
    shape: tuple[int, ...], free: tuple[int, ...], stranded: int, touched: int
) -> None:
    placed = FreeHistogram(free).fit(shape)
    assert placed is not None
    assert (placed.stranded_gpus, placed.nodes_touched) == (stranded, touched)


def test_histogram_take_updates_totals() -> None:
    histogram = FreeHistogram((8, 8, 3))
    placed = histogram.fit((8, 3))
    assert placed is not None
    histogram.take(placed)
    assert placed.moves == ((8, 8), (3, 3))
    assert (histogram.total_free, histogram.max_free, histogram.counts) == (8, 8, (2, 0, 0, 0, 0, 0, 0, 0, 1))
    placed = histogram.fit((8,))
    assert placed is not None
    histogram.take(placed)
    assert (histogram.total_free, histogram.max_free) == (0, 0)
    assert histogram.fit((1,)) is None


def test_histogram_take_rejects_a_fit_from_another_histogram() -> None:
    placed = FreeHistogram((2,)).fit((1,))
    assert placed is not None
    with pytest.raises(ValueError, match="another histogram"):
        FreeHistogram((8,)).take(placed)
    with pytest.raises(ValueError, match="another histogram"):
        FreeHistogram((1,)).take(placed)


@settings(max_examples=examples(300), deadline=None)
@given(
    replicas=st.lists(st.integers(0, 8), max_size=6),
    free=st.lists(st.integers(0, 8), max_size=6),
)
def test_node_list_and_histogram_agree(replicas: list[int], free: list[int]) -> None:
    taken = fit_replicas(replicas, free)
    histogram = FreeHistogram(free)
    placed = histogram.fit(gang_shape(replicas))
    assert (taken is None) == (placed is None)
    if taken is None or placed is None:
        return
    assert all(0 <= t <= f for t, f in zip(taken, free, strict=True))
    assert sum(taken) == sum(replicas)
    left = [f - t for f, t in zip(free, taken, strict=True)]
    expected_counts = [0] * (max(free, default=0) + 1)
    for gpus in left:
        expected_counts[gpus] += 1
    histogram.take(placed)
    assert histogram.counts == tuple(expected_counts)
    assert (histogram.total_free, histogram.max_free) == (sum(left), max(left, default=0))
    touched = [i for i, t in enumerate(taken) if t]
    assert placed.nodes_touched == len(touched)
    assert placed.stranded_gpus == sum(left[i] for i in touched)
