"""What ListJobs and SummarizeJobs compute over the job cache, apart from the servicer's plumbing.

Both read records, never protobuf, until the answer is known: a listing converts only the page it
returns, and a summary converts nothing but its sums. Filtering by user and cluster, and the order,
happen here, on the server, so a client never pages through thousands of jobs to find a few.

Page tokens are a position in the list order (submission time, job id), which is fixed for a job's
whole life: a page never repeats or skips a job while others change phase. A newest-first token is
marked as such, so a token of one order is refused by the other rather than silently starting from
the wrong end.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from federation.api.v1 import gpufed_pb2 as pb
from federation.errors import InvalidArgument
from federation.store.job_cache_index import ListKey, list_key
from federation.store.jobs import JobRecord
from placement.model import JobPhase, TenantId

# A user or cluster name is far shorter; anything longer is not one.
MAX_FILTER_LENGTH = 128
_NEWEST_FIRST_MARK = "n:"

_GROUPS: dict[JobPhase, pb.JobGroup.ValueType] = {
    JobPhase.QUEUED: pb.JOB_GROUP_QUEUED,
    JobPhase.ADMITTED: pb.JOB_GROUP_ADMITTED,
    JobPhase.STAGING: pb.JOB_GROUP_ADMITTED,
    JobPhase.DISPATCHED: pb.JOB_GROUP_ADMITTED,
    JobPhase.RUNNING: pb.JOB_GROUP_RUNNING,
}
ANY_GPU = "any"


# Where a job sorts, as the cache's index sorts it: the position a page token records.
list_order = list_key


def encode_page_token(key: ListKey, *, newest_first: bool) -> str:
    mark = _NEWEST_FIRST_MARK if newest_first else ""
    return base64.urlsafe_b64encode(f"{mark}{key[0]!r}|{key[1]}".encode()).decode()


def decode_page_token(token: str, *, newest_first: bool) -> ListKey | None:
    if not token:
        return None
    try:
        text = base64.urlsafe_b64decode(token.encode()).decode()
        marked = text.startswith(_NEWEST_FIRST_MARK)
        at, _, job_id = text.removeprefix(_NEWEST_FIRST_MARK).partition("|")
        key = (float(at), job_id)
    except ValueError as error:
        raise InvalidArgument("page_token: not a token this server issued") from error
    if marked != newest_first:
        issued = "newest first" if marked else "oldest first"
        raise InvalidArgument(f"page_token: issued for a listing {issued}; ask with the same newest_first")
    return key


def _name_filter(value: str, field: str) -> str:
    if len(value) > MAX_FILTER_LENGTH:
        raise InvalidArgument(f"{field}: at most {MAX_FILTER_LENGTH} characters, got {len(value)}")
    if value != value.strip() or any(not c.isprintable() for c in value):
        raise InvalidArgument(f"{field}: a name without spaces around it or control characters")
    return value


@dataclass(frozen=True, slots=True)
class ListFilter:
    """ListJobs' narrowing beyond the tenant and phases the cache's index walks."""

    name_prefix: str = ""
    user: str = ""
    cluster: str = ""

    @classmethod
    def of(cls, req: pb.ListJobsRequest) -> ListFilter:
        return cls(
            name_prefix=req.name_prefix,
            user=_name_filter(req.user, "user"),
            cluster=_name_filter(req.cluster, "cluster"),
        )

    def wants(self, job: JobRecord) -> bool:
        if self.user and job.user != self.user:
            return False
        if self.cluster and (job.placement is None or job.placement.cluster != self.cluster):
            return False
        return job.spec.name.startswith(self.name_prefix)


def one_page(jobs: Iterable[JobRecord], wanted: ListFilter, size: int) -> tuple[list[JobRecord], bool]:
    """The first `size` wanted jobs, and whether another one follows them."""
    page: list[JobRecord] = []
    for job in jobs:
        if not wanted.wants(job):
            continue
        if len(page) == size:
            return page, True
        page.append(job)
    return page, False


def summarize(jobs: Iterator[JobRecord], tenant: TenantId | None) -> pb.JobSummary:
    """GPUs and jobs per (tenant, GPU type, group) over jobs not finished, of `tenant` (None: all)."""
    gpus: dict[tuple[str, str, pb.JobGroup.ValueType], int] = defaultdict(int)
    counted: dict[tuple[str, str, pb.JobGroup.ValueType], int] = defaultdict(int)
    per_tenant: dict[tuple[str, pb.JobGroup.ValueType], int] = defaultdict(int)
    groups = _GROUPS
    for job in jobs:
        if tenant is not None and job.tenant != tenant:
            continue
        group = groups.get(job.phase)
        if group is None:
            continue
        per_tenant[(job.tenant, group)] += 1
        count = job.spec.gpu_count
        placed = job.placement
        if placed is not None and group != pb.JOB_GROUP_QUEUED:
            types: Iterable[str] = (placed.gpu_type,)
        elif group == pb.JOB_GROUP_QUEUED:
            # A queued job that accepts several types is demand for each of them.
            types = job.spec.gpu_types or (ANY_GPU,)
        else:
            types = job.spec.gpu_types[:1] or (ANY_GPU,)
        for gpu_type in types:
            key = (job.tenant, gpu_type, group)
            gpus[key] += count
            counted[key] += 1
    return pb.JobSummary(
        rows=[
            pb.JobSummaryRow(
                tenant=t, gpu_type=g, group=grp, gpus=gpus[(t, g, grp)], jobs=counted[(t, g, grp)]
            )
            for t, g, grp in sorted(gpus)
        ],
        tenants=[
            pb.TenantJobCount(tenant=t, group=grp, jobs=n) for (t, grp), n in sorted(per_tenant.items())
        ],
    )
