"""Console sessions live in etcd (issue 30, item 7): two servers sharing one etcd, and a restart.

A user signs in on one server; the same cookie works on a second server sharing the etcd and on the
first after a restart; signing out on one ends it on both. etcdctl, reading what etcd holds, finds
neither the session id nor the token (a reader of etcd could not sign in with it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from datasync.loopback_ports import free_port
from tests.e2e.console_harness import wait_for
from tests.e2e.harness import ServerProcess
from tests.etcdctl import etcdctl

pytestmark = pytest.mark.e2e


def etcdctl_json(endpoint: str, *args: str) -> dict[str, object]:
    found: dict[str, object] = json.loads(etcdctl(endpoint, *args, "-w", "json").stdout)
    return found


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


OPENER = urllib.request.build_opener(_NoRedirect)


def _call(
    url: str, *, cookie: str = "", form: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    data = None if form is None else urllib.parse.urlencode(form).encode()
    origin = "{0.scheme}://{0.netloc}".format(urllib.parse.urlsplit(url))
    request = urllib.request.Request(url, data=data, headers={"Origin": origin})
    if cookie:
        request.add_header("Cookie", f"gpufed_session={cookie}")
    try:
        with OPENER.open(request, timeout=10) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as answer:
        return answer.code, dict(answer.headers), answer.read().decode(errors="replace")


@pytest.fixture
def two(etcd: object, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    a = ServerProcess(endpoint, tmp_path / "a", identity="a", extra_args=("--metrics-port", str(free_port())))
    b = ServerProcess(endpoint, tmp_path / "b", identity="b", extra_args=("--metrics-port", str(free_port())))
    a.start()
    b.start()
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()


def _base(server: ServerProcess) -> str:
    port = server.extra_args[server.extra_args.index("--metrics-port") + 1]
    return f"http://127.0.0.1:{port}"


def test_a_session_works_on_both_servers_and_after_a_restart_and_ends_on_both(
    two: tuple[ServerProcess, ServerProcess], etcd: object
) -> None:
    a, b = two
    token = (a.state_dir / "tokens" / "alice.token").read_text().strip()
    status, headers, _ = _call(_base(a) + "/login", form={"token": token})
    assert status == 303
    found = re.search(r"gpufed_session=([^;]+)", headers.get("Set-Cookie", ""))
    assert found
    cookie = found.group(1)

    assert _call(_base(a) + "/queues", cookie=cookie)[0] == 200
    status, _, page = _call(_base(b) + "/queues", cookie=cookie)
    assert status == 200, "the second server does not know the session"
    assert "alice (vision, member)" in page

    # What etcd holds: a hash of the id as the key, and neither the id nor the token anywhere.
    endpoint = etcd.endpoint  # type: ignore[attr-defined]
    stored = etcdctl_json(endpoint, "get", "/gpufed/console/sessions/", "--prefix")
    kvs: list[dict[str, str]] = stored.get("kvs", [])  # type: ignore[assignment]
    assert len(kvs) == 1
    key = base64.b64decode(kvs[0]["key"]).decode()
    value = base64.b64decode(kvs[0]["value"]).decode()
    assert key.endswith(hashlib.sha256(cookie.encode()).hexdigest())
    assert cookie not in key + value
    assert token not in value
    assert kvs[0].get("lease"), "a session record without a lease would never expire"

    a.stop()
    a.start()
    assert _call(_base(a) + "/queues", cookie=cookie)[0] == 200, "a restart signed the user out"

    status, _, page = _call(_base(b) + "/queues", cookie=cookie)
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf
    assert _call(_base(b) + "/logout", cookie=cookie, form={"csrf": csrf.group(1)})[0] == 303
    status, headers, _ = _call(_base(a) + "/queues", cookie=cookie)
    assert status == 303
    assert headers.get("Location") == "/login"
    wait_for(
        lambda: not etcdctl_json(endpoint, "get", "/gpufed/console/sessions/", "--prefix").get("kvs"),
        timeout_s=5,
        what="the session record deleted",
    )
