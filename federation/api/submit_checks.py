"""Checks of a parsed job against its tenant's record, made at submission after the tenant is known.

Kept apart from `service.py` so that policy on what a tenant may submit (pod security, templates)
grows here without touching the servicer.

Pod security: each task's pod, as gpufed will create it (its template with the short fields and
shmSize expanded), is held to the tenant's Pod Security Standards level, and the level is stored
with the job, so that the namespace on the member cluster is labelled with the level the pods were
checked against (`clusters.kubernetes.manifests.namespace_manifest`). An admin sets the level on the
tenant (`podSecurity:` in its document); a later change applies to jobs submitted after it.
"""

from __future__ import annotations

import json
from dataclasses import replace

from federation.errors import InvalidSpec
from federation.spec.gpu_request import check_gpu_request
from federation.spec.jobspec import TrainingJobSpec
from federation.spec.pod_security import Violation, check_pod
from federation.spec.pod_template import expanded_template
from federation.store.records import SchedulingSettings, TenantRecord

_SHORT_FORM = '{"spec":{"containers":[{}]}}'


def check_submission(
    spec: TrainingJobSpec, tenant: TenantRecord, settings: SchedulingSettings
) -> TrainingJobSpec:
    """The spec to store for `tenant`, or InvalidSpec naming the field that the tenant may not use."""
    # GPU type names against the federation's types, which the admin may extend (issue 32).
    check_gpu_request(spec, settings.gpu_registry())
    level = tenant.pod_security
    for i, task in enumerate(spec.tasks):
        # The short form alone makes a pod with one container and no security context, which the
        # restricted level refuses: such a task needs a template that says how it runs.
        text = expanded_template(task.template, task.shm_size or None) or _SHORT_FORM
        try:
            check_pod(json.loads(text), level)
        except Violation as violation:
            raise InvalidSpec(
                f"spec.tasks[{i}].template.{violation.field}",
                f"{violation.rule} (tenant {tenant.name!r} is at pod security level {level.value!r}; "
                "an admin sets it with the tenant's podSecurity)",
            ) from None
    return replace(spec, pod_security=level)
