"""`KubeApi.lines`: a watch's stream cut into its events however the chunks fall (issue 33).

The official client's `iter_resp_lines` copied the rest of a chunk after every line; the backend's
own splitter does not, and must give the same lines for any chunking of the stream.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from clusters.kubernetes.kube import KubeApi, decode_json


class _Stream:
    """What `lines` reads of urllib3's response: its chunks, as the connection delivered them."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    def stream(self, amt: int | None = None, decode_content: bool | None = None) -> Iterator[bytes]:
        assert amt is None
        assert decode_content is False
        yield from self._chunks


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


@settings(deadline=None)
@given(
    events=st.lists(
        st.dictionaries(st.text(max_size=8), st.text(max_size=40) | st.integers(), max_size=4), max_size=12
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=30),
    blank=st.booleans(),
)
def test_lines_are_the_events_however_the_chunks_fall(
    events: list[dict[str, object]], cuts: list[int], blank: bool
) -> None:
    docs = [json.dumps({"type": "MODIFIED", "object": e}).encode() for e in events]
    # Blank lines between events (a keep-alive) are no events.
    data = b"".join(d + (b"\n\n" if blank else b"\n") for d in docs)
    lines = list(KubeApi.lines(_Stream(_chunked(data, cuts))))  # type: ignore[arg-type]
    assert lines == docs
    assert [decode_json(line)["object"] for line in lines] == events


def test_a_line_spread_over_many_chunks_and_one_left_unfinished() -> None:
    data = b'{"type":"ADDED","object":{"a":"' + b"x" * 100 + b'"}}\n{"type":"DEL'
    chunks = [data[i : i + 7] for i in range(0, len(data), 7)]
    lines = list(KubeApi.lines(_Stream(chunks)))  # type: ignore[arg-type]
    # The unfinished last line is not an event (the watch ended mid-line, as the client's reader did).
    assert lines == [data.split(b"\n")[0]]
