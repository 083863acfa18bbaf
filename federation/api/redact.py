"""What a reply may say about other tenants: redaction at the API edge, by the caller's rights.

The scheduler and the reconcilers write their reasons for everyone (an admin debugging a preemption
needs the preempting job's id; a member waiting on its parent's cap is told the parent's figures).
What leaves the API is cut to what the caller may read: a member is told that a job of another
tenant preempted its job, or that an ancestor tenant's cap holds it back, but not which job, nor
that tenant's name or usage, from which it could work out a sibling tenant's usage. The reason
itself (the code, the GPU type, what the job needs) always stays, so the caller still knows why.
Admins and infra read every tenant and get every reason as written.

Errors are cut the same way (`error_text`): a store that did not answer names its host and port, a
database driver its DSN's host and its own words. Only an admin reads those; anyone else (including
a caller whose token could not be checked, because the store is the one down) reads what failed and
that a retry may help. The server's log keeps the whole message for the admins.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from federation.errors import GpufedError
from federation.security.auth import Principal, can_read_tenant
from federation.store.jobs import JobRecord
from placement.model import JobId, TenantId
from placement.model_plan import WaitCode, WaitReason

# How the reconcilers name the job a preemption was for (`federation.scheduling.reconciler`): "preempted for
# <job id>: <reason>" and "preempted for <job id> (<reason>)". Job ids are DNS labels.
_PREEMPTED_FOR = re.compile(r"preempted for ([a-z0-9][-a-z0-9]*)")
OTHER_JOB = "a job of another tenant"
OTHER_TENANT = "a parent tenant you cannot read"


INTERNAL_ERROR = "internal error; the server's log says what failed"


def error_text(error: BaseException, who: Principal | None) -> str:
    """What the caller (None: not yet known) reads of an error: infrastructure detail for admins only."""
    admin = who is not None and who.is_admin
    if isinstance(error, GpufedError):
        if error.public_message is None or admin:
            return str(error)
        return error.public_message
    # Not one of federation's errors: a bug, or a library's exception nothing translated (a driver's
    # text, with hosts and paths). gRPC would send its repr as UNKNOWN; it is INTERNAL, said plainly.
    return f"{INTERNAL_ERROR}: {type(error).__name__}: {error}" if admin else INTERNAL_ERROR


class Redactor:
    """Cuts one caller's replies; `tenant_of` says whose a job is (None: unknown, so unreadable)."""

    def __init__(self, who: Principal, tenant_of: Callable[[JobId], TenantId | None]) -> None:
        self._who = who
        self._tenant_of = tenant_of

    def _readable(self, tenant: TenantId | None) -> bool:
        return tenant is not None and can_read_tenant(self._who, tenant)

    def text(self, text: str) -> str:
        if "preempted for " not in text:
            return text

        def named(match: re.Match[str]) -> str:
            if self._readable(self._tenant_of(JobId(match[1]))):
                return match[0]
            return f"preempted for {OTHER_JOB}"

        return _PREEMPTED_FOR.sub(named, text)

    def job(self, job: JobRecord) -> JobRecord:
        """The job with its message and history cut to what the caller may read."""
        message = self.text(job.message)
        events = tuple(
            e if (reason := self.text(e.reason)) == e.reason else replace(e, reason=reason)
            for e in job.events
        )
        if message == job.message and all(a is b for a, b in zip(events, job.events, strict=True)):
            return job
        return replace(job, message=message, events=events)

    def reasons(self, reasons: tuple[WaitReason, ...]) -> tuple[WaitReason, ...]:
        return tuple(r if r.tenant is None or self._readable(r.tenant) else _hidden(r) for r in reasons)


def _hidden(r: WaitReason) -> WaitReason:
    """The reason without the tenant's name and figures: what blocks, on which GPU type, and what
    the job needs, which the caller knows anyway."""
    gpus = f" of {r.gpu_type}" if r.gpu_type else ""
    need = f"; job needs {r.needed_gpus}" if r.needed_gpus is not None else ""
    if r.code is WaitCode.TENANT_CAP_REACHED:
        message = f"{OTHER_TENANT} holds as many GPUs{gpus} as it may{need}"
    elif r.code is WaitCode.BORROWING_LIMIT:
        message = f"{OTHER_TENANT} has borrowed as many GPUs{gpus} beyond its guarantee as it may{need}"
    elif r.code is WaitCode.QUOTA_EXHAUSTED:
        message = (
            f"{OTHER_TENANT} holds its guarantee{gpus}, and not enough idle GPUs that other tenants "
            f"lend are free{need}"
        )
    elif r.code is WaitCode.BUDGET_SPENT:
        message = (
            f"{OTHER_TENANT} has spent its GPU-hour budget this month; new jobs wait until the budget "
            "is raised or the month turns"
        )
    else:
        message = f"{OTHER_TENANT} blocks this job ({r.code.value}){need}"
    return WaitReason(r.code, message, r.cluster, r.gpu_type, needed_gpus=r.needed_gpus, at_s=r.at_s)
