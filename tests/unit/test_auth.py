"""Tenant isolation rules, role by role."""

from __future__ import annotations

import pytest

from federation.auth import (
    Principal,
    acting_tenant,
    bearer_token,
    check_read_job,
    check_write_job,
    listable_tenant,
)
from federation.errors import NotFound, PermissionDenied, Unauthenticated
from federation.records import Role
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
