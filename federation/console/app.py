"""The console's aiohttp application: sign-in, the pages, `/metrics` and the static files.

One middleware stands between the browser and every page: it finds the session from the cookie,
re-checks its token with WhoAmI (so a revoked token or a changed role shows at the next request),
refuses a POST that fails the CSRF checks, and turns the servicers' refusals into pages (another
tenant's job is the same 404 as a missing one).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from federation.api.v1 import gpufed_pb2 as pb
from federation.console import (
    approvals,
    capacity,
    clusters,
    csrf,
    finance,
    job,
    jobs,
    jobsets,
    queues,
    tenants,
)
from federation.console.calls import CALLS_KEY, TOKEN_KEY, CallRefused, ConsoleCalls, peer_of
from federation.console.layout import (
    SECURITY_HEADERS,
    e,
    error_page,
    home_of,
    html_response,
    not_found_page,
    render_bare,
    see_other,
)
from federation.console.session import (
    COOKIE_NAME,
    SESSION_KEY,
    SESSIONS_KEY,
    Session,
    SessionStore,
    clear_cookie,
    set_cookie,
)
from federation.console.view import VIEW_KEY, View
from federation.errors import StoreUnavailable

log = structlog.get_logger("gpufed.console")

STATIC_DIR = Path(__file__).parent / "static"
SECURE_KEY = web.AppKey("gpufed_console_secure", bool)
REGISTRY_KEY = web.AppKey("gpufed_console_registry", CollectorRegistry)
# Paths served to anyone: the sign-in form, the Prometheus scrape, the readiness probe, the style
# sheets and script.
PUBLIC_PREFIXES = ("/static/",)
PUBLIC_PATHS = frozenset({"/login", "/metrics", "/readyz", "/favicon.ico"})
# Refusals shown as a page with this status (the rest: 400).
STATUS_OF = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _wants_stream(request: web.Request) -> bool:
    return request.path.endswith("/events") or "text/event-stream" in request.headers.get("Accept", "")


def _to_login(request: web.Request, *, secure: bool) -> web.StreamResponse:
    if _wants_stream(request) or request.method != "GET":
        response = web.Response(text="signed out", status=401, headers=SECURITY_HEADERS)
    else:
        response = see_other("/login")
    if request.cookies.get(COOKIE_NAME):
        clear_cookie(response, secure=secure)
    return response


@web.middleware
async def signed_in(request: web.Request, handler: Handler) -> web.StreamResponse:
    path = request.path
    if path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES):
        return await handler(request)
    secure = request.app[SECURE_KEY]
    sessions = request.app[SESSIONS_KEY]
    try:
        session = await sessions.get(request.cookies.get(COOKIE_NAME))
    except StoreUnavailable as exc:
        # etcd is away: the session may well be alive, so it is kept; the page says so.
        log.warning("console_session_unreadable", error=str(exc))
        return web.Response(text="the store is unavailable; try again", status=503, headers=SECURITY_HEADERS)
    if session is None:
        return _to_login(request, secure=secure)
    calls = request.app[CALLS_KEY]
    try:
        who = await calls.call_token(session.token, peer_of(request), "WhoAmI", pb.WhoAmIRequest())
    except CallRefused as refusal:
        if refusal.code is grpc.StatusCode.UNAUTHENTICATED:
            log.info("console_session_ended", user=session.user, why=refusal.details)
            await sessions.end(session.session_id)
            return _to_login(request, secure=secure)
        # Too many failed sign-ins from this address, or the store is away: say so, keep the session.
        return web.Response(
            text=refusal.details, status=STATUS_OF.get(refusal.code, 503), headers=SECURITY_HEADERS
        )
    session.user, session.tenant, session.role = who.user, who.tenant, who.role
    view = View(
        user=who.user,
        tenant=who.tenant,
        role=who.role,
        is_admin=who.role == "admin",
        csrf=session.csrf,
        now_s=_now(),
    )
    request[VIEW_KEY] = view
    request[TOKEN_KEY] = session.token
    request[SESSION_KEY] = session
    if request.method == "POST":
        form = await request.post()
        if not (csrf.origin_ok(request) and csrf.token_ok(session.csrf, form.get(csrf.FIELD))):
            log.warning(
                "console_csrf_refused", user=who.user, path=path, origin=request.headers.get("Origin", "")
            )
            return csrf.refused()
    try:
        return await handler(request)
    except CallRefused as refusal:
        return await _refusal_page(request, session, view, refusal)


async def _refusal_page(
    request: web.Request, session: Session, view: View, refusal: CallRefused
) -> web.Response:
    if refusal.code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
        return not_found_page(view)
    if refusal.code is grpc.StatusCode.UNAUTHENTICATED:
        await request.app[SESSIONS_KEY].end(session.session_id)
        response = see_other("/login")
        clear_cookie(response, secure=request.app[SECURE_KEY])
        return response
    return error_page(view, refusal.details, STATUS_OF.get(refusal.code, 400))


def _now() -> float:
    return time.time()


# ---- sign-in


def login_form(error: str = "") -> str:
    message = f'<p class="error" role="alert">{e(error)}</p>' if error else ""
    return (
        f"{message}"
        '<form id="login" method="post" action="/login">'
        '<label for="token">Token</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>'
        '<p class="hint">The token <code>gpufed up</code> wrote for you (<code>tokens/&lt;user&gt;</code> '
        "in its state directory), or one an admin issued with <code>gpufed token issue</code>.</p>"
        '<button type="submit">Sign in</button></form>'
    )


async def login_get(request: web.Request) -> web.StreamResponse:
    session = await request.app[SESSIONS_KEY].get(request.cookies.get(COOKIE_NAME))
    if session is not None:
        return see_other(home_of(session.role))
    return html_response(render_bare(page="login", title="Sign in", body=login_form()))


async def login_post(request: web.Request) -> web.StreamResponse:
    # No session yet, so no CSRF token: a foreign Origin is refused (login CSRF).
    if not csrf.origin_ok(request):
        return csrf.refused()
    form = await request.post()
    token = form.get("token")
    token = token.strip() if isinstance(token, str) else ""
    if not token:
        return _login_failed("Give your token.")
    calls = request.app[CALLS_KEY]
    try:
        who = await calls.call_token(token, peer_of(request), "WhoAmI", pb.WhoAmIRequest())
    except CallRefused as refusal:
        log.info("console_sign_in_refused", code=refusal.code.name, peer=peer_of(request))
        return _login_failed(f"Sign-in refused: {refusal.details}.")
    sessions = request.app[SESSIONS_KEY]
    # A fresh id on every sign-in: an id planted before sign-in is never the signed-in one.
    await sessions.end(request.cookies.get(COOKIE_NAME))
    session = await sessions.create(token=token, user=who.user, tenant=who.tenant, role=who.role)
    log.info("console_signed_in", user=who.user, tenant=who.tenant, role=who.role)
    response = see_other(home_of(who.role))
    set_cookie(response, session, secure=request.app[SECURE_KEY])
    return response


def _login_failed(message: str) -> web.Response:
    return html_response(render_bare(page="login", title="Sign in", body=login_form(message)), status=401)


async def logout(request: web.Request) -> web.StreamResponse:
    session = request[SESSION_KEY]
    await request.app[SESSIONS_KEY].end(session.session_id)
    log.info("console_signed_out", user=session.user)
    response = see_other("/login")
    clear_cookie(response, secure=request.app[SECURE_KEY])
    return response


async def root(request: web.Request) -> web.StreamResponse:
    return see_other(home_of(request[VIEW_KEY].role))


async def metrics(request: web.Request) -> web.StreamResponse:
    body = generate_latest(request.app[REGISTRY_KEY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def favicon(request: web.Request) -> web.StreamResponse:
    # No icon: an empty answer rather than a 404 in every browser's console.
    return web.Response(status=204)


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    if request.path.startswith("/static/"):
        # The same for everyone and small: a browser may keep them a few minutes.
        response.headers.setdefault("Cache-Control", "public, max-age=300")
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


def build_app(
    calls: ConsoleCalls,
    *,
    registry: CollectorRegistry,
    secure: bool = False,
    sessions: SessionStore | None = None,
    readyz: Handler | None = None,
) -> web.Application:
    """The console with `/metrics`; `secure` when served over TLS (the cookie is then Secure);
    `readyz`, when given, answers `/readyz` to anyone (`federation.runtime.readiness`)."""
    app = web.Application(middlewares=[signed_in], client_max_size=256 * 1024)
    app[CALLS_KEY] = calls
    app[SESSIONS_KEY] = sessions or SessionStore()
    app[SECURE_KEY] = secure
    app[REGISTRY_KEY] = registry
    app.on_response_prepare.append(_headers)
    app.router.add_get("/", root)
    app.router.add_get("/login", login_get)
    app.router.add_post("/login", login_post)
    app.router.add_post("/logout", logout)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/favicon.ico", favicon)
    if readyz is not None:
        app.router.add_get("/readyz", readyz)
    app.router.add_static("/static/", STATIC_DIR, append_version=False)
    for module in (jobs, job, jobsets, approvals, queues, clusters, capacity, finance, tenants):
        module.add_routes(app)
    return app
