"""Checks of a parsed job against its tenant's record, made at submission after the tenant is known.

Kept apart from `service.py` so that policy on what a tenant may submit (pod security, templates)
grows here without touching the servicer.

Pod security: each task's pod, as gpufed will create it (its template with the short fields and
shmSize expanded), is held to the tenant's Pod Security Standards level, and the level is stored
with the job, so that the namespace on the member cluster is labelled with the level the pods were
checked against (`clusters.kubernetes.manifests.namespace_manifest`). An admin sets the level on the
tenant (`podSecurity:` in its document); a later change applies to jobs submitted after it.

A pod's verdict depends on nothing but its text and the level, and a burst of submissions (a sweep,
a team's nightly jobs) repeats the same few templates thousands of times: verdicts are kept per
(tenant, text, level), for texts up to `_VERDICT_TEXT_MAX` characters (so the cache stays under a
few MiB). Per tenant, so that no tenant can tell, even by how fast it is answered, whether another
submitted a pod of the same text.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace

from federation.errors import InvalidSpec
from federation.spec.gpu_request import check_gpu_request
from federation.spec.jobspec import PodSecurityLevel, TrainingJobSpec
from federation.spec.pod_security import Violation, check_pod
from federation.spec.pod_template import expanded_template
from federation.store.records import SchedulingSettings, TenantRecord
from placement.model import TenantId

_SHORT_FORM = '{"spec":{"containers":[{}]}}'
_VERDICT_TEXT_MAX = 16 * 1024


def check_submission(
    spec: TrainingJobSpec,
    tenant: TenantRecord,
    settings: SchedulingSettings,
    *,
    acting: TenantId | None = None,
) -> TrainingJobSpec:
    """The spec to store for `tenant`, or InvalidSpec naming the field that the tenant may not use.

    `acting`, when given, becomes the stored spec's tenant in the same copy: a submission's spec is
    copied once, not once for its tenant and again for its level (each copy of a spec is 3 µs)."""
    # GPU type names against the federation's types, which the admin may extend (issue 32).
    check_gpu_request(spec, settings.gpu_registry())
    level = tenant.pod_security
    for i, task in enumerate(spec.tasks):
        # The short form alone makes a pod with one container and no security context, which the
        # restricted level refuses: such a task needs a template that says how it runs.
        text = expanded_template(task.template, task.shm_size or None) or _SHORT_FORM
        violation = (
            _kept_verdict(tenant.name, text, level)
            if len(text) <= _VERDICT_TEXT_MAX
            else _verdict(text, level)
        )
        if violation is not None:
            raise InvalidSpec(
                f"spec.tasks[{i}].template.{violation.field}",
                f"{violation.rule} (tenant {tenant.name!r} is at pod security level {level.value!r}; "
                "an admin sets it with the tenant's podSecurity)",
            )
    return replace(spec, tenant=spec.tenant if acting is None else acting, pod_security=level)


def _verdict(text: str, level: PodSecurityLevel) -> Violation | None:
    """The first control of `level` the pod (as JSON text) breaks, or None."""
    try:
        check_pod(json.loads(text), level)
    except Violation as violation:
        # Kept without its traceback, which would hold the decoded template and the frames.
        return violation.with_traceback(None)
    return None


@functools.lru_cache(maxsize=256)
def _kept_verdict(tenant: str, text: str, level: PodSecurityLevel) -> Violation | None:
    """`_verdict`, kept per tenant (a Violation is read for its field and rule, never raised again)."""
    return _verdict(text, level)
