"""A lean HTTP/1.1 client over asyncio, for the many small S3 requests of a small-object copy.

Why not aiohttp for these: copying 4 KiB objects, our tool's CPU is what the two local SeaweedFS
servers do not get, and a sampling profile put about 40 % of it in aiohttp's request machinery (its
request and response objects, URL handling, tracing hooks, the timer context, the stream reader) for a
request whose whole exchange is one write and one read. This client does only what S3Requests needs:

- one pool of keep-alive connections per endpoint (host, port), at most `max_connections` open, the
  most recently used idle one first;
- a request is a method, an already-encoded target (path and query, sent exactly as signed), headers and
  an optional body with a Content-Length; written with one `transport.write` for small bodies, with
  flow control (the transport's pause/resume) for large ones;
- responses framed by Content-Length, chunked transfer coding, or the connection's end; 1xx interim
  responses are skipped; a response to HEAD, a 204 or a 304 has no body;
- a connection is reused only after a complete HTTP/1.1 response without `Connection: close` and with
  nothing after it; one the server closed while idle is dropped before use;
- a request on a reused connection that fails before any byte of the response arrived (the server closed
  it just as we sent: the keep-alive race) is sent once more on a new connection. Only the idempotent
  methods S3 uses this way (GET, HEAD, PUT, DELETE) are: a PUT of the same bytes to the same key is the
  same object;
- a deadline per request (`timeout_s`, connect and exchange together): past it the connection is
  aborted and `HttpTimeout` raised;
- a body cut short (the connection ends before Content-Length bytes or before the last chunk) is
  `IncompleteResponse`, never a short body.

Every failure is an `HttpClientError` (a `ConnectionError`); callers decide on retries (S3Requests maps
them to `StoreUnavailable`, which the copier retries with backoff).

TLS (https endpoints): the same protocol object over the standard library's `ssl` through asyncio
(`loop.create_connection(ssl=context, server_hostname=host)`), so framing, reuse, deadlines and every
check above are the same for HTTP and HTTPS. The context is the caller's (`ssl.create_default_context`:
certificate and host name verified); there is no switch to turn verification off. A handshake that
fails (a certificate no trusted CA signed, an expired one, another host's) is `TlsError`, which is not
retryable: the next attempt would meet the same certificate.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Iterable
from dataclasses import dataclass

# Bodies up to this size go out in the same write as the head (one syscall); larger ones are written
# after it without being copied into a joined buffer.
_JOIN_BODY_MAX_BYTES = 64 * 1024
# Larger bodies are written in slices of this size, each once the transport has drained below its
# high-water mark: what the kernel does not take at once is copied into the transport's buffer (and,
# over TLS, encrypted into another), so one whole 16 MiB part written at once was another 16 MiB (32
# over TLS) held per connection beside the part itself. Sliced, that is at most a slice.
_WRITE_SLICE_BYTES = 256 * 1024
# A response body of a known length above this is read into one buffer of that length as it arrives,
# and handed over without a copy (a 16 MiB GET was a growing buffer, then a copy of it).
_PREALLOCATE_MIN_BYTES = 64 * 1024
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
_MAX_HEAD_BYTES = 64 * 1024


class HttpClientError(ConnectionError):
    """A request that got no complete response."""


class HttpTimeout(HttpClientError, TimeoutError):
    """No complete response within the request's deadline."""


class IncompleteResponse(HttpClientError):
    """The connection ended inside a response (its body cut short)."""


class ProtocolViolation(HttpClientError):
    """The server's bytes are not HTTP/1.1 we can read."""


class TlsError(HttpClientError):
    """The TLS handshake failed: the server's certificate did not verify against the trusted CAs (or
    is expired, or names another host), or the server does not speak TLS."""


class _StaleConnection(HttpClientError):
    """A reused connection failed before any byte of the response: safe to send again."""


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    # Lower-case names. A repeated header keeps its last value (S3 repeats none we read).
    headers: dict[str, str]
    # A bytearray for a large body of known length (read in place, never copied), else bytes.
    body: bytes | bytearray


class _Connection(asyncio.Protocol):
    """One TCP connection and the response being read on it. Parsing happens as bytes arrive: a small
    response is usually parsed from one `data_received`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = False  # has completed a response before (a reused keep-alive connection)
        self._buf = bytearray()
        self._waiter: asyncio.Future[HttpResponse] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._head_request = False
        # The response being parsed.
        self._status = 0
        self._headers: dict[str, str] = {}
        self._keep_alive = True
        self._mode = 0  # 0: reading the head; 1: Content-Length; 2: chunked; 3: until close
        self._length = 0
        self._chunks: list[bytes] = []
        self._got_bytes = False
        # A large Content-Length body, filled in place (see _PREALLOCATE_MIN_BYTES), and how far.
        self._body: bytearray | None = None
        self._filled = 0

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._got_bytes = True
        if self._waiter is None or self._waiter.done():
            # Bytes nobody asked for (after a response, or while idle): the connection cannot be reused.
            self._abort()
            return
        if self._body is not None:
            self._fill(data)
            return
        self._buf += data
        try:
            self._parse()
        except HttpClientError as e:
            self._fail(e)

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost finishes the response if it can

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._release_drain(exc)
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._mode == 3 and exc is None:
            self._keep_alive = False
            self._finish(bytes(self._buf))
            return
        self._body = None
        if not self._got_bytes and self.used:
            waiter.set_exception(_StaleConnection("the server closed the reused connection"))
        elif not self._got_bytes:
            waiter.set_exception(HttpClientError(f"connection closed before a response ({exc or 'EOF'})"))
        else:
            waiter.set_exception(
                IncompleteResponse(f"connection closed inside the response ({exc or 'EOF'})")
            )

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._release_drain(None)

    # Requests

    async def exchange(
        self, head: bytes, body: bytes | memoryview | None, head_request: bool
    ) -> HttpResponse:
        assert self.transport is not None
        waiter: asyncio.Future[HttpResponse] = self._loop.create_future()
        self._waiter = waiter
        self._head_request = head_request
        self._status, self._mode, self._length, self._keep_alive, self._got_bytes = 0, 0, 0, True, False
        self._chunks, self._body, self._filled = [], None, 0
        if body is not None and 0 < len(body) <= _JOIN_BODY_MAX_BYTES:
            self.transport.write(head + body)
        else:
            self.transport.write(head)
            if body is not None and len(body):
                view = memoryview(body).cast("B")
                for start in range(0, len(view), _WRITE_SLICE_BYTES):
                    await self._drained()
                    if self.closed or waiter.done():
                        break  # lost, timed out, or answered early (an error): the rest is not wanted
                    self.transport.write(view[start : start + _WRITE_SLICE_BYTES])
        await self._drained()
        try:
            return await waiter
        finally:
            # An idle connection must not keep its last response (the future holds the body: with 64
            # pooled connections that was up to 64 part-sized bodies held after their parts were sent).
            self._waiter, self._chunks = None, []

    async def _drained(self) -> None:
        """Wait until the transport is below its high-water mark (or the connection is gone)."""
        if self._paused and not self.closed:
            self._drain = self._loop.create_future()
            await self._drain

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive and not self._buf and self.transport is not None

    def abort(self) -> None:
        self._abort()

    def _abort(self) -> None:
        self._keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def _release_drain(self, exc: Exception | None) -> None:
        """Wake a writer waiting for the transport's buffer to drain. On a lost connection too: the
        request's outcome (a response, or its absence) is then reported through the waiter."""
        del exc
        drain = self._drain
        self._drain = None
        if drain is not None and not drain.done():
            drain.set_result(None)

    def _fail(self, e: HttpClientError) -> None:
        waiter = self._waiter
        self._abort()
        if waiter is not None and not waiter.done():
            waiter.set_exception(e)

    def _finish(self, body: bytes | bytearray) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(HttpResponse(self._status, self._headers, body))

    def _parse(self) -> None:
        while True:
            if self._mode == 0:
                end = self._buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buf) > _MAX_HEAD_BYTES:
                        raise ProtocolViolation("response head larger than 64 KiB")
                    return
                head = bytes(self._buf[:end]).decode("latin-1")
                del self._buf[: end + 4]
                if not self._read_head(head):
                    continue  # a 1xx interim response: the real one follows
            if self._mode == 1:
                if self._length >= _PREALLOCATE_MIN_BYTES and len(self._buf) < self._length:
                    self._body, self._filled = bytearray(self._length), 0
                    rest = bytes(self._buf)
                    self._buf.clear()
                    self._fill(rest)
                    return
                if len(self._buf) < self._length:
                    return
                if len(self._buf) > self._length:
                    # Bytes after the body: the response is whole, but the connection is not reusable.
                    self._keep_alive = False
                body = bytes(self._buf[: self._length]) if self._length else b""
                self._buf.clear()
                self._finish(body)
                return
            if self._mode == 2:
                if not self._read_chunks():
                    return
                if self._buf:
                    self._keep_alive = False
                    self._buf.clear()
                self._finish(b"".join(self._chunks))
                return
            return  # mode 3: the body ends with the connection

    def _fill(self, data: bytes) -> None:
        """Copy `data` into the preallocated body; finish the response once it is whole."""
        body = self._body
        assert body is not None
        take = min(len(data), self._length - self._filled)
        body[self._filled : self._filled + take] = data[:take] if take < len(data) else data
        self._filled += take
        if self._filled < self._length:
            return
        self._body = None
        if take < len(data):
            # Bytes after the body: the response is whole, but the connection is not reusable.
            self._keep_alive = False
            self._buf += data[take:]
        self._finish(body)

    def _read_head(self, head: str) -> bool:
        """Parse the status line and headers; set the body's framing. False for a 1xx response."""
        lines = head.split("\r\n")
        status_line = lines[0].split(" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith("HTTP/1."):
            raise ProtocolViolation(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        try:
            status = int(status_line[1])
        except ValueError:
            raise ProtocolViolation(f"bad status {status_line[1][:20]!r}") from None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise ProtocolViolation(f"bad header line {line[:80]!r}")
            headers[name.strip().lower()] = value.strip()
        if 100 <= status < 200:
            return False
        self._status, self._headers = status, headers
        self._keep_alive = status_line[0] == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if self._head_request or status in (204, 304):
            self._mode, self._length = 1, 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._mode = 2
        elif "content-length" in headers:
            try:
                self._length = int(headers["content-length"])
            except ValueError:
                raise ProtocolViolation("bad Content-Length") from None
            if self._length < 0:
                raise ProtocolViolation("negative Content-Length")
            self._mode = 1
        else:
            self._mode, self._keep_alive = 3, False
        return True

    def _read_chunks(self) -> bool:
        """Consume whole chunks from the buffer; True once the last chunk and its trailer are read."""
        buf = self._buf
        while True:
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return False
            size_text = bytes(buf[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolViolation(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                # The trailer: header lines, then an empty line.
                trailer_end = buf.find(b"\r\n\r\n", line_end)
                if trailer_end == line_end:
                    del buf[: line_end + 4]
                    return True
                if buf[line_end + 2 : line_end + 4] == b"\r\n":
                    del buf[: line_end + 4]
                    return True
                if trailer_end < 0:
                    return False
                del buf[: trailer_end + 4]
                return True
            start = line_end + 2
            if len(buf) < start + size + 2:
                return False
            if buf[start + size : start + size + 2] != b"\r\n":
                raise ProtocolViolation("chunk not followed by CRLF")
            self._chunks.append(bytes(buf[start : start + size]))
            del buf[: start + size + 2]


class HttpPool:
    """Keep-alive connections to one endpoint. Use from one event loop (the one that first used it)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        host_header: str | None = None,
        max_connections: int = 64,
        timeout_s: float = 300.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port = host, port
        # What a signed request signed as its host (the endpoint URL's netloc) must be what is sent.
        default_port = 443 if tls is not None else 80
        self._host_header = host_header or (host if port == default_port else f"{host}:{port}")
        if tls is not None and (tls.verify_mode != ssl.CERT_REQUIRED or not tls.check_hostname):
            # Never a silent `verify=False`: a context that does not check the certificate and the
            # host name is refused here, where it is configured.
            raise ValueError("the TLS context must verify the server's certificate and host name")
        self._tls = tls
        self._timeout_s = timeout_s
        self._idle: collections.deque[_Connection] = collections.deque()
        self._slots = asyncio.Semaphore(max_connections)
        self._open: set[_Connection] = set()
        self.connections_made = 0  # for tests: how many TCP connections this pool opened

    @property
    def host_header(self) -> str:
        return self._host_header

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]] = (),
        body: bytes | memoryview | None = None,
    ) -> HttpResponse:
        """Send one request; `target` is the path and query exactly as it goes on the wire."""
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {self._host_header}\r\n"]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers)
        if body is not None or method in ("PUT", "POST"):
            lines.append(f"Content-Length: {0 if body is None else len(body)}\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("latin-1")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        async with self._slots:
            for attempt in range(2):
                conn = await self._connection(loop, deadline)
                timer = loop.call_at(deadline, self._expire, conn)
                try:
                    response = await conn.exchange(head, body, method == "HEAD")
                except _StaleConnection:
                    self._discard(conn)
                    if attempt == 0 and method in _IDEMPOTENT:
                        continue
                    raise HttpClientError("the server closed the connection before a response") from None
                except HttpTimeout:
                    self._discard(conn)
                    raise
                except BaseException:
                    # Cancelled, or a failure mid-response: the connection's state is unknown.
                    self._discard(conn)
                    raise
                finally:
                    timer.cancel()
                if conn.reusable:
                    conn.used = True
                    self._idle.append(conn)
                else:
                    self._discard(conn)
                return response
        raise AssertionError("unreachable")

    def _expire(self, conn: _Connection) -> None:
        conn._fail(HttpTimeout(f"no complete response within {self._timeout_s:g} s"))

    async def _connection(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        while self._idle:
            conn = self._idle.pop()  # the most recently used: least likely closed by the server's idle timer
            if conn.reusable:
                return conn
            self._discard(conn)
        try:
            async with asyncio.timeout_at(deadline):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop),
                    self.host,
                    self.port,
                    ssl=self._tls,
                    server_hostname=self.host if self._tls is not None else None,
                )
        except ssl.SSLCertVerificationError as e:
            # verify_message says why: "unable to get local issuer certificate", "certificate has
            # expired", "IP address mismatch, certificate is not valid for '127.0.0.1'".
            raise TlsError(
                f"TLS with {self.host}:{self.port}: certificate verify failed: {e.verify_message}"
            ) from e
        except ssl.SSLError as e:
            raise TlsError(f"TLS with {self.host}:{self.port}: {e.reason or e}") from e
        except TimeoutError:
            raise HttpTimeout(
                f"connect to {self.host}:{self.port}: no connection within {self._timeout_s:g} s"
            ) from None
        except OSError as e:
            raise HttpClientError(f"connect to {self.host}:{self.port}: {e}") from e
        self.connections_made += 1
        self._open.add(conn)
        return conn

    def _discard(self, conn: _Connection) -> None:
        conn.abort()
        self._open.discard(conn)

    async def close(self) -> None:
        for conn in list(self._open):
            self._discard(conn)
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports' connection_lost run
