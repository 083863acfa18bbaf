"""The lean HTTP/1.1 client (`datasync.http11`) against hostile servers, over plain TCP and over TLS
(issue 36: it stays, so it must survive what the libraries people trust have already been hardened
against): bodies cut short, chunked replies dribbled a few bytes at a time, `Connection: close` in the
middle of a stream, stalled and slow servers, a server that never reads the request body, oversized
and malformed heads, and a Content-Length that lies either way.

Every failure must be an `HttpClientError` (never a short or mixed-up body), and the pool must never
reuse a connection whose state it cannot be sure of: after each hostile exchange, the next request on
the same pool gets its own, right answer."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from datasync.http11 import HttpPool, HttpTimeout, IncompleteResponse, ProtocolViolation
from datasync.local_tls import ServerCertificate, make_server_tls
from tests.waits import LoopClock

# A hostile script: reads what it likes from the connection and writes what it likes; returning True
# keeps the connection open for the next request (served by the same script).
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> ServerCertificate:
    return make_server_tls(tmp_path_factory.mktemp("http11-tls"))


@dataclass
class Hostile:
    port: int
    tls: ssl.SSLContext | None
    connections: int = 0

    def pool(self, **kw: float) -> HttpPool:
        return HttpPool("127.0.0.1", self.port, tls=self.tls, **kw)  # type: ignore[arg-type]


@pytest.fixture(params=["tcp", "tls"])
async def hostile(
    request: pytest.FixtureRequest, certificate: ServerCertificate
) -> AsyncIterator[Callable[[Script], Awaitable[Hostile]]]:
    servers: list[asyncio.Server] = []
    handlers: list[asyncio.Task[None]] = []
    use_tls = request.param == "tls"

    async def start(script: Script) -> Hostile:
        server_context: ssl.SSLContext | None = None
        client_context: ssl.SSLContext | None = None
        if use_tls:
            server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server_context.load_cert_chain(certificate.cert, certificate.key)
            client_context = ssl.create_default_context(cafile=str(certificate.ca))
        state = Hostile(0, client_context)

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            state.connections += 1
            handlers.append(asyncio.current_task())  # type: ignore[arg-type]
            n = 0
            try:
                while True:
                    n += 1
                    if not await script(reader, writer, n):
                        break
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_context)
        servers.append(server)
        state.port = server.sockets[0].getsockname()[1]
        return state

    yield start
    for task in handlers:
        task.cancel()
    for server in servers:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    """The request line's target and the body (by Content-Length)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    body = await reader.readexactly(length) if length else b""
    return head.split(" ", 2)[1], body


async def honest(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Answer one request properly (its target as the body): the control after each hostile exchange."""
    target, _ = await read_request(reader)
    return await _answer(writer, target)


def first_hostile_then_honest(hostile_reply: Script) -> Script:
    """The first connection's first request gets `hostile_reply`; everything after is answered honestly."""
    served = 0

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        nonlocal served
        served += 1
        if served == 1:
            return await hostile_reply(reader, writer, n)
        return await honest(reader, writer)

    return script


async def next_request_is_answered_right(pool: HttpPool, server: Hostile, *, new_connection: bool) -> None:
    before = server.connections
    response = await pool.request("GET", "/after")
    assert (response.status, response.body) == (200, b"ok /after")
    assert (server.connections > before) == new_connection


async def test_a_body_cut_short_by_the_close_is_an_error(
    hostile: Callable[[Script], Awaitable[Hostile]],
) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 300000\r\n\r\n" + b"x" * 100_000)
        await writer.drain()
        return False  # closed with 200,000 bytes missing

    server = await hostile(first_hostile_then_honest(cut))
    pool = server.pool()
    with pytest.raises(IncompleteResponse):
        await pool.request("GET", "/cut")
    await next_request_is_answered_right(pool, server, new_connection=True)
    await pool.close()


async def test_a_chunked_reply_dribbled_a_few_bytes_at_a_time(
    hostile: Callable[[Script], Awaitable[Hostile]],
) -> None:
    payload = bytes(range(256)) * 300
    chunks = [payload[i : i + 7000] for i in range(0, len(payload), 7000)]
    wire = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\nx-trailer: yes\r\n\r\n"

    async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(wire), 1013):  # chunk sizes, CRLFs and data split anywhere
            writer.write(wire[i : i + 1013])
            await writer.drain()
        return True

    server = await hostile(first_hostile_then_honest(dribble))
    pool = server.pool()
    response = await pool.request("GET", "/chunked")
    assert response.body == payload
    await next_request_is_answered_right(pool, server, new_connection=False)  # whole: kept alive
    await pool.close()


async def test_connection_close_in_the_middle_of_a_stream(
    hostile: Callable[[Script], Awaitable[Hostile]],
) -> None:
    # A pipelined-looking stream: one whole response, then the head of another that the server
    # abandons with Connection: close. The first is the answer; the rest must not leak into the next.
    async def close_midway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 5\r\n\r\nfirst"
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nstray"
        )
        await writer.drain()
        return False

    server = await hostile(first_hostile_then_honest(close_midway))
    pool = server.pool()
    response = await pool.request("GET", "/first")
    assert response.body == b"first"
    await next_request_is_answered_right(pool, server, new_connection=True)
    await pool.close()


async def test_a_stalled_server_times_out_whether_it_stalls_before_or_inside_the_reply(
    hostile: Callable[[Script], Awaitable[Hostile]], loop_clock: LoopClock
) -> None:
    stalled = asyncio.Event()
    release = asyncio.Event()

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        target, _ = await read_request(reader)
        if target == "/inside":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
            await writer.drain()
        stalled.set()
        await release.wait()
        return False

    server = await hostile(stall)
    pool = server.pool(timeout_s=30.0)
    try:
        for where in ("/before", "/inside"):
            stalled.clear()
            waiting = asyncio.create_task(pool.request("GET", where))
            await asyncio.wait_for(stalled.wait(), timeout=10)
            assert not waiting.done()
            loop_clock.advance(31.0)  # past the deadline on the loop's clock
            with pytest.raises(HttpTimeout):
                await asyncio.wait_for(waiting, timeout=10)
        assert pool.connections_made == 2  # the timed-out connection was not reused
    finally:
        release.set()
    await pool.close()


async def test_a_server_that_never_reads_the_body_does_not_hang_the_writer(
    hostile: Callable[[Script], Awaitable[Hostile]], loop_clock: LoopClock
) -> None:
    # 8 MiB to a server that reads only the head: the socket buffers fill, the writer waits for a
    # drain that never comes. The deadline must end it (the wait for the drain included).
    reading_stopped = asyncio.Event()
    release = asyncio.Event()

    async def deaf(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await reader.readuntil(b"\r\n\r\n")
        reading_stopped.set()
        await release.wait()
        return False

    server = await hostile(deaf)
    pool = server.pool(timeout_s=30.0)
    try:
        upload = asyncio.create_task(pool.request("PUT", "/big", (), memoryview(bytes(8 * 1024 * 1024))))
        await asyncio.wait_for(reading_stopped.wait(), timeout=10)
        loop_clock.advance(31.0)
        with pytest.raises(HttpTimeout):
            await asyncio.wait_for(upload, timeout=10)
    finally:
        release.set()
    await pool.close()


async def test_an_early_error_reply_to_a_large_upload_ends_the_upload(
    hostile: Callable[[Script], Awaitable[Hostile]],
) -> None:
    # S3 answers 403 before it reads a body it will not take, and closes. The client stops writing and
    # reports the 403 (or, if the close beat the reply, a client error): never a hang, never a 200.
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 403 Forbidden\r\nConnection: close\r\nContent-Length: 6\r\n\r\ndenied")
        await writer.drain()
        return False

    server = await hostile(first_hostile_then_honest(refuse))
    pool = server.pool()
    try:
        response = await asyncio.wait_for(
            pool.request("PUT", "/big", (), memoryview(bytes(8 * 1024 * 1024))), timeout=60
        )
        assert (response.status, response.body) == (403, b"denied")
    except IncompleteResponse:
        pass  # the server's close reached us first: also an honest outcome
    await next_request_is_answered_right(pool, server, new_connection=True)
    await pool.close()


async def test_a_slow_server_dripping_the_head_is_held_to_the_deadline(
    hostile: Callable[[Script], Awaitable[Hostile]], loop_clock: LoopClock
) -> None:
    # Slow-loris in reverse: a byte of the head now and then, forever. Activity must not extend the
    # deadline, which is per request.
    dripping = asyncio.Event()
    release = asyncio.Event()

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await read_request(reader)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: ":
            writer.write(bytes([byte]))
            await writer.drain()
        dripping.set()
        while not release.is_set():
            writer.write(b"a")
            await writer.drain()
            await asyncio.sleep(0.01)
        return False

    server = await hostile(drip)
    pool = server.pool(timeout_s=30.0)
    try:
        waiting = asyncio.create_task(pool.request("GET", "/slow"))
        await asyncio.wait_for(dripping.wait(), timeout=10)
        loop_clock.advance(31.0)
        with pytest.raises(HttpTimeout):
            await asyncio.wait_for(waiting, timeout=10)
    finally:
        release.set()
    await pool.close()


async def test_an_oversized_head_is_refused_not_buffered_forever(
    hostile: Callable[[Script], Awaitable[Hostile]],
) -> None:
    async def huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(100):  # 100 headers of 1 KiB: past the 64 KiB limit, and no end in sight
            writer.write(b"X-Filler: " + b"f" * 1024 + b"\r\n")
            await writer.drain()
        await asyncio.sleep(3600)  # never ends the head; the client must not wait for it
        return False

    server = await hostile(first_hostile_then_honest(huge))
    pool = server.pool()
    with pytest.raises(ProtocolViolation, match="64 KiB"):
        await asyncio.wait_for(pool.request("GET", "/huge"), timeout=30)
    await next_request_is_answered_right(pool, server, new_connection=True)
    await pool.close()


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        (b"HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n", ProtocolViolation),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", ProtocolViolation),
        (b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n", ProtocolViolation),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", ProtocolViolation),
        (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", ProtocolViolation),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n", ProtocolViolation),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", ProtocolViolation),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY", ProtocolViolation),
    ],
    ids=[
        "http2",
        "not-http",
        "status",
        "header",
        "length-text",
        "length-negative",
        "chunk-size",
        "chunk-crlf",
    ],
)
async def test_malformed_replies_are_protocol_violations(
    hostile: Callable[[Script], Awaitable[Hostile]], reply: bytes, error: type[Exception]
) -> None:
    async def malformed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await read_request(reader)
        writer.write(reply)
        await writer.drain()
        await asyncio.sleep(3600)  # keeps the connection open: the client must decide on its own
        return False

    server = await hostile(first_hostile_then_honest(malformed))
    pool = server.pool()
    with pytest.raises(error):
        await asyncio.wait_for(pool.request("GET", "/bad"), timeout=30)
    await next_request_is_answered_right(pool, server, new_connection=True)
    await pool.close()


async def test_a_content_length_shorter_than_the_body_never_desynchronises_the_pool(
    hostile: Callable[[Script], Awaitable[Hostile]],
) -> None:
    # The server says 5 and sends 5 + a forged response. The 5 are the answer; the forged bytes must
    # not become the answer to the next request (response splitting): the connection is dropped.
    async def longer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
            b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
        )
        await writer.drain()
        return True  # and it keeps the connection open, inviting reuse

    server = await hostile(first_hostile_then_honest(longer))
    pool = server.pool()
    assert (await pool.request("GET", "/short")).body == b"hello"
    await next_request_is_answered_right(pool, server, new_connection=True)
    await pool.close()


async def test_a_content_length_longer_than_the_body(
    hostile: Callable[[Script], Awaitable[Hostile]], loop_clock: LoopClock
) -> None:
    # Says 1,000, sends 10 and keeps the connection open: the client waits for the rest only until
    # its deadline, and never returns the 10 as the body.
    sent = asyncio.Event()
    release = asyncio.Event()

    async def promise(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
        await writer.drain()
        sent.set()
        await release.wait()
        return False

    server = await hostile(first_hostile_then_honest(promise))
    pool = server.pool(timeout_s=30.0)
    try:
        waiting = asyncio.create_task(pool.request("GET", "/long"))
        await asyncio.wait_for(sent.wait(), timeout=10)
        loop_clock.advance(31.0)
        with pytest.raises(HttpTimeout):
            await asyncio.wait_for(waiting, timeout=10)
        await next_request_is_answered_right(pool, server, new_connection=True)
    finally:
        release.set()
    await pool.close()


async def test_a_large_body_arrives_whole_and_the_idle_connection_keeps_nothing_of_it(
    hostile: Callable[[Script], Awaitable[Hostile]],
) -> None:
    payload = bytes(range(256)) * 8192  # 2 MiB, read into one buffer as it arrives

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
        target, _ = await read_request(reader)
        if target != "/big":
            return await _answer(writer, target)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload))
        for i in range(0, len(payload), 100_000):
            writer.write(payload[i : i + 100_000])
            await writer.drain()
        return True

    server = await hostile(big)
    pool = server.pool()
    response = await pool.request("GET", "/big")
    assert bytes(response.body) == payload
    # The pooled connection must not hold the response (its future kept 16 MiB parts alive before).
    assert all(conn._waiter is None for conn in pool._idle)
    await next_request_is_answered_right(pool, server, new_connection=False)
    await pool.close()


async def _answer(writer: asyncio.StreamWriter, target: str) -> bool:
    body = f"ok {target}".encode()
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    return True
