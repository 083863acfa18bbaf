"""Issue 30, item 9, at the API's one error mapping (`CallHandlers.unary`): an error naming
infrastructure, or an exception nothing translated, reaches a member as a plain sentence and an
admin whole; a caller whose token could not be checked (the store is what is down) is told nothing
more than a member."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from federation.api.service import CallHandlers
from federation.errors import StoreUnavailable
from federation.history.errors import HistoryUnavailable
from federation.metrics import Metrics
from federation.security.auth import Authenticator, Principal
from federation.store.job_store import InMemoryJobStore
from federation.store.records import Role, UserRecord
from placement.model import TenantId

DETAIL = 'connection to server at "10.1.2.3", port 5432 failed: Connection refused'


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class Context:
    def __init__(self, token: str) -> None:
        self._token = token

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self._token}"),)

    def peer(self) -> str:
        return "ipv4:10.0.0.9:40000"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


class DownStore:
    """A store whose token lookups fail as etcd's do when it is gone."""

    async def resolve_token(self, token: str) -> UserRecord | None:
        raise StoreUnavailable("get: etcd at 10.9.8.7:2379 did not answer: UNAVAILABLE")


@pytest.fixture
async def handlers() -> CallHandlers:
    store = InMemoryJobStore()
    await store.put_user(UserRecord("alice", TenantId("vision"), Role.MEMBER))
    await store.put_user(UserRecord("root", TenantId("platform"), Role.ADMIN))
    await store.put_token("alice-token", "alice")
    await store.put_token("root-token", "root")
    return CallHandlers(Authenticator(store), Metrics())


async def _refusal(handlers: CallHandlers, token: str, error: Exception) -> Aborted:
    async def body(_who: Principal, _req: Any) -> None:
        raise error

    with pytest.raises(Aborted) as aborted:
        await handlers.unary("GetJob", None, Context(token), body)  # type: ignore[arg-type]
    return aborted.value


@pytest.mark.parametrize(
    "error", [HistoryUnavailable(f"history database: {DETAIL}"), StoreUnavailable(f"txn: etcd at {DETAIL}")]
)
async def test_a_member_reads_no_store_detail_and_an_admin_does(
    handlers: CallHandlers, error: Exception
) -> None:
    member = await _refusal(handlers, "alice-token", error)
    assert member.code == grpc.StatusCode.UNAVAILABLE
    assert "10.1.2.3" not in member.details
    assert "5432" not in member.details
    assert "unavailable" in member.details
    admin = await _refusal(handlers, "root-token", error)
    assert admin.code == grpc.StatusCode.UNAVAILABLE
    assert DETAIL in admin.details


async def test_an_untranslated_exception_is_internal_without_its_text_for_a_member(
    handlers: CallHandlers,
) -> None:
    error = RuntimeError(f"psycopg.OperationalError: {DETAIL}")
    member = await _refusal(handlers, "alice-token", error)
    assert member.code == grpc.StatusCode.INTERNAL
    assert "10.1.2.3" not in member.details
    assert "psycopg" not in member.details
    admin = await _refusal(handlers, "root-token", error)
    assert admin.code == grpc.StatusCode.INTERNAL
    assert DETAIL in admin.details


async def test_a_caller_the_down_store_could_not_identify_reads_no_endpoint() -> None:
    handlers = CallHandlers(Authenticator(DownStore()), Metrics())  # type: ignore[arg-type]

    async def body(_who: Principal, _req: Any) -> None:
        raise AssertionError("not reached: the caller is unknown")

    with pytest.raises(Aborted) as aborted:
        await handlers.unary("WhoAmI", None, Context("root-token"), body)  # type: ignore[arg-type]
    assert aborted.value.code == grpc.StatusCode.UNAVAILABLE
    assert "10.9.8.7" not in aborted.value.details
