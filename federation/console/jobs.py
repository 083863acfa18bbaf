"""Stub: replaced by its page."""

from __future__ import annotations

from aiohttp import web


def add_routes(app: web.Application) -> None:
    pass
