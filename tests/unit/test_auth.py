"""Tenant isolation rules, role by role."""

from __future__ import annotations

import asyncio

import pytest

from federation.api.streams import StreamGuard
from federation.errors import NotFound, PermissionDenied, Unauthenticated
from federation.security.auth import (
    TOKEN_CACHE_TTL_S,
    Authenticator,
    Principal,
    acting_tenant,
    bearer_token,
    check_read_job,
    check_write_job,
    job_not_found,
    listable_tenant,
)
from federation.store.job_store import InMemoryJobStore, KvStore
from federation.store.records import Role, UserRecord
from placement.model import TenantId

VISION, NLP = TenantId("vision"), TenantId("nlp")


def who(role: Role, tenant: TenantId = VISION) -> Principal:
    return Principal(user="u", tenant=tenant, role=role)


def submit_tenant(principal: Principal, requested: TenantId | None) -> TenantId:
    """The tenant SubmitJob charges, as the service asks for it."""
    return acting_tenant(principal, requested, action="submit jobs", field="spec.tenant")


# (role, job's tenant) -> (may read, may write)
MATRIX = [
    pytest.param(Role.MEMBER, VISION, True, True, id="member-own-tenant"),
    pytest.param(Role.MEMBER, NLP, False, False, id="member-other-tenant"),
    pytest.param(Role.ADMIN, NLP, True, True, id="admin-any-tenant"),
    pytest.param(Role.INFRA, NLP, True, False, id="infra-reads-only"),
    pytest.param(Role.FINANCE, VISION, False, False, id="finance-no-jobs"),
]


@pytest.mark.parametrize(("role", "tenant", "may_read", "may_write"), MATRIX)
def test_job_access_by_role_and_tenant(role: Role, tenant: TenantId, may_read: bool, may_write: bool) -> None:
    principal = who(role)
    if may_read:
        check_read_job(principal, tenant)
    else:
        with pytest.raises(NotFound):
            check_read_job(principal, tenant)
    if may_write:
        check_write_job(principal, tenant)
    else:
        with pytest.raises((NotFound, PermissionDenied)):
            check_write_job(principal, tenant)


@pytest.mark.parametrize(
    ("role", "requested", "expected"),
    [
        pytest.param(Role.MEMBER, None, VISION, id="member-default-own"),
        pytest.param(Role.MEMBER, VISION, VISION, id="member-explicit-own"),
        pytest.param(Role.ADMIN, NLP, NLP, id="admin-for-another"),
    ],
)
def test_submit_tenant(role: Role, requested: TenantId | None, expected: TenantId) -> None:
    assert submit_tenant(who(role), requested) == expected


@pytest.mark.parametrize("role", [Role.INFRA, Role.FINANCE], ids=str)
def test_only_members_and_admins_submit(role: Role) -> None:
    with pytest.raises(PermissionDenied):
        submit_tenant(who(role), None)


def test_members_submit_only_to_their_tenant() -> None:
    with pytest.raises(PermissionDenied, match=r"spec\.tenant"):
        submit_tenant(who(Role.MEMBER), NLP)


def test_list_filters() -> None:
    assert listable_tenant(who(Role.MEMBER), "") == VISION
    assert listable_tenant(who(Role.ADMIN), "") is None
    assert listable_tenant(who(Role.ADMIN), "nlp") == NLP
    with pytest.raises(PermissionDenied):
        listable_tenant(who(Role.MEMBER), "nlp")
    with pytest.raises(PermissionDenied):
        listable_tenant(who(Role.FINANCE), "")


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param((), id="missing"),
        pytest.param((("authorization", "Basic abc"),), id="wrong-scheme"),
        pytest.param((("authorization", "Bearer "),), id="empty"),
        pytest.param((("authorization", "Bearer " + "x" * 600),), id="too-long"),
    ],
)
def test_bad_authorization_metadata_is_unauthenticated(metadata: tuple[tuple[str, str], ...]) -> None:
    with pytest.raises(Unauthenticated):
        bearer_token(metadata)


def test_bearer_token_is_read() -> None:
    assert bearer_token((("x-other", "1"), ("Authorization", "Bearer  tok "))) == "tok"


def test_a_job_the_caller_may_not_read_is_worded_as_a_missing_one() -> None:
    with pytest.raises(NotFound) as hidden:
        check_read_job(who(Role.MEMBER), NLP, "train-0badc0de")
    assert str(hidden.value) == job_not_found("train-0badc0de") == "job 'train-0badc0de' not found"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _guarded(store: KvStore, clock: Clock) -> StreamGuard:
    auth = Authenticator(store, clock=clock)
    metadata = (("authorization", "Bearer tok"),)
    principal = asyncio.run(auth.authenticate(metadata))
    return StreamGuard(auth, metadata, principal, clock=clock)


def _store() -> KvStore:
    store = InMemoryJobStore()
    asyncio.run(store.put_user(UserRecord("carol", VISION, Role.MEMBER)))
    asyncio.run(store.put_token("tok", "carol"))
    return store


def test_a_stream_guard_ends_a_revoked_stream_within_the_token_cache_ttl() -> None:
    store, clock = _store(), Clock()
    guard = _guarded(store, clock)
    asyncio.run(store.revoke_token("tok"))
    refused_after = None
    for step in range(1, 100):
        clock.now += 0.1
        try:
            asyncio.run(guard.check())
        except Unauthenticated:
            refused_after = step * 0.1
            break
    assert refused_after is not None
    assert refused_after <= TOKEN_CACHE_TTL_S


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        pytest.param(UserRecord("carol", NLP, Role.MEMBER), True, id="moved-tenant"),
        pytest.param(UserRecord("carol", VISION, Role.FINANCE), True, id="new-role"),
        pytest.param(UserRecord("carol", VISION, Role.MEMBER, "low"), False, id="class-limit-only"),
    ],
)
def test_a_stream_guard_ends_a_stream_whose_user_changed_tenant_or_role(
    change: UserRecord, refused: bool
) -> None:
    store, clock = _store(), Clock()
    guard = _guarded(store, clock)
    asyncio.run(store.put_user(change))
    clock.now += TOKEN_CACHE_TTL_S
    if refused:
        with pytest.raises(PermissionDenied, match="open it again"):
            asyncio.run(guard.check())
    else:
        asyncio.run(guard.check())
