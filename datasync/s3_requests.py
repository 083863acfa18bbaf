"""The S3 requests obstore does not expose: multipart parts by upload id, and copies across buckets.

obstore (Rust `object_store`) is the fast path for listing, GET, PUT and DELETE, but it hides multipart
uploads inside `put`, so a killed process cannot continue an upload, and it copies only within one
bucket. These calls, and whole-object and ranged GETs and single PUTs (a small-object copy's two
requests an object) and listings, are signed here with AWS Signature V4 and sent by our lean HTTP/1.1
client (`datasync.http11`), over TCP or TLS: one client path for http and https endpoints (aiohttp was
the https path until issue 36; docs/datasync.md has the figures that kept the lean client). The signature
covers an `UNSIGNED-PAYLOAD` body hash (what the AWS SDKs do over TLS); the engine verifies content
against the manifest's sha256 and each part's MD5 ETag instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import hashlib
import hmac
import html
import re
import ssl
import time
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from datasync.credentials import AwsCredentials
from datasync.errors import AccessDenied, DatasyncError, ObjectNotFound, StoreUnavailable
from datasync.http11 import HttpClientError, HttpPool, TlsError
from datasync.store import ObjectMeta, PartInfo

_UNSIGNED = "UNSIGNED-PAYLOAD"


def _quote(s: str, safe: str = "-_.~") -> str:
    return urllib.parse.quote(s, safe=safe)


@functools.lru_cache(maxsize=16)
def _signing_key(secret: str, day: str, region: str) -> bytes:
    """SigV4's key for one day and region: four HMACs that are the same for every request of the day.
    Derived once (a small-object copy signs two requests an object; this was half of signing's CPU)."""
    key = ("AWS4" + secret).encode()
    for piece in (day, region, "s3", "aws4_request"):
        key = hmac.digest(key, piece.encode(), "sha256")
    return key


def canonical_query(query: Mapping[str, str]) -> str:
    """SigV4's canonical query string: names sorted, each name and value percent-encoded once."""
    return "&".join(f"{_quote(k)}={_quote(v)}" for k, v in sorted(query.items()))


def url_with_query(url: str, query: Mapping[str, str]) -> str:
    """`url` with `query` in SigV4's canonical form: sent exactly so, the query the server reads is
    the one that was signed (`sign_v4` signs `canonical_query` of the same mapping)."""
    canonical = canonical_query(query)
    return f"{url}?{canonical}" if canonical else url


def sign_v4(
    method: str,
    url: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    credentials: AwsCredentials,
    region: str,
    now: dt.datetime,
) -> dict[str, str]:
    """The headers to send: `headers` plus x-amz-date, x-amz-content-sha256 and Authorization.

    `url` is the URL exactly as it is sent, its path already percent-encoded once (`S3Requests.object_url`).
    S3's canonical URI is that path as it is: S3, unlike other AWS services, does not encode it a
    second time (botocore's S3SigV4Auth does not either; `tests/contract/s3/` checks ours
    against botocore's).
    """
    parts = urllib.parse.urlsplit(url)
    return _sign(
        method,
        parts.netloc,
        parts.path,
        canonical_query(query),
        headers,
        credentials,
        region,
        now.strftime("%Y%m%dT%H%M%SZ"),
    )


_amz_date_cache: tuple[int, str] = (-1, "")


def _amz_date_now() -> str:
    """SigV4's timestamp of this second; formatted once a second, not per request."""
    global _amz_date_cache
    second = int(time.time())
    if _amz_date_cache[0] != second:
        _amz_date_cache = (second, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(second)))
    return _amz_date_cache[1]


def _sign(
    method: str,
    host: str,
    path: str,
    query_string: str,
    headers: Mapping[str, str],
    credentials: AwsCredentials,
    region: str,
    amz_date: str,
) -> dict[str, str]:
    """`sign_v4` from the URL's parts: the lean client's requests know their host and path without
    parsing a URL back (each small object signs two requests)."""
    day = amz_date[:8]
    out = {k.lower(): v for k, v in headers.items()} if headers else {}
    out["host"] = host
    out["x-amz-date"] = amz_date
    out["x-amz-content-sha256"] = _UNSIGNED
    if credentials.session_token is not None:
        out["x-amz-security-token"] = credentials.session_token.reveal()
    signed = sorted(k for k in out if k == "host" or k.startswith("x-amz-") or k == "content-type")
    signed_names = ";".join(signed)
    canonical_headers = "".join(f"{k}:{out[k].strip()}\n" for k in signed)
    canonical = f"{method}\n{path or '/'}\n{query_string}\n{canonical_headers}\n{signed_names}\n{_UNSIGNED}"
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    key = _signing_key(credentials.secret_access_key.reveal(), day, region)
    signature = hmac.digest(key, to_sign.encode(), "sha256").hex()
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed_names}, Signature={signature}"
    )
    del out["host"]
    return out


def _xml_values(body: str, tag: str) -> list[str]:
    return re.findall(rf"<{tag}>(.*?)</{tag}>", body, flags=re.S)


_CONTENTS = re.compile(r"<Contents>(.*?)</Contents>", flags=re.S)
# The fields of one <Contents> in one pass, whatever order the server writes them in.
_FIELD = re.compile(r"<(Key|ETag|Size|LastModified)>(.*?)</\1>", flags=re.S)


def _unescape(text: str) -> str:
    return html.unescape(text) if "&" in text else text


def _object_meta(block: str) -> ObjectMeta:
    """One listed object. A listing is parsed on every plan, so this is kept to one regex pass and
    skips unquoting keys that need none (a no-op re-sync of 20,000 objects is mostly this)."""
    fields = dict(_FIELD.findall(block))
    key = _unescape(fields["Key"])
    if "%" in key or "+" in key:
        key = urllib.parse.unquote_plus(key)
    etag = _unescape(fields.get("ETag", ""))
    return ObjectMeta(key, int(fields["Size"]), etag or None, _timestamp(fields.get("LastModified", "")))


def _timestamp(iso: str) -> float:
    try:
        return dt.datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return 0.0


def _error_for(status: int, body: str, what: str) -> DatasyncError:
    code = next(iter(_xml_values(body, "Code")), "")
    message = f"{what}: HTTP {status} {code}".strip()
    if status in (401, 403):
        return AccessDenied(message)
    if status == 404:
        return ObjectNotFound(message)
    if status >= 500 or status in (408, 429):
        return StoreUnavailable(message)
    err = DatasyncError(message)
    err.retryable = False
    return err


class S3Requests:
    """Signed requests against one bucket, all sent by one lean HTTP/1.1 connection pool per event loop
    (`datasync.http11`), over TCP for an http endpoint and TLS for an https one."""

    def __init__(
        self,
        endpoint: str,
        bucket: str,
        region: str,
        credentials: AwsCredentials,
        *,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._endpoint = endpoint.rstrip("/")
        self._bucket = bucket
        self._region = region
        self._credentials = credentials
        endpoint_parts = urllib.parse.urlsplit(self._endpoint)
        if endpoint_parts.scheme not in ("http", "https") or not endpoint_parts.hostname:
            raise ValueError(f"an S3 endpoint is an http:// or https:// URL with a host, not {endpoint!r}")
        https = endpoint_parts.scheme == "https"
        # https: the caller's context (a private CA), else the system's CAs; always verified.
        self._tls = (tls or ssl.create_default_context()) if https else None
        self._netloc = endpoint_parts.netloc
        self._bucket_path = f"{endpoint_parts.path}/{_quote(self._bucket)}/"
        self._address = (endpoint_parts.hostname, endpoint_parts.port or (443 if https else 80))
        self._pool: HttpPool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None

    def __repr__(self) -> str:
        return f"S3Requests(endpoint={self._endpoint!r}, bucket={self._bucket!r})"

    def object_url(self, key: str) -> str:
        """The URL of `key`, its path percent-encoded once (every byte but unreserved ones and '/')."""
        return f"{self._endpoint}/{_quote(self._bucket)}/{_quote(key, safe='-_.~/')}"

    async def _request(
        self,
        method: str,
        key: str,
        *,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        data: bytes | memoryview | None = None,
        what: str,
    ) -> tuple[str, Mapping[str, str]]:
        raw, reply_headers = await self._send(method, key, query=query, headers=headers, data=data, what=what)
        body = raw.decode("utf-8", errors="replace")
        # S3 reports some failures of a 200 response in its body (CompleteMultipartUpload, copy).
        if "<Error>" in body:
            raise _error_for(500, body, what)
        return body, reply_headers

    def _lean_pool(self) -> HttpPool:
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool_loop is not loop:
            host, port = self._address
            self._pool = HttpPool(
                host, port, host_header=self._netloc, max_connections=64, timeout_s=300.0, tls=self._tls
            )
            self._pool_loop = loop
        return self._pool

    async def _send(
        self,
        method: str,
        key: str,
        *,
        query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None,
        data: bytes | memoryview | None,
        what: str,
    ) -> tuple[bytes | bytearray, Mapping[str, str]]:
        """One signed request; the reply's body and headers (lower-case names)."""
        pool = self._lean_pool()
        # The path as `object_url` has it, without building and parsing the URL back; the query in
        # SigV4's canonical form, sent exactly as signed.
        path = self._bucket_path + _quote(key, safe="-_.~/")
        query_string = canonical_query(query) if query else ""
        signed = _sign(
            method, self._netloc, path, query_string, headers or {}, self._credentials, self._region,
            _amz_date_now(),
        )  # fmt: skip
        target = f"{path}?{query_string}" if query_string else path
        try:
            response = await pool.request(method, target, signed.items(), data)
        except TlsError as e:
            # The same certificate would be met again: not retryable, and it names the endpoint.
            err = DatasyncError(f"{what}: {e}")
            err.retryable = False
            raise err from e
        except HttpClientError as e:
            raise StoreUnavailable(f"{what}: {type(e).__name__}") from e
        if response.status >= 300:
            raise _error_for(response.status, response.body.decode("utf-8", errors="replace"), what)
        return response.body, response.headers

    async def create_multipart(self, key: str) -> str:
        body, _ = await self._request("POST", key, query={"uploads": ""}, what=f"create upload {key}")
        ids = _xml_values(body, "UploadId")
        if not ids:
            raise StoreUnavailable(f"create upload {key}: no UploadId in the reply")
        return ids[0]

    async def put_part(
        self, key: str, upload_id: str, part_number: int, data: bytes | memoryview
    ) -> PartInfo:
        query = {"partNumber": str(part_number), "uploadId": upload_id}
        _, headers = await self._request(
            "PUT", key, query=query, data=data, what=f"put part {part_number} of {key}"
        )
        return PartInfo(part_number, headers.get("etag", ""), len(data))

    async def list_parts(self, key: str, upload_id: str) -> list[PartInfo]:
        parts: list[PartInfo] = []
        marker = "0"
        while True:
            query = {"uploadId": upload_id, "part-number-marker": marker}
            body, _ = await self._request("GET", key, query=query, what=f"list parts of {key}")
            for block in _xml_values(body, "Part"):
                number = int(_xml_values(block, "PartNumber")[0])
                etag = _xml_values(block, "ETag")[0].replace("&#34;", '"').replace("&quot;", '"')
                parts.append(PartInfo(number, etag, int(_xml_values(block, "Size")[0])))
            if _xml_values(body, "IsTruncated")[:1] != ["true"]:
                return parts
            marker = _xml_values(body, "NextPartNumberMarker")[0]

    async def complete_multipart(self, key: str, upload_id: str, parts: Sequence[PartInfo]) -> str | None:
        xml = "".join(
            f"<Part><PartNumber>{p.part_number}</PartNumber><ETag>{p.etag}</ETag></Part>"
            for p in sorted(parts, key=lambda p: p.part_number)
        )
        body, _ = await self._request(
            "POST",
            key,
            query={"uploadId": upload_id},
            data=f"<CompleteMultipartUpload>{xml}</CompleteMultipartUpload>".encode(),
            what=f"complete upload of {key}",
        )
        etags = _xml_values(body, "ETag")
        return etags[0].replace("&#34;", '"').replace("&quot;", '"') if etags else None

    async def abort_multipart(self, key: str, upload_id: str) -> None:
        with contextlib.suppress(ObjectNotFound):
            await self._request("DELETE", key, query={"uploadId": upload_id}, what=f"abort upload of {key}")

    async def copy_object(self, src_bucket: str, src_key: str, dst_key: str) -> str | None:
        source = f"/{_quote(src_bucket)}/{_quote(src_key, safe='-_.~/')}"
        body, _ = await self._request(
            "PUT", dst_key, headers={"x-amz-copy-source": source}, what=f"copy {src_key} to {dst_key}"
        )
        etags = _xml_values(body, "ETag")
        return etags[0].replace("&#34;", '"').replace("&quot;", '"') if etags else None

    async def list_objects(self, prefix: str) -> AsyncIterator[list[ObjectMeta]]:
        """ListObjectsV2 pages with `encoding-type=url`: keys come percent-encoded, so a key with a control
        character (which XML 1.0 cannot carry) or a newline, or one ending in '/', arrives exactly."""
        token: str | None = None
        while True:
            query = {"list-type": "2", "prefix": prefix, "encoding-type": "url", "max-keys": "1000"}
            if token is not None:
                query["continuation-token"] = token
            body, _ = await self._request("GET", "", query=query, what=f"list {prefix!r}")
            page = [_object_meta(block) for block in _CONTENTS.findall(body)]
            yield page
            tokens = _xml_values(body, "NextContinuationToken")
            if _xml_values(body, "IsTruncated")[:1] != ["true"] or not tokens:
                return
            token = _unescape(tokens[0])

    async def get_object(
        self, key: str, start: int | None = None, end: int | None = None
    ) -> bytes | memoryview:
        """The object's bytes (a large body is the client's own buffer, as a view: never copied)."""
        headers = {}
        if start is not None or end is not None:
            headers["range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
        raw, _ = await self._send("GET", key, headers=headers, data=None, what=f"get {key!r}")
        return raw if isinstance(raw, bytes) else memoryview(raw)

    async def put_object(self, key: str, data: bytes | memoryview) -> str | None:
        _, headers = await self._send("PUT", key, headers=None, data=data, what=f"put {key!r}")
        return headers.get("etag")

    async def delete_object(self, key: str) -> None:
        with contextlib.suppress(ObjectNotFound):
            await self._request("DELETE", key, what=f"delete {key!r}")

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        self._pool = None

    def info(self) -> dict[str, Any]:
        return {"endpoint": self._endpoint, "bucket": self._bucket, "region": self._region}
