"""The CSRF checks every console POST passes: the session's token, and the request's own origin."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import make_mocked_request

from federation.console.csrf import origin_ok, own_origin, refused, token_ok


def _request(headers: dict[str, str]) -> object:
    return make_mocked_request("POST", "/jobs/x/cancel", headers={"Host": "127.0.0.1:9464", **headers})


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ({}, True),
        ({"Origin": "http://127.0.0.1:9464"}, True),
        ({"Origin": "HTTP://127.0.0.1:9464"}, True),
        ({"Origin": "http://127.0.0.1:9465"}, False),
        ({"Origin": "http://evil.example"}, False),
        ({"Origin": "https://127.0.0.1:9464"}, False),
        ({"Origin": "null"}, False),
        ({"Sec-Fetch-Site": "cross-site"}, False),
        ({"Sec-Fetch-Site": "same-site"}, False),
        ({"Sec-Fetch-Site": "same-origin"}, True),
    ],
    ids=[
        "no-origin",
        "own-origin",
        "own-origin-upper-case",
        "other-port",
        "other-site",
        "other-scheme",
        "null-origin",
        "fetch-cross-site",
        "fetch-same-site",
        "fetch-same-origin",
    ],
)
def test_origin(headers: dict[str, str], ok: bool) -> None:
    request = _request(headers)
    assert own_origin(request) == "http://127.0.0.1:9464"  # type: ignore[arg-type]
    assert origin_ok(request) is ok  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expected", "given", "ok"),
    [
        ("abc123", "abc123", True),
        ("abc123", "abc124", False),
        ("abc123", "", False),
        ("abc123", None, False),
        ("", "", False),
        ("abc123", "abc1234", False),
    ],
    ids=["equal", "different", "empty", "missing", "no-session-token", "longer"],
)
def test_token(expected: str, given: object, ok: bool) -> None:
    assert token_ok(expected, given) is ok


def test_a_refusal_says_csrf_with_403() -> None:
    response = refused()
    assert response.status == 403
    assert response.text is not None
    assert "CSRF" in response.text
