"""One thread that reads every watch stream of the process, where each watch had a thread blocked on it.

At 100 member clusters the server held 400 watch threads, each woken for every event its stream
brought: a context switch and a GIL hand-off an event, the larger part of the server's 70 to 90
context switches a job and of its kernel time (futex) in bench/scale.py. Here the watch request is
still made by the official client (its kubeconfig's credentials, TLS and headers, as every other
call), and only the answer's body is read elsewhere: the response's socket is registered with one
selector, read without blocking when it has bytes, its HTTP/1.1 framing (chunked, or a length, or to
the connection's end) undone here, and each whole line handed to the watch's `deliver` on this
thread, one after another, as many as the socket had. A burst of events over many clusters is then
one wake-up, not one a stream.

A stream ends when its body ends (the server's timeout: `clean`), when `deliver` raises (Gone, a
malformed event: `error`) or says stop, when its socket fails or closes early (`error`, the
exceptions urllib3 raises for the same), when no byte came for the socket's own read timeout (the one
the client set for the request: `TimeoutError`), or when its owner `drop`s it. Its `ended` event is
set only once the socket is out of the selector, so the owner closes the response after that and a
reused descriptor can never be read for the wrong stream. The connection is never given back for
reuse (the client's response object did not read the body), so the owner closes it.

A response this cannot read (no socket under it, or a content encoding) gives None from `open_stream`,
and the caller reads it on its own thread as before.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
import urllib3
from urllib3.exceptions import ProtocolError

log = structlog.get_logger("gpufed.clusters.kubernetes")

# `GPUFED_WATCH_READER=0`: each watch read on its own thread, as before the shared reader.
ENABLED = os.environ.get("GPUFED_WATCH_READER", "1") != "0"
READER_THREAD_NAME = "k8s-watch-reader"
# How much is read off one socket in one call; a burst larger than this takes more calls in a round.
READ_SIZE = 256 * 1024
# A chunk-size line longer than this is not HTTP (urllib3's own limit).
MAX_CHUNK_LINE = 1024
# The idle deadlines are checked this often; a stream's own deadline is minutes.
DEADLINE_CHECK_S = 1.0
# After a round that read events, the reader waits this long before it looks again, so that each of
# its turns with the GIL applies a batch. Each turn costs a wait for the GIL (up to the interpreter's
# switch interval, 0.5 ms in the server, longer when the cores are busy) and a forced hand-off by the
# event loop's thread. bench/watch_reader.py (400 streams, 2,400 events/s beside a busy loop):
# without the gap 25.7 us of CPU and 1.3 context switches an event, with it 17.3 us and 0.17 (a
# thread a stream: 47.6 us and 3.8), for 7 ms more delay at the median (22 ms at p99, against 446
# with a thread a stream). 10 ms is nothing beside the reconciler's one-second look.
ROUND_GAP_S = 0.01
_WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class BodyLines:
    """The lines of a response's body from its bytes as they come, its framing undone.

    `chunked`: HTTP/1.1 chunked transfer coding (a watch's, from every API server); else `length`
    bytes, or (None) up to the connection's end. `feed` gives the whole lines its bytes finish;
    `done` is set once the body's end has been read; `eof` says whether the connection's end was
    early (a `ProtocolError`, as urllib3 raises for a stream cut mid-chunk).
    """

    def __init__(self, *, chunked: bool, length: int | None) -> None:
        self._chunked = chunked
        self._left = length  # body bytes still to come, when framed by a length
        self._raw = bytearray()  # chunked framing not yet undone
        self._chunk_left: int | None = None  # None: a chunk-size line is next
        self._partial: list[bytes] = []  # the start of a line that later bytes end
        self.done = False

    def feed(self, data: bytes) -> list[bytes]:
        if self.done or not data:
            return []
        if not self._chunked:
            if self._left is not None:
                data = data[: self._left]
                self._left -= len(data)
                if self._left == 0:
                    self.done = True
            split = self._split(data)
            if self.done:
                split.extend(self._rest())
            return split
        self._raw += data
        lines: list[bytes] = []
        raw = self._raw
        pos = 0
        while not self.done:
            if self._chunk_left is None:
                end = raw.find(b"\r\n", pos)
                if end == -1:
                    if len(raw) - pos > MAX_CHUNK_LINE:
                        raise ProtocolError("Response chunk size line exceeded maximum allowed length")
                    break
                size_text = bytes(raw[pos:end]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ProtocolError(f"invalid chunk length {size_text!r}") from None
                pos = end + 2
                if size == 0:
                    # The last chunk; a trailer may follow, unread: the connection is closed after.
                    self.done = True
                    lines.extend(self._rest())
                    break
                self._chunk_left = size
            elif self._chunk_left > 0:
                take = min(self._chunk_left, len(raw) - pos)
                if take == 0:
                    break
                lines.extend(self._split(bytes(raw[pos : pos + take])))
                pos += take
                self._chunk_left -= take
            else:
                if len(raw) - pos < 2:
                    break
                if raw[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("a chunk did not end with CRLF")
                pos += 2
                self._chunk_left = None
        del raw[:pos]
        return lines

    def eof(self) -> list[bytes]:
        """The connection ended: the last line of a body read to its end, or ProtocolError."""
        if self.done:
            return []
        if self._chunked or self._left is not None:
            raise ProtocolError("Response ended prematurely")
        self.done = True
        return self._rest()

    def _split(self, data: bytes) -> list[bytes]:
        lines: list[bytes] = []
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            if self._partial:
                self._partial.append(data[start:end])
                line = b"".join(self._partial)
                self._partial.clear()
            else:
                line = data[start:end]
            if line:
                lines.append(line)
            start = end + 1
        if start < len(data):
            self._partial.append(data[start:])
        return lines

    def _rest(self) -> list[bytes]:
        """A last line the body did not end with a newline."""
        line = b"".join(self._partial)
        self._partial.clear()
        return [line] if line else []


class Stream:
    """One watch's body, read by the reader thread. `deliver(line)` runs there, for each line in
    order; it returns False to end the stream, and what it raises ends it as `error`."""

    def __init__(
        self,
        sock: socket.socket,
        body: BodyLines,
        deliver: Callable[[bytes], bool],
        *,
        buffered: Any,
        idle_timeout_s: float | None,
        name: str,
    ) -> None:
        self.sock = sock
        self.body = body
        self.deliver = deliver
        self.name = name
        # The client's buffered reader: bytes it read with the headers are taken from it first.
        self._buffered = buffered
        self.idle_timeout_s = idle_timeout_s
        self.last_bytes_s = time.monotonic()
        self.ended = threading.Event()
        self.error: BaseException | None = None
        # The body was read to its end (the server ended the watch), rather than cut or stopped.
        self.clean = False
        self.stopped = False

    def take_buffered(self) -> bytes:
        """What the client's reader holds beyond the headers, without waiting for more."""
        reader, self._buffered = self._buffered, None
        if reader is None:
            return b""
        parts: list[bytes] = []
        while True:
            try:
                data = reader.read1(READ_SIZE)
            except _WOULD_BLOCK:
                break
            # b"": nothing buffered and the socket had nothing (or ended: the selector says so next).
            if not data:
                break
            parts.append(data)
        return b"".join(parts)


class WatchReader:
    """The thread that reads every registered stream; started at the first stream, then kept (idle in
    the selector when there is none), as the call threads' pool is the process's."""

    def __init__(
        self,
        name: str = READER_THREAD_NAME,
        *,
        deadline_check_s: float = DEADLINE_CHECK_S,
        gap_s: float = ROUND_GAP_S,
    ) -> None:
        self._name = name
        self._gap_s = gap_s
        self._deadline_check_s = deadline_check_s
        self._lock = threading.Lock()
        self._adds: list[Stream] = []
        self._drops: list[Stream] = []
        self._thread: threading.Thread | None = None
        self._closing = False
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._streams: set[Stream] = set()
        # Counters for tests and benchmarks: wake-ups of the thread, and lines delivered.
        self.rounds = 0
        self.lines = 0

    def follow(self, stream: Stream) -> None:
        with self._lock:
            self._adds.append(stream)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        self._wake()

    def drop(self, stream: Stream) -> None:
        """End the stream (`stopped`) soon, if it has not ended; its `ended` is set once it is out."""
        with self._lock:
            self._drops.append(stream)
        self._wake()

    def close(self, timeout_s: float = 10.0) -> bool:
        """End the thread (its streams end as stopped); for a reader of its own, as tests make. The
        process's shared reader lives as long as the process."""
        with self._lock:
            self._closing = True
            thread = self._thread
        self._wake()
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                return False
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
        return True

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_w.send(b"\0")

    # ---- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        next_check_s = time.monotonic() + self._deadline_check_s
        while True:
            try:
                ready = self._selector.select(self._deadline_check_s if self._streams else None)
                self.rounds += 1
                read = False
                for key, _ in ready:
                    stream = key.data
                    if stream is None:
                        with contextlib.suppress(BlockingIOError):
                            while self._wake_r.recv(4096):
                                pass
                    elif stream in self._streams:
                        self._read(stream)
                        read = True
                if self._take_requests():
                    return
                if read and self._gap_s > 0:
                    # Let the next events gather (see ROUND_GAP_S); the GIL is free meanwhile.
                    time.sleep(self._gap_s)
                now = time.monotonic()
                if now >= next_check_s:
                    next_check_s = now + self._deadline_check_s
                    self._expire(now)
            except Exception as error:  # a fault here must not leave every watch waiting forever
                log.exception("watch_reader_failed")
                for stream in list(self._streams):
                    self._end(stream, error=error)

    def _take_requests(self) -> bool:
        """Streams added and dropped since the last round; True once the reader is closing."""
        with self._lock:
            adds, self._adds = self._adds, []
            drops, self._drops = self._drops, []
            closing = self._closing
        if closing:
            drops += adds + list(self._streams)
            adds = []
        for stream in adds:
            self._start(stream)
        for stream in drops:
            if stream in self._streams:
                stream.stopped = True
                self._end(stream)
            elif not stream.ended.is_set():  # never started (the reader closing): not in the selector
                stream.stopped = True
                stream.ended.set()
        return closing

    def _start(self, stream: Stream) -> None:
        try:
            stream.sock.setblocking(False)
            self._selector.register(stream.sock, selectors.EVENT_READ, stream)
        except Exception as error:
            stream.error = error
            stream.ended.set()
            return
        self._streams.add(stream)
        if stream.body.done:  # an empty body (Content-Length: 0)
            stream.clean = True
            self._end(stream)
            return
        # Bytes the client read with the headers, and (over TLS) bytes already decrypted, are not
        # signalled by the selector: read them now.
        try:
            buffered = stream.take_buffered()
        except Exception as error:
            self._end(stream, error=error)
            return
        if buffered and not self._hand(stream, buffered):
            return
        self._read(stream)

    def _read(self, stream: Stream) -> None:
        """What the socket has now, handed on line by line: one read, unless it filled its buffer or
        TLS holds decrypted bytes the selector cannot see. Each read gives the GIL up and takes it
        back, with a forced hand-off when the event loop's thread waits for it, so the reader does
        not read again only to learn there is nothing more: the selector says so next round."""
        while True:
            try:
                data = stream.sock.recv(READ_SIZE)
            except _WOULD_BLOCK:
                return
            except Exception as error:
                self._end(stream, error=error)
                return
            if not data:
                try:
                    lines = stream.body.eof()
                except Exception as error:
                    self._end(stream, error=error)
                    return
                if self._deliver(stream, lines):
                    stream.clean = True
                    self._end(stream)
                return
            if not self._hand(stream, data):
                return
            if len(data) < READ_SIZE and not _pending(stream.sock):
                return

    def _hand(self, stream: Stream, data: bytes) -> bool:
        """Frames and delivers `data`; False once the stream has ended."""
        stream.last_bytes_s = time.monotonic()
        try:
            lines = stream.body.feed(data)
        except Exception as error:
            self._end(stream, error=error)
            return False
        if not self._deliver(stream, lines):
            return False
        if stream.body.done:
            stream.clean = True
            self._end(stream)
            return False
        return True

    def _deliver(self, stream: Stream, lines: list[bytes]) -> bool:
        for line in lines:
            try:
                go_on = stream.deliver(line)
            except BaseException as error:
                self._end(stream, error=error)
                return False
            self.lines += 1
            if not go_on:
                stream.stopped = True
                self._end(stream)
                return False
        return True

    def _expire(self, now: float) -> None:
        for stream in list(self._streams):
            limit = stream.idle_timeout_s
            if limit is not None and now - stream.last_bytes_s > limit:
                self._end(stream, error=TimeoutError(f"watch {stream.name}: no bytes for {limit:.0f} s"))

    def _end(self, stream: Stream, *, error: BaseException | None = None) -> None:
        if stream not in self._streams:
            return
        self._streams.discard(stream)
        with contextlib.suppress(Exception):
            self._selector.unregister(stream.sock)
        if error is not None:
            stream.error = error
        stream.ended.set()


def _pending(sock: socket.socket) -> int:
    """Bytes TLS has decrypted and not handed out (none on a plain socket)."""
    return sock.pending() if isinstance(sock, ssl.SSLSocket) else 0


_shared: WatchReader | None = None
_shared_lock = threading.Lock()


def shared_reader() -> WatchReader:
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WatchReader()
        return _shared


def open_stream(
    response: urllib3.BaseHTTPResponse,
    deliver: Callable[[bytes], bool],
    *,
    name: str,
    reader: WatchReader | None = None,
) -> Stream | None:
    """The response's body handed to the reader, or None where it cannot read it (the caller reads
    it on its own thread). The caller waits for `ended`, then closes the response."""
    if not ENABLED:
        return None
    headers = response.headers
    if headers.get("content-encoding", "identity").lower() not in ("", "identity"):
        return None
    http_response = getattr(response, "_fp", None)
    buffered = getattr(http_response, "fp", None)
    sock = getattr(getattr(buffered, "raw", None), "_sock", None)
    if not isinstance(sock, socket.socket) or not hasattr(buffered, "read1"):
        return None
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length: int | None = None
    if not chunked and (text := headers.get("content-length")) is not None:
        try:
            length = int(text)
        except ValueError:
            return None
    timeout = sock.gettimeout()
    stream = Stream(
        sock,
        BodyLines(chunked=chunked, length=length),
        deliver,
        buffered=buffered,
        idle_timeout_s=timeout if timeout else None,
        name=name,
    )
    (reader or shared_reader()).follow(stream)
    return stream
