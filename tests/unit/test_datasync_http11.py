"""The lean HTTP/1.1 client (`datasync.http11`) against a scripted loopback server: keep-alive reuse, a
server that closes a kept-alive connection (idle, or just as the next request arrives), Connection:
close, chunked and until-close bodies, 1xx responses, a slow server and the deadline, a body cut short,
a large body under flow control, and a 5xx answered by the copier's retry. The client against the real
SeaweedFS is in tests/integration/test_datasync_http11_seaweed.py."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from datasync.credentials import AwsCredentials, Secret
from datasync.errors import ObjectNotFound, StoreUnavailable
from datasync.http11 import HttpClientError, HttpPool, HttpTimeout, IncompleteResponse
from datasync.s3_requests import S3Requests, sign_v4
from datasync.throttle import Retrier, RetryPolicy
from tests.waits import LoopClock, until


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[Request, asyncio.StreamWriter, int], Awaitable[bool]]


@dataclass
class ScriptedServer:
    """Reads HTTP/1.1 requests (Content-Length bodies) and lets `handler` answer each; the handler
    returns False to close the connection. `handler`'s third argument counts requests so far."""

    handler: Handler
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, target, headers, body)
                self.requests.append(request)
                if not await self.handler(request, writer, len(self.requests)):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[ScriptedServer]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> ScriptedServer:
        scripted = ScriptedServer(handler)
        server = await asyncio.start_server(scripted.serve, "127.0.0.1", 0)
        scripted.port = server.sockets[0].getsockname()[1]
        servers.append(server)
        return scripted

    yield start
    for server in servers:
        server.close()


def reply(status: int, body: bytes = b"", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def echo(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
    writer.write(reply(200, request.method.encode() + b" " + request.target.encode() + b" " + request.body))
    await writer.drain()
    return True


async def test_keep_alive_reuses_one_connection(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    server = await serve(echo)
    pool = HttpPool("127.0.0.1", server.port)
    for i in range(5):
        response = await pool.request("PUT", f"/b/k{i}", [("x-test", "1")], f"body{i}".encode())
        assert response.status == 200
        assert response.body == f"PUT /b/k{i} body{i}".encode()
    get = await pool.request("GET", "/b/k?x=1")
    assert get.body == b"GET /b/k?x=1 "
    assert server.connections == 1
    assert pool.connections_made == 1
    assert server.requests[0].headers["host"] == f"127.0.0.1:{server.port}"
    assert server.requests[0].headers["x-test"] == "1"
    assert server.requests[0].headers["content-length"] == "5"
    await pool.close()


async def test_concurrent_requests_open_up_to_the_limit(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    in_flight = 0
    most_in_flight = 0
    four_at_once = asyncio.Event()

    async def held_echo(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        # Answers are held until four requests are at the server together, which the pool can only
        # do over four connections. Bounded: a pool that opens fewer stops the holding after the
        # wait, once for all, and fails the asserts below instead of hanging.
        nonlocal in_flight, most_in_flight
        in_flight += 1
        most_in_flight = max(most_in_flight, in_flight)
        if in_flight == 4:
            four_at_once.set()
        try:
            await asyncio.wait_for(four_at_once.wait(), timeout=10)
        except TimeoutError:
            four_at_once.set()
        in_flight -= 1
        return await echo(request, writer, n)

    server = await serve(held_echo)
    pool = HttpPool("127.0.0.1", server.port, max_connections=4)
    replies = await asyncio.gather(*(pool.request("GET", f"/k{i}") for i in range(12)))
    assert [r.body for r in replies] == [f"GET /k{i} ".encode() for i in range(12)]
    assert most_in_flight == 4, f"{most_in_flight} requests in flight at most; the limit is 4"
    assert server.connections == 4
    await pool.close()


async def test_server_closing_an_idle_kept_alive_connection(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    async def answer_then_close(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        await echo(request, writer, n)
        return False  # closes without saying Connection: close, as an idle timeout does

    server = await serve(answer_then_close)
    pool = HttpPool("127.0.0.1", server.port, timeout_s=10.0)  # a pool that reused it fails, not hangs
    assert (await pool.request("GET", "/a")).body == b"GET /a "
    # The close reaches the client while the connection is idle, before the next request: the pool
    # must drop it unused (were it still open, the request would take the keep-alive race's retry).
    await until(lambda: all(conn.closed for conn in pool._idle), "the client saw the idle connection close")
    assert (await pool.request("GET", "/b")).body == b"GET /b "
    assert server.connections == 2
    assert [r.target for r in server.requests] == ["/a", "/b"]
    await pool.close()


async def test_server_closing_a_reused_connection_as_the_request_arrives_is_retried_once(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    async def drop_the_second(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 2:
            return False  # read the request, close without a byte of response: the keep-alive race
        return await echo(request, writer, n)

    server = await serve(drop_the_second)
    pool = HttpPool("127.0.0.1", server.port)
    assert (await pool.request("PUT", "/a", (), b"1")).body == b"PUT /a 1"
    assert (await pool.request("PUT", "/b", (), b"2")).body == b"PUT /b 2"
    assert [r.target for r in server.requests] == ["/a", "/b", "/b"]
    assert server.connections == 2
    await pool.close()


async def test_a_new_connection_closed_before_a_response_is_an_error_not_a_retry(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    async def drop(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        return False

    server = await serve(drop)
    pool = HttpPool("127.0.0.1", server.port)
    with pytest.raises(HttpClientError):
        await pool.request("GET", "/a")
    assert len(server.requests) == 1
    await pool.close()


async def test_connection_close_header_is_honoured(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    test_done = asyncio.Event()

    async def close_each(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(reply(200, b"x", "Connection: close\r\n"))
        await writer.drain()
        # Keeps the socket open until the test ends: the client must neither wait for the close (it
        # would time out below) nor reuse the connection.
        await test_done.wait()
        return False

    server = await serve(close_each)
    pool = HttpPool("127.0.0.1", server.port, timeout_s=10.0)
    try:
        assert (await pool.request("GET", "/a")).body == b"x"
        assert (await pool.request("GET", "/b")).body == b"x"
        assert server.connections == 2
    finally:
        test_done.set()
    await pool.close()


async def test_chunked_body_with_extensions_and_trailer(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    async def chunked(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"5;ext=1\r\nhello\r\n", b"6\r\n world\r\n", b"0\r\nX-Trailer: t\r\n\r\n"):
            writer.write(piece)
            await writer.drain()
            # Spreads the pieces over separate reads of the client. Its length is no condition of
            # the test: pieces that arrived together would parse the same, only less of the parser.
            await asyncio.sleep(0.01)
        return True

    server = await serve(chunked)
    pool = HttpPool("127.0.0.1", server.port)
    assert (await pool.request("GET", "/a")).body == b"hello world"
    assert (await pool.request("GET", "/b")).body == b"hello world"
    assert server.connections == 1  # a chunked response ends cleanly: the connection is reused
    await pool.close()


async def test_body_until_close_and_interim_100(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    async def until_close(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\nall of ")
        await writer.drain()
        writer.write(b"it")
        return False

    server = await serve(until_close)
    pool = HttpPool("127.0.0.1", server.port)
    response = await pool.request("GET", "/a")
    assert (response.status, response.body) == (200, b"all of it")
    await pool.close()


async def test_body_cut_short_is_an_error(serve: Callable[[Handler], Awaitable[ScriptedServer]]) -> None:
    async def short(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        if request.target == "/length":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 50)
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        return False

    server = await serve(short)
    pool = HttpPool("127.0.0.1", server.port)
    with pytest.raises(IncompleteResponse):
        await pool.request("GET", "/length")
    with pytest.raises(IncompleteResponse):
        await pool.request("GET", "/chunked")
    await pool.close()


async def test_slow_server_times_out_and_the_connection_is_not_reused(
    serve: Callable[[Handler], Awaitable[ScriptedServer]], loop_clock: LoopClock
) -> None:
    started_answering = asyncio.Event()
    test_done = asyncio.Event()

    async def slow_first(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")  # then nothing more
            await writer.drain()
            started_answering.set()
            await test_done.wait()
            return False
        return await echo(request, writer, n)

    server = await serve(slow_first)
    # The deadline is on the loop's clock, which the test moves past it; on the wall's, every
    # request has plenty of time (a busy machine does not make `/next` time out as well).
    timeout_s = 30.0
    pool = HttpPool("127.0.0.1", server.port, timeout_s=timeout_s)
    try:
        slow = asyncio.create_task(pool.request("GET", "/slow"))
        await asyncio.wait_for(started_answering.wait(), timeout=10)
        assert not slow.done(), "a response cut short is not a response"
        loop_clock.advance(timeout_s + 1.0)
        with pytest.raises(HttpTimeout):
            # Bounded on the wall as well: a pool that missed its deadline fails here, not hangs.
            await asyncio.wait_for(slow, timeout=10)
        assert (await pool.request("GET", "/next")).body == b"GET /next "
        assert server.connections == 2
    finally:
        test_done.set()
    await pool.close()


async def test_large_body_goes_out_whole_under_flow_control(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    async def digest(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(reply(200, hashlib.md5(request.body).hexdigest().encode()))
        await writer.drain()
        return True

    server = await serve(digest)
    pool = HttpPool("127.0.0.1", server.port)
    body = bytes(range(256)) * (24 * 1024 + 7)  # about 6 MiB, past any socket buffer
    response = await pool.request("PUT", "/big", (), memoryview(body))
    assert response.body == hashlib.md5(body).hexdigest().encode()
    await pool.close()


async def test_connection_refused_is_a_client_error() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    pool = HttpPool("127.0.0.1", port)
    with pytest.raises(HttpClientError):
        await pool.request("GET", "/a")
    await pool.close()


def s3_on(port: int) -> S3Requests:
    return S3Requests(f"http://127.0.0.1:{port}", "b", "us-east-1", AwsCredentials("AKID", Secret("secret")))


async def test_5xx_is_retryable_and_the_copier_retry_gets_the_object(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    async def unavailable_twice(request: Request, writer: asyncio.StreamWriter, n: int) -> bool:
        if n <= 2:
            writer.write(reply(503, b"<Error><Code>SlowDown</Code></Error>"))
        elif request.target == "/b/missing":
            writer.write(reply(404, b"<Error><Code>NoSuchKey</Code></Error>"))
        else:
            writer.write(reply(200, b"payload", 'ETag: "abc"\r\n'))
        await writer.drain()
        return True

    server = await serve(unavailable_twice)
    s3 = s3_on(server.port)
    with pytest.raises(StoreUnavailable, match="503 SlowDown") as first:
        await s3.get_object("k")
    assert first.value.retryable
    backoffs_s: list[float] = []

    async def backoff(seconds: float) -> None:  # the copier's wait, taken on no clock at all
        backoffs_s.append(seconds)

    retrier = Retrier(RetryPolicy(initial_backoff_s=0.01), sleep=backoff, seed=1)
    assert await retrier("get k", lambda: s3.get_object("k")) == b"payload"
    assert retrier.retries == 1
    assert len(backoffs_s) == 1
    assert 0.005 <= backoffs_s[0] <= 0.01, "the first backoff: initial_backoff_s with jitter"
    with pytest.raises(ObjectNotFound):
        await s3.get_object("missing")
    assert await s3.put_object("k", b"data") == '"abc"'
    put = server.requests[-1]
    assert put.body == b"data"
    assert put.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKID/")
    assert server.connections == 1  # error responses keep the connection
    await s3.close()


async def test_s3_connection_failure_is_store_unavailable() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    s3 = s3_on(port)
    with pytest.raises(StoreUnavailable) as e:
        await s3.put_object("k", b"x")
    assert e.value.retryable
    await s3.close()


async def test_lean_requests_sign_exactly_what_sign_v4_signs(
    serve: Callable[[Handler], Awaitable[ScriptedServer]],
) -> None:
    """The lean path signs from the path it builds (no URL parsed back); it must be the path and the
    signature that `sign_v4` gives for `object_url`, which tests/contract/s3 has botocore judge."""
    server = await serve(echo)
    s3 = s3_on(server.port)
    keys = ["plain/key.bin", "sp ace", "plus+and%percent", "url&xml<specials>=?#", "ctl\x01char",
            "new\nline", "folder/", "ünïcødé/日本.txt", "tilde~dash-under_dot."]  # fmt: skip
    for key in keys:
        await s3.put_object(key, b"x")
        sent = server.requests[-1]
        url = s3.object_url(key)
        assert sent.target == urllib.parse.urlsplit(url).path, key
        when = dt.datetime.strptime(sent.headers["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
        expected = sign_v4("PUT", url, {}, {}, s3._credentials, "us-east-1", when)
        assert sent.headers["authorization"] == expected["authorization"], key
    await s3.close()
