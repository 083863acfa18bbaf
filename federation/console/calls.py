"""Calls from the console to the servicers, in process, as the signed-in user.

A page never reads the store: it runs the same servicer method a gRPC client would, with a small
context whose metadata carries the session's bearer token. So every rule of the API (who may read
which tenant, redaction, read limits, audit) applies to the console unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import Any, NoReturn

import grpc
from aiohttp import web

from federation.api.v1 import gpufed_pb2_grpc as pb_grpc


class CallRefused(Exception):
    """A servicer refused the call: the status code and message it would have sent a gRPC client."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class CallContext:
    """Enough of `grpc.aio.ServicerContext` for the servicers: metadata, peer, abort."""

    def __init__(self, token: str, peer: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._peer = peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise CallRefused(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:  # pragma: no cover - servicers only abort
        pass

    def set_details(self, details: str) -> None:  # pragma: no cover
        pass


def _servicer_bases() -> list[type]:
    return [
        cls
        for name, cls in vars(pb_grpc).items()
        if name.endswith("Servicer") and inspect.isclass(cls) and cls.__module__ == pb_grpc.__name__
    ]


class ConsoleCalls:
    """The servicers, by method name (method names are unique across gpufed's services)."""

    def __init__(self, servicers: Iterable[object]) -> None:
        self._methods: dict[str, Callable[..., Any]] = {}
        bases = _servicer_bases()
        for servicer in servicers:
            for base in bases:
                if not isinstance(servicer, base):
                    continue
                for name, _ in inspect.getmembers(base, inspect.isfunction):
                    if name[:1].isupper():
                        self._methods[name] = getattr(servicer, name)

    def has(self, method_name: str) -> bool:
        return method_name in self._methods

    def _method(self, method_name: str) -> Callable[..., Any]:
        try:
            return self._methods[method_name]
        except KeyError:
            raise CallRefused(grpc.StatusCode.UNIMPLEMENTED, f"{method_name} is not served here") from None

    async def call_token(self, token: str, peer: str, method_name: str, message: Any) -> Any:
        """A unary call with this token (sign-in uses it, before there is a session)."""
        method = self._method(method_name)
        result = method(message, CallContext(token, peer))
        if not isinstance(result, Awaitable):  # pragma: no cover - every unary servicer is async
            raise TypeError(f"{method_name} is not a unary call")
        return await result

    async def call(self, request: web.Request, method_name: str, message: Any) -> Any:
        """A unary call as the request's signed-in user."""
        token, peer = _identity(request)
        return await self.call_token(token, peer, method_name, message)

    def stream_token(
        self, token: str, peer: str, method_name: str, message: Any
    ) -> AsyncGenerator[Any, None]:
        """A server-streaming call (WatchJobs, StreamLogs) with this token."""
        method = self._method(method_name)
        result: AsyncGenerator[Any, None] = method(message, CallContext(token, peer))
        return result

    def stream(self, request: web.Request, method_name: str, message: Any) -> AsyncGenerator[Any, None]:
        token, peer = _identity(request)
        return self.stream_token(token, peer, method_name, message)


# The session's token and the browser's address, put on the request by the sign-in middleware.
TOKEN_KEY = web.RequestKey("gpufed_console_token", str)


def peer_of(request: web.Request) -> str:
    return f"console:{request.remote or ''}"


def _identity(request: web.Request) -> tuple[str, str]:
    token = request.get(TOKEN_KEY)
    if not token:
        raise CallRefused(grpc.StatusCode.UNAUTHENTICATED, "not signed in")
    return token, peer_of(request)


CALLS_KEY = web.AppKey("gpufed_console_calls", ConsoleCalls)
