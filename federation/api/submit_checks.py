"""Checks of a parsed job against its tenant's record, made at submission after the tenant is known.

Kept apart from `service.py` so that policy on what a tenant may submit (pod security, templates)
grows here without touching the servicer.
"""

from __future__ import annotations

from federation.spec.jobspec import TrainingJobSpec
from federation.store.records import SchedulingSettings, TenantRecord


def check_submission(
    spec: TrainingJobSpec, tenant: TenantRecord, settings: SchedulingSettings
) -> TrainingJobSpec:
    """The spec to store for `tenant`, or InvalidSpec naming the field that the tenant may not use."""
    del tenant, settings  # no tenant-specific policy yet
    return spec
