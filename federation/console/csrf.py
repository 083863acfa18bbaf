"""Cross-site request forgery: what every POST must show before it changes anything.

Two checks, both required: the form's `csrf` field equals the session's token (a cross-site page
cannot read it), and an `Origin` header, when the browser sends one, is the console's own origin.
SameSite=Strict on the cookie is a third line, not relied on alone.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from federation.console.layout import SECURITY_HEADERS

FIELD = "csrf"


def own_origin(request: web.Request) -> str:
    return f"{request.scheme}://{request.host}"


def origin_ok(request: web.Request) -> bool:
    """No Origin header (older browsers, curl) passes; any other origin, `null` included, does not."""
    origin = request.headers.get("Origin")
    if origin is None:
        return request.headers.get("Sec-Fetch-Site", "same-origin") in ("same-origin", "none")
    return hmac.compare_digest(origin.lower(), own_origin(request).lower())


def token_ok(expected: str, given: object) -> bool:
    if not isinstance(given, str) or not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def refused() -> web.Response:
    return web.Response(
        text="Refused: CSRF check failed (reload the page and try again).",
        status=403,
        content_type="text/plain",
        headers=SECURITY_HEADERS,
    )
