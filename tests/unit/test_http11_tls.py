"""TLS refusals (issue 36): the client trusts exactly what it is configured to trust.

A server whose certificate the configured CA did not sign (a third party on the same host and port, a
man in the middle), an expired certificate from the right CA, a certificate for another host, and a
server that does not speak TLS at all: each is refused at the handshake, before a request (and its
signed Authorization header) is written. The store gets a permanent error that names the problem:
retrying would meet the same certificate. There is no way to turn verification off: a context that
does not verify is refused where it is configured."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from datasync.credentials import AwsCredentials, Secret
from datasync.errors import DatasyncError, StoreConfigError
from datasync.http11 import HttpPool, TlsError
from datasync.local_tls import make_ca, make_expired_certificate, make_server_certificate
from datasync.s3_requests import S3Requests
from datasync.store_config import S3StoreConfig, open_store


@dataclass(frozen=True)
class Certs:
    ca: Path  # what the client trusts
    good: tuple[Path, Path]  # 127.0.0.1, signed by `ca`
    stranger: tuple[Path, Path]  # 127.0.0.1, signed by another CA
    expired: tuple[Path, Path]  # 127.0.0.1, signed by `ca`, expired
    other_host: tuple[Path, Path]  # storage.example only, signed by `ca`


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    d = tmp_path_factory.mktemp("tls-refusals")
    ca = make_ca(d, "trusted-ca")
    other = make_ca(d, "other-ca")
    return Certs(
        ca=ca[0],
        good=make_server_certificate(d, "good", ca),
        stranger=make_server_certificate(d, "stranger", other),
        expired=make_expired_certificate(d, "expired", ca),
        other_host=make_server_certificate(d, "other-host", ca, hosts=("storage.example",)),
    )


@dataclass
class Server:
    port: int
    requests_seen: int = 0


@pytest.fixture
async def tls_server() -> AsyncIterator[Callable[[tuple[Path, Path] | None], Awaitable[Server]]]:
    """A loopback server presenting the given certificate (None: plain TCP), answering 200 to anything
    that reaches it; `requests_seen` counts requests whose head arrived."""
    servers: list[asyncio.Server] = []

    async def start(cert: tuple[Path, Path] | None) -> Server:
        context = None
        if cert is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(cert[0], cert[1])
        state = Server(0)

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                if cert is None:
                    # A plain HTTP server meeting a TLS ClientHello: it answers 400 and closes.
                    await reader.read(1)
                    writer.write(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    )
                    await writer.drain()
                    return
                while True:
                    await reader.readuntil(b"\r\n\r\n")
                    state.requests_seen += 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
        servers.append(server)
        state.port = server.sockets[0].getsockname()[1]
        return state

    yield start
    for server in servers:
        server.close()


def trusting(certs: Certs) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(certs.ca))


async def test_the_configured_ca_is_trusted(
    certs: Certs, tls_server: Callable[[tuple[Path, Path] | None], Awaitable[Server]]
) -> None:
    server = await tls_server(certs.good)
    pool = HttpPool("127.0.0.1", server.port, tls=trusting(certs))
    assert (await pool.request("GET", "/")).body == b"ok"
    await pool.close()


@pytest.mark.parametrize(
    ("which", "words"),
    [
        ("stranger", "certificate verify failed: unable to get local issuer certificate"),
        ("expired", "certificate has expired"),
        ("other_host", "IP address mismatch"),
        (None, "WRONG_VERSION_NUMBER|wrong version number|record layer failure"),
    ],
    ids=["another-ca", "expired", "another-host", "not-tls"],
)
async def test_a_server_the_configured_ca_does_not_vouch_for_is_refused_before_any_request(
    certs: Certs,
    tls_server: Callable[[tuple[Path, Path] | None], Awaitable[Server]],
    which: str | None,
    words: str,
) -> None:
    server = await tls_server(getattr(certs, which) if which else None)
    pool = HttpPool("127.0.0.1", server.port, tls=trusting(certs))
    with pytest.raises(TlsError, match=words):
        await pool.request("GET", "/secret", [("authorization", "AWS4-HMAC-SHA256 signed")])
    assert server.requests_seen == 0  # not a byte of the request (nor its signature) was sent
    await pool.close()


async def test_the_store_error_is_permanent_and_names_the_certificate(
    certs: Certs, tls_server: Callable[[tuple[Path, Path] | None], Awaitable[Server]]
) -> None:
    server = await tls_server(certs.stranger)
    s3 = S3Requests(
        f"https://127.0.0.1:{server.port}",
        "bucket",
        "us-east-1",
        AwsCredentials("id", Secret("secret")),
        tls=trusting(certs),
    )
    with pytest.raises(DatasyncError, match="certificate verify failed") as caught:
        await s3.get_object("key")
    assert caught.value.retryable is False
    await s3.close()


async def test_without_a_ca_bundle_a_private_ca_is_not_trusted(
    certs: Certs, tls_server: Callable[[tuple[Path, Path] | None], Awaitable[Server]]
) -> None:
    # The default is the system's CAs, which do not know the run's CA: refused, not silently accepted.
    server = await tls_server(certs.good)
    store = open_store(
        "private",
        S3StoreConfig(
            "bucket",
            endpoint=f"https://127.0.0.1:{server.port}",
            access_key_id_env="K",
            secret_access_key_env="S",
        ),
        env={"K": "id", "S": "secret"},
    )
    with pytest.raises(DatasyncError, match="certificate verify failed"):
        await store.get("key")
    await store.close()


def test_a_context_that_does_not_verify_is_refused_where_it_is_configured() -> None:
    lax = ssl.create_default_context()
    lax.check_hostname = False
    lax.verify_mode = ssl.CERT_NONE
    with pytest.raises(ValueError, match="must verify"):
        HttpPool("127.0.0.1", 443, tls=lax)
    no_hostname = ssl.create_default_context()
    no_hostname.check_hostname = False
    with pytest.raises(ValueError, match="must verify"):
        HttpPool("127.0.0.1", 443, tls=no_hostname)


def test_ca_bundle_errors_name_the_problem(tmp_path: Path, certs: Certs) -> None:
    env = {"K": "id", "S": "secret"}

    def config(endpoint: str, bundle: str) -> S3StoreConfig:
        return S3StoreConfig(
            "b", endpoint=endpoint, access_key_id_env="K", secret_access_key_env="S", ca_bundle=bundle
        )

    with pytest.raises(StoreConfigError, match="ca_bundle is set but the endpoint 'http://x:1' is not https"):
        open_store("s", config("http://x:1", str(certs.ca)), env=env)
    missing = tmp_path / "nope.pem"
    with pytest.raises(StoreConfigError, match=f"ca_bundle {missing}"):
        open_store("s", config("https://x:1", str(missing)), env=env)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(StoreConfigError, match="holds no PEM certificate"):
        open_store("s", config("https://x:1", str(junk)), env=env)


def test_the_expired_certificate_is_really_expired(certs: Certs) -> None:
    # The refusal above is for the right reason: the certificate's notAfter is in the past.
    decoded = ssl._ssl._test_decode_cert(str(certs.expired[0]))  # type: ignore[attr-defined]
    not_after = dt.datetime.strptime(decoded["notAfter"], "%b %d %H:%M:%S %Y %Z").replace(tzinfo=dt.UTC)
    assert not_after < dt.datetime.now(dt.UTC)
