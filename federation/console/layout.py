"""The page frame every console page shares, HTML escaping, and the headers every answer carries.

Pages build their HTML as strings; anything that came from the store or the request goes through
`e` first. No inline script or style anywhere: the Content-Security-Policy forbids them, so that an
escaping slip cannot become script.
"""

from __future__ import annotations

import html
import time
from collections.abc import Collection, Sequence
from importlib import resources
from urllib.parse import urlencode

from aiohttp import web

from federation.console.view import View

ALL_ROLES = frozenset({"admin", "infra", "member", "finance"})
# (page, path, label, the roles whose API calls the page makes may succeed): a link is shown only
# to a role that page answers with content, never one that leads to the 404 page (issue 30).
NAV: tuple[tuple[str, str, str, frozenset[str]], ...] = (
    ("jobs", "/jobs", "Jobs", frozenset({"admin", "infra", "member"})),
    ("sets", "/sets", "Job sets", frozenset({"admin", "infra", "member"})),
    ("queues", "/queues", "Queues", ALL_ROLES),
    ("clusters", "/clusters", "Clusters", ALL_ROLES),
    ("capacity", "/capacity", "Capacity", frozenset({"admin", "infra", "finance"})),
    ("finance", "/finance", "Finance", frozenset({"member", "finance"})),
    ("approvals", "/approvals", "Approvals", ALL_ROLES),
    ("tenants", "/tenants", "Tenants", ALL_ROLES),
)


def home_of(role: str) -> str:
    """Where a role lands after sign-in: finance on its spend (it may not list jobs), the others
    on the first page of the navigation they may use."""
    if role == "finance":
        return "/finance"
    for _, href, _, roles in NAV:
        if role in roles:
            return href
    return "/queues"


def nav_for(role: str) -> tuple[tuple[str, str, str], ...]:
    return tuple((name, href, label) for name, href, label, roles in NAV if role in roles)


SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    # Pages show one user's data: no shared cache may keep them.
    "Cache-Control": "no-store",
}


def e(value: object) -> str:
    """`value` as text safe inside an element or a quoted attribute."""
    return html.escape(str(value), quote=True)


def _stylesheets() -> tuple[str, ...]:
    # console.css first; any other sheet in static/ (charts.css) after it, so it may refine it.
    folder = resources.files("federation.console") / "static"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".css") and p.name != "console.css")
    return ("console.css", *names)


STYLESHEETS = _stylesheets()


def _head(title: str) -> str:
    links = "".join(f'<link rel="stylesheet" href="/static/{e(name)}">' for name in STYLESHEETS)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)} · gpufed</title>{links}"
        '<script src="/static/console.js" defer></script></head>'
    )


def render_page(view: View, *, page: str, title: str, body: str) -> str:
    """A whole page: header with the navigation and who is signed in, then `main#page-<page>`.
    `body` is HTML already escaped by the page."""
    current = ' aria-current="page"'
    items = "".join(
        f'<li><a href="{href}"{current if name == page else ""}>{label}</a></li>'
        for name, href, label in nav_for(view.role)
    )
    return (
        f"{_head(title)}<body>"
        f'<a class="skip-link" href="#page-{e(page)}">Skip to content</a>'
        '<header class="top"><span class="brand">gpufed</span>'
        f'<nav id="nav" aria-label="Console"><ul>{items}</ul></nav>'
        f'<span id="whoami">{e(view.user)} ({e(view.tenant)}, {e(view.role)})</span>'
        '<form id="logout" method="post" action="/logout">'
        f'<input type="hidden" name="csrf" value="{e(view.csrf)}">'
        '<button type="submit">Sign out</button></form></header>'
        f'<main id="page-{e(page)}" tabindex="-1"><h1>{e(title)}</h1>{body}</main>'
        "</body></html>"
    )


def render_bare(*, page: str, title: str, body: str) -> str:
    """A page for someone not signed in (the sign-in form): no navigation, no identity."""
    return (
        f"{_head(title)}<body>"
        f'<a class="skip-link" href="#page-{e(page)}">Skip to content</a>'
        '<header class="top"><span class="brand">gpufed</span></header>'
        f'<main id="page-{e(page)}" tabindex="-1"><h1>{e(title)}</h1>{body}</main>'
        "</body></html>"
    )


def html_response(text: str, status: int = 200) -> web.Response:
    """An HTML answer with the console's security headers."""
    return web.Response(text=text, status=status, content_type="text/html", headers=SECURITY_HEADERS)


def not_found_page(view: View | None, what: str = "page") -> web.Response:
    """The one answer for an unknown id and for another tenant's: same words, same status."""
    home = "/jobs" if view is None else home_of(view.role)
    body = f'<p class="error" role="alert">No such {e(what)}.</p><p><a href="{e(home)}">Back</a></p>'
    title = "Not found"
    text = (
        render_page(view, page="not-found", title=title, body=body)
        if view is not None
        else render_bare(page="not-found", title=title, body=body)
    )
    return html_response(text, status=404)


def error_page(view: View, message: str, status: int) -> web.Response:
    body = f'<p class="error" role="alert">{e(message)}</p>'
    return html_response(render_page(view, page="error", title="Refused", body=body), status=status)


def when(seconds: float) -> str:
    """A time for people, in UTC (the server's and every user's same clock); empty for none."""
    if seconds <= 0:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds)) + " UTC"


def query_string(params: dict[str, str]) -> str:
    """`?a=1&b=2` of the non-empty parameters (escape it with `e` before putting it in HTML)."""
    kept = {k: v for k, v in params.items() if v}
    return "?" + urlencode(kept) if kept else ""


def table(headers: Sequence[str], rows: str, *, numeric: Collection[str] = (), attrs: str = "") -> str:
    """A table with a header row; `rows` is already-escaped `<tr>` HTML, `attrs` trusted attributes."""
    num = ' class="num"'
    head = "".join(f'<th scope="col"{num if h in numeric else ""}>{e(h)}</th>' for h in headers)
    return f"<table{attrs}><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def see_other(location: str) -> web.Response:
    """A 303 to `location` (a path of ours): after a POST, and to the sign-in page."""
    return web.Response(status=303, headers={**SECURITY_HEADERS, "Location": location})
