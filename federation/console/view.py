"""Who is looking at a page: what every page renders its header and its forms with."""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True, slots=True)
class View:
    user: str
    tenant: str
    role: str
    is_admin: bool
    # The session's CSRF token, put in every form's hidden `csrf` field.
    csrf: str
    now_s: float


# Set by the sign-in middleware on every request it lets through to a page.
VIEW_KEY = web.RequestKey("gpufed_console_view", View)
