"""The shared watch reader (clusters/kubernetes/watchreader.py): one thread reading every watch's body.

The body's framing is undone from bytes that come split anywhere (mid-event, mid chunk-size line,
mid CRLF); a body cut before its last chunk is an error, as urllib3 makes it; and the reader, over a
real urllib3 response from a server that writes its bytes when the test says so, hands on the lines
in order, takes the bytes the client read with the headers, ends a stream at its last chunk, on a
closed socket, on what `deliver` raises, when dropped and when silent past the socket's timeout, and
goes on reading the other streams meanwhile.
"""

from __future__ import annotations

import itertools
import json
import queue
import socket
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest
import urllib3
from urllib3.exceptions import ProtocolError

from clusters.kubernetes.kube import ListPath
from clusters.kubernetes.watch import Gone, Health, Informer
from clusters.kubernetes.watchreader import BodyLines, Stream, WatchReader, open_stream

WAIT_S = 10.0


def event(i: int) -> bytes:
    return json.dumps({"type": "MODIFIED", "object": {"metadata": {"name": f"pod-{i}"}}}).encode() + b"\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def chunked_body() -> tuple[bytes, list[bytes]]:
    """Three events in chunks that cut the second one in two, and the last chunk."""
    events = [event(0), event(1), event(2)]
    joined = b"".join(events)
    cut = len(events[0]) + 7
    body = chunk(joined[:cut]) + chunk(joined[cut:]) + LAST_CHUNK
    return body, [e.rstrip(b"\n") for e in events]


def test_a_chunked_body_split_at_every_byte_gives_the_same_lines() -> None:
    body, expected = chunked_body()
    for cut in range(len(body) + 1):
        lines = BodyLines(chunked=True, length=None)
        got = lines.feed(body[:cut]) + lines.feed(body[cut:])
        assert got == expected, f"split at byte {cut}"
        assert lines.done
    one_by_one = BodyLines(chunked=True, length=None)
    got = [line for i in range(len(body)) for line in one_by_one.feed(body[i : i + 1])]
    assert got == expected
    assert one_by_one.done


def test_a_chunked_body_cut_before_its_last_chunk_is_a_protocol_error() -> None:
    body, expected = chunked_body()
    lines = BodyLines(chunked=True, length=None)
    got = lines.feed(body[: -len(LAST_CHUNK)])
    assert got == expected
    assert not lines.done
    with pytest.raises(ProtocolError):
        lines.eof()


def test_a_bad_chunk_size_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        BodyLines(chunked=True, length=None).feed(b"zz\r\n")
    with pytest.raises(ProtocolError):
        BodyLines(chunked=True, length=None).feed(b"2\r\nabXY")


def test_a_body_of_a_length_ends_there_and_one_to_the_close_at_the_close() -> None:
    lines = BodyLines(chunked=False, length=len(b"a\nbc"))
    assert lines.feed(b"a\nb") == [b"a"]
    assert lines.feed(b"c") == [b"bc"]
    assert lines.done
    to_close = BodyLines(chunked=False, length=None)
    assert to_close.feed(b"a\nb") == [b"a"]
    assert to_close.eof() == [b"b"]
    assert to_close.done
    short = BodyLines(chunked=False, length=10)
    short.feed(b"a\n")
    with pytest.raises(ProtocolError):
        short.eof()


# ---- the reader over real sockets ----------------------------------------------------------------


class Server:
    """A watch server on loopback: answers one request per connection, then writes what the test
    puts in `sends` (None: close the connection)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.sends: queue.Queue[bytes | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            while (data := self.sends.get()) is not None:
                conn.sendall(data)

    def close(self) -> None:
        self.sends.put(None)
        self._thread.join(WAIT_S)
        self._listener.close()


HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


class Lines:
    """What `deliver` was given, as the reader's thread gave it; `then` may raise or say stop."""

    def __init__(self) -> None:
        self.got: queue.Queue[bytes] = queue.Queue()
        self.fail_on: bytes | None = None
        self.stop_on: bytes | None = None

    def __call__(self, line: bytes) -> bool:
        if self.fail_on is not None and self.fail_on in line:
            raise Gone("too old")
        self.got.put(line)
        return self.stop_on is None or self.stop_on not in line

    def take(self, n: int) -> list[bytes]:
        return [self.got.get(timeout=WAIT_S) for _ in range(n)]


@pytest.fixture
def reader() -> Iterator[WatchReader]:
    r = WatchReader("test-watch-reader", deadline_check_s=0.05)
    yield r
    assert r.close()


def opened(
    server: Server, reader: WatchReader, lines: Lines, read_s: float = 30.0
) -> tuple[urllib3.BaseHTTPResponse, Stream]:
    pool = urllib3.HTTPConnectionPool(
        "127.0.0.1", server.port, timeout=urllib3.Timeout(connect=5, read=read_s)
    )
    response = pool.request("GET", "/api/v1/pods?watch=true", preload_content=False, retries=False)
    stream = open_stream(response, lines, name="test/pods", reader=reader)
    assert stream is not None, (
        "the reader could not take urllib3's response: every watch would block a thread"
    )
    return response, stream


def finished(response: urllib3.BaseHTTPResponse, stream: Stream) -> Stream:
    assert stream.ended.wait(WAIT_S)
    response.close()
    response.release_conn()
    return stream


def test_events_split_anywhere_arrive_whole_and_in_order_then_the_body_ends_clean(
    reader: WatchReader,
) -> None:
    server = Server()
    body, expected = chunked_body()
    # The headers and the start of the body in one write: the client's reader holds those bytes.
    server.sends.put(HEADERS + body[:9])
    lines = Lines()
    response, stream = opened(server, reader, lines)
    cuts = [9, 20, 21, len(body) - 3, len(body)]  # mid-event, mid chunk-size line, mid last chunk
    for start, end in itertools.pairwise(cuts):
        server.sends.put(body[start:end])
    assert lines.take(3) == expected
    done = finished(response, stream)
    assert done.clean
    assert done.error is None
    assert not done.stopped
    server.close()


def test_a_socket_closed_mid_stream_ends_it_with_the_error_urllib3_gives(reader: WatchReader) -> None:
    server = Server()
    server.sends.put(HEADERS + chunk(event(0)))
    lines = Lines()
    response, stream = opened(server, reader, lines)
    assert lines.take(1) == [event(0).rstrip(b"\n")]
    server.sends.put(b"40\r\n" + event(1)[:10])
    server.close()  # cut mid-chunk
    done = finished(response, stream)
    assert isinstance(done.error, ProtocolError)
    assert not done.clean


def test_what_deliver_raises_ends_that_stream_and_the_others_go_on(reader: WatchReader) -> None:
    gone_server, other_server = Server(), Server()
    gone_server.sends.put(HEADERS)
    other_server.sends.put(HEADERS)
    failing, other = Lines(), Lines()
    failing.fail_on = b"pod-1"
    response, stream = opened(gone_server, reader, failing)
    other_response, other_stream = opened(other_server, reader, other)
    gone_server.sends.put(chunk(event(0) + event(1) + event(2)))
    assert failing.take(1) == [event(0).rstrip(b"\n")]
    done = finished(response, stream)
    assert isinstance(done.error, Gone)
    assert failing.got.empty(), "an event after the one that raised was delivered"
    other_server.sends.put(chunk(event(5)))
    assert other.take(1) == [event(5).rstrip(b"\n")]
    assert not other_stream.ended.is_set()
    reader.drop(other_stream)
    dropped = finished(other_response, other_stream)
    assert dropped.stopped
    assert dropped.error is None
    assert not dropped.clean
    gone_server.close()
    other_server.close()


def test_deliver_saying_stop_ends_the_stream_as_stopped(reader: WatchReader) -> None:
    server = Server()
    server.sends.put(HEADERS + chunk(event(0) + event(1) + event(2)))
    lines = Lines()
    lines.stop_on = b"pod-1"
    response, stream = opened(server, reader, lines)
    assert lines.take(2) == [event(0).rstrip(b"\n"), event(1).rstrip(b"\n")]
    done = finished(response, stream)
    assert done.stopped
    assert done.error is None
    assert lines.got.empty()
    server.close()


def test_a_stream_silent_past_the_sockets_read_timeout_ends_as_no_answer(reader: WatchReader) -> None:
    server = Server()
    server.sends.put(HEADERS)
    response, stream = opened(server, reader, Lines(), read_s=0.2)
    done = finished(response, stream)
    assert isinstance(done.error, TimeoutError)
    server.close()


def test_a_response_without_a_socket_under_it_is_left_to_its_caller(reader: WatchReader) -> None:
    response = urllib3.HTTPResponse(body=b'{"type":"ADDED"}\n', preload_content=False)
    assert open_stream(response, Lines(), name="test/pods", reader=reader) is None


class ClosedResponse:
    """A response the watch thread closed a moment ago: urllib3 refuses to shut its socket then."""

    def shutdown(self) -> None:
        raise ValueError("Cannot shutdown socket as self._sock_shutdown is not set")


def test_stopping_an_informer_whose_stream_just_ended_does_not_raise() -> None:
    informer: Informer[str] = Informer(
        "pods",
        cast(Any, None),
        path=ListPath("/api/v1/pods"),
        parse=lambda o: str(o["metadata"]["name"]),
        health=Health(),
        watch_timeout_s=1,
        backoff_min_s=0.1,
        backoff_max_s=0.2,
        cluster="c0",
    )
    informer._response = cast(Any, ClosedResponse())
    informer.stop()  # a backend's close() stops every informer; one raising would leave the rest
    assert informer.join(1.0)
