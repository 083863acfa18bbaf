"""Which priority classes a submission may use: the class exists, and neither the tenant's nor the
user's highest class is exceeded. Urgent itself is open to anyone allowed that high: the placer
admits it only under an admin's approval."""

from __future__ import annotations

import pytest

from federation.api.service import check_priority_class
from federation.errors import InvalidSpec, PermissionDenied
from federation.security.auth import Principal
from federation.store.records import Role, SchedulingSettings, TenantRecord
from placement.model import TenantId

SETTINGS = SchedulingSettings()


def _who(max_class: str | None = None) -> Principal:
    return Principal("ivan", TenantId("vision"), Role.MEMBER, max_priority_class=max_class)


def _tenant(max_class: str | None = None) -> TenantRecord:
    return TenantRecord(TenantId("vision"), max_priority_class=max_class)


@pytest.mark.parametrize(
    ("user_max", "tenant_max", "wanted", "error", "names"),
    [
        pytest.param(None, None, "urgent", None, "", id="urgent-is-open-the-placer-waits-for-approval"),
        pytest.param("normal", None, "normal", None, "", id="at-the-users-limit"),
        pytest.param("normal", None, "high", PermissionDenied, "user ivan", id="above-the-users-limit"),
        pytest.param(None, "high", "urgent", PermissionDenied, "tenant vision", id="above-the-tenants-limit"),
        pytest.param(None, None, "royal", InvalidSpec, "spec.priorityClassName", id="unknown-class"),
    ],
)
def test_class_limits(
    user_max: str | None, tenant_max: str | None, wanted: str, error: type[Exception] | None, names: str
) -> None:
    if error is None:
        assert (
            check_priority_class(_who(user_max), _tenant(tenant_max), SETTINGS, wanted)
            == SETTINGS.class_values()[wanted]
        )
        return
    with pytest.raises(error) as raised:
        check_priority_class(_who(user_max), _tenant(tenant_max), SETTINGS, wanted)
    assert names in str(raised.value)
