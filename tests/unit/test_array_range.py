"""The array range grammar (`--array`, Slurm's): what each spelling means, and a clear error naming
the problem for each kind of bad input."""

from __future__ import annotations

import pytest

from federation.errors import InvalidArgument
from federation.jobsets.arrays import MAX_ARRAY_COPIES, MAX_ARRAY_INDEX, ArrayRange, parse_array


@pytest.mark.parametrize(
    ("text", "indices", "limit"),
    [
        pytest.param("0-199%20", tuple(range(200)), 20, id="range-with-limit"),
        pytest.param("0-9", tuple(range(10)), 0, id="range-no-limit"),
        pytest.param("7", (7,), 0, id="one-index"),
        pytest.param("0-15:4", (0, 4, 8, 12), 0, id="stepped"),
        pytest.param("1,3,5-7%2", (1, 3, 5, 6, 7), 2, id="list-and-range"),
        pytest.param("5,1,3,1", (1, 3, 5), 0, id="sorted-and-distinct"),
        pytest.param(" 0-3 ", (0, 1, 2, 3), 0, id="spaces-around"),
        pytest.param(f"0-{MAX_ARRAY_COPIES - 1}", tuple(range(MAX_ARRAY_COPIES)), 0, id="largest-array"),
        pytest.param(f"{MAX_ARRAY_INDEX}", (MAX_ARRAY_INDEX,), 0, id="highest-index"),
    ],
)
def test_ranges_parse_to_their_indices_and_limit(text: str, indices: tuple[int, ...], limit: int) -> None:
    parsed = parse_array(text)
    assert parsed.indices == indices
    assert parsed.max_parallel == limit


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("0-199%0", "the limit after % must be at least 1", id="limit-zero"),
        pytest.param("0-9%x", "the limit after % must be a whole number, got 'x'", id="limit-not-a-number"),
        pytest.param("0-9%", "the limit after % must be a whole number, got ''", id="limit-missing"),
        pytest.param("5-1", "range '5-1' ends before it starts (1 < 5)", id="backwards"),
        pytest.param(
            "0-1000000", f"index 1000000 is above the highest allowed, {MAX_ARRAY_INDEX}", id="index-too-high"
        ),
        pytest.param("0-199999", f"more than {MAX_ARRAY_COPIES} copies", id="huge-range"),
        pytest.param("0-600,1000-1600", f"more than {MAX_ARRAY_COPIES} copies", id="huge-in-two-parts"),
        pytest.param("0-10:0", "has step 0; it must be at least 1", id="step-zero"),
        pytest.param("%5", "no indices", id="no-indices"),
        pytest.param("", "no indices", id="empty"),
        pytest.param("a-b", "'a-b' is not an index, a range A-B or a stepped range A-B:S", id="letters"),
        pytest.param("-3", "'-3' is not an index", id="negative"),
        pytest.param("1,,2", "'' is not an index", id="empty-item"),
    ],
)
def test_bad_ranges_are_refused_naming_the_problem(text: str, says: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        parse_array(text)
    message = str(raised.value)
    assert message.startswith((f"array {text!r}: ", "array:")), message
    assert says in message, message


def test_a_very_long_text_is_refused_before_it_is_read() -> None:
    with pytest.raises(InvalidArgument, match="at most 256 characters"):
        parse_array("1," * 500)


@pytest.mark.parametrize(
    ("indices", "limit", "text"),
    [
        ((0, 1, 2, 3), 2, "0-3%2"),
        ((1, 3, 4, 5, 9), 0, "1,3-5,9"),
        ((7,), 0, "7"),
    ],
)
def test_the_canonical_spelling_reads_back_the_same(indices: tuple[int, ...], limit: int, text: str) -> None:
    assert ArrayRange(indices, limit).text() == text
    assert parse_array(text) == ArrayRange(indices, limit)
